// Package tlsutil loads an agent's TLS material and hands out the
// *tls.Config each side of a connection needs: the RPC listener, the RPC
// dialers (client to server, server to server), and the HTTPS listener.
// The certificate, key and CA are read from files and can be read again
// (Reload, on SIGHUP); connections made after a reload use the new ones.
package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// Config is the agent's tls block.
type Config struct {
	// HTTP serves the HTTP API over HTTPS.
	HTTP bool
	// RPC wraps every connection on the RPC port in TLS, and makes the
	// agent dial servers with TLS.
	RPC bool
	// CAFile, CertFile and KeyFile are PEM files: the CA that signs every
	// agent's certificate, this agent's certificate, and its private key.
	CAFile   string
	CertFile string
	KeyFile  string
	// VerifyServerHostname makes a dialer check that a server presents a
	// certificate for server.<region>.roam, and makes a server give each
	// peer only the role its certificate names (see Role).
	VerifyServerHostname bool
	// VerifyHTTPSClient requires a certificate signed by the CA from every
	// HTTPS client.
	VerifyHTTPSClient bool
	// Region names the cluster's region in the expected server name.
	Region string
}

// Enabled reports whether TLS is on for any listener.
func (c *Config) Enabled() bool { return c != nil && (c.HTTP || c.RPC) }

// ErrConfig marks a tls block that cannot work as written.
var ErrConfig = errors.New("invalid tls configuration")

// Validate checks that the files an enabled listener needs are named. It
// reads nothing and changes nothing.
func (c *Config) Validate() error {
	if c == nil {
		return nil
	}
	// A check for a listener that does not speak TLS would not check: the
	// RPC port would refuse every peer (none can show a certificate), or
	// the HTTP API would answer anyone while its operator believes it asks
	// for a certificate.
	if c.VerifyServerHostname && !c.RPC {
		return fmt.Errorf("%w: tls.verify_server_hostname needs tls.rpc = true", ErrConfig)
	}
	if c.VerifyHTTPSClient && !c.HTTP {
		return fmt.Errorf("%w: tls.verify_https_client needs tls.http = true", ErrConfig)
	}
	if !c.Enabled() {
		return nil
	}
	var missing []string
	for _, f := range []struct{ name, v string }{
		{"ca_file", c.CAFile}, {"cert_file", c.CertFile}, {"key_file", c.KeyFile},
	} {
		if strings.TrimSpace(f.v) == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: tls.%s must be set when tls.http or tls.rpc is on",
			ErrConfig, strings.Join(missing, ", tls."))
	}
	if c.Region == "" {
		return fmt.Errorf("%w: region is empty", ErrConfig)
	}
	return nil
}

// ServerName is the DNS name every server certificate of region carries.
func ServerName(region string) string { return "server." + region + ".roam" }

// ClientName is the DNS name every client certificate of region carries.
func ClientName(region string) string { return "client." + region + ".roam" }

// CLIName is the DNS name every CLI certificate of region carries.
func CLIName(region string) string { return "cli." + region + ".roam" }

// Configurator holds the loaded material and builds tls.Configs from it.
type Configurator struct {
	config Config

	// mu guards the material, replaced whole by Reload.
	mu   sync.RWMutex
	cert *tls.Certificate
	pool *x509.CertPool
	// leafExpiry is when the loaded certificate stops being valid.
	leafExpiry time.Time
}

// NewConfigurator validates c and loads its files. A nil Configurator (TLS
// off) is returned for a config that enables nothing.
func NewConfigurator(c Config) (*Configurator, error) {
	if !c.Enabled() {
		return nil, nil
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	t := &Configurator{config: c}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Config returns the configuration the Configurator was made from.
func (t *Configurator) Config() Config { return t.config }

// RPC reports whether t is set and wraps RPC in TLS.
func (t *Configurator) RPC() bool { return t != nil && t.config.RPC }

// HTTP reports whether t is set and serves HTTPS.
func (t *Configurator) HTTP() bool { return t != nil && t.config.HTTP }

// VerifyServerHostname reports whether t is set and checks server names
// and peer roles.
func (t *Configurator) VerifyServerHostname() bool {
	return t != nil && t.config.VerifyServerHostname
}

// Reload reads the certificate, key and CA files again. On error the
// material loaded before stays in use.
func (t *Configurator) Reload() error {
	cert, err := tls.LoadX509KeyPair(t.config.CertFile, t.config.KeyFile)
	if err != nil {
		return fmt.Errorf("tls: load cert_file %s and key_file %s: %w", t.config.CertFile, t.config.KeyFile, err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return fmt.Errorf("tls: parse cert_file %s: %w", t.config.CertFile, err)
	}
	cert.Leaf = leaf
	pool, err := loadCAPool(t.config.CAFile)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.cert, t.pool, t.leafExpiry = &cert, pool, leaf.NotAfter
	t.mu.Unlock()
	return nil
}

// LeafExpiry is when the certificate in use expires.
func (t *Configurator) LeafExpiry() time.Time {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.leafExpiry
}

func (t *Configurator) material() (*tls.Certificate, *x509.CertPool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.cert, t.pool
}

// loadCAPool reads a PEM bundle of CA certificates.
func loadCAPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tls: read ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: ca_file %s holds no PEM certificate", ErrConfig, path)
	}
	return pool, nil
}

// IncomingRPCConfig is the RPC listener's config: every peer must present
// a certificate signed by the CA. Each handshake takes the material in use
// at that moment.
func (t *Configurator) IncomingRPCConfig() *tls.Config {
	return t.incoming(tls.RequireAndVerifyClientCert)
}

// IncomingHTTPSConfig is the HTTPS listener's config: a client
// certificate is required only with VerifyHTTPSClient.
func (t *Configurator) IncomingHTTPSConfig() *tls.Config {
	auth := tls.VerifyClientCertIfGiven
	if t.config.VerifyHTTPSClient {
		auth = tls.RequireAndVerifyClientCert
	}
	return t.incoming(auth)
}

func (t *Configurator) incoming(auth tls.ClientAuthType) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool := t.material()
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*cert},
				ClientCAs:    pool,
				ClientAuth:   auth,
			}, nil
		},
	}
}

// OutgoingRPCConfig is the config for dialing a server's RPC port. The
// server must present a certificate signed by the CA, for
// server.<region>.roam when VerifyServerHostname is set; this agent
// presents its own certificate.
func (t *Configurator) OutgoingRPCConfig() *tls.Config {
	cert, pool := t.material()
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Always present the certificate, even one the server's CA list
		// does not match: the server then says why it refuses it.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return cert, nil
		},
		RootCAs: pool,
	}
	if t.config.VerifyServerHostname {
		c.ServerName = ServerName(t.config.Region)
		return c
	}
	// Servers are dialed by address, which their certificates need not
	// name: check the chain only.
	c.InsecureSkipVerify = true
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		return verifyChain(cs.PeerCertificates, pool, x509.ExtKeyUsageServerAuth)
	}
	return c
}

// verifyChain checks that certs[0] chains to a root in pool for usage.
func verifyChain(certs []*x509.Certificate, pool *x509.CertPool, usage x509.ExtKeyUsage) error {
	if len(certs) == 0 {
		return errors.New("tls: peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{
		Roots:         pool,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{usage},
	})
	if err != nil {
		return fmt.Errorf("tls: verify server certificate: %w", err)
	}
	return nil
}
