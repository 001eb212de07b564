package tlsutil_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/internal/tlsutil"
	"github.com/roamhq/roam/internal/tlsutil/tlstest"
)

func TestConfig_ValidateNamesMissingFiles(t *testing.T) {
	c := tlsutil.Config{RPC: true, CAFile: "ca.pem", Region: "global"}
	err := c.Validate()
	must.ErrorIs(t, err, tlsutil.ErrConfig)
	must.StrContains(t, err.Error(), "tls.cert_file, tls.key_file must be set")
	must.NoError(t, (&tlsutil.Config{}).Validate())
	tc, err := tlsutil.NewConfigurator(tlsutil.Config{})
	must.NoError(t, err)
	must.Nil(t, tc)
	must.False(t, tc.RPC())
}

func TestGenerateCert_RolesAndNames(t *testing.T) {
	ca, key, err := tlsutil.GenerateCA(tlsutil.CAOptions{Days: 2})
	must.NoError(t, err)
	for role, usage := range map[string][]x509.ExtKeyUsage{
		tlsutil.RoleServer: {x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		tlsutil.RoleClient: {x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		tlsutil.RoleCLI:    {x509.ExtKeyUsageClientAuth},
	} {
		certPEM, _, err := tlsutil.GenerateCert(ca, key, tlsutil.CertOptions{
			Role: role, Region: "east", Days: 3,
			DNSNames: []string{"a.example"}, IPAddresses: []net.IP{net.ParseIP("10.0.0.9")},
		})
		must.NoError(t, err)
		b, _ := pem.Decode(certPEM)
		c, err := x509.ParseCertificate(b.Bytes)
		must.NoError(t, err)
		must.Eq(t, []string{role + ".east.roam", "localhost", "a.example"}, c.DNSNames)
		must.EqOp(t, 2, len(c.IPAddresses))
		must.Eq(t, usage, c.ExtKeyUsage)
		must.True(t, c.NotAfter.Sub(c.NotBefore) < 3*24*time.Hour+2*time.Minute)
	}
	_, _, err = tlsutil.GenerateCert(ca, key, tlsutil.CertOptions{Role: "admin", Region: "east"})
	must.ErrorIs(t, err, tlsutil.ErrConfig)
	_, _, err = tlsutil.GenerateCert(ca, key, tlsutil.CertOptions{Role: tlsutil.RoleServer})
	must.ErrorIs(t, err, tlsutil.ErrConfig)
}

// serve accepts one TLS connection on a loopback listener presenting
// pair, and reports the handshake's outcome.
func serve(t *testing.T, pair tlstest.Pair) (addr string, done <-chan error) {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(pair.Cert, pair.Key)
	must.NoError(t, err)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	must.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	ch := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- err
			return
		}
		defer c.Close()
		ch <- c.(*tls.Conn).Handshake()
	}()
	return ln.Addr().String(), ch
}

func dial(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
	must.NoError(t, err)
	defer raw.Close()
	c := tls.Client(raw, cfg)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	return c.Handshake()
}

// Without verify_server_hostname a dialer does not check the server's
// name, but still checks that the CA signed its certificate.
func TestOutgoing_WithoutHostnameStillChecksTheCA(t *testing.T) {
	certs := tlstest.Write(t, "global")
	cfg := certs.Config(certs.Client, false)
	cfg.VerifyServerHostname = false
	tc, err := tlsutil.NewConfigurator(cfg)
	must.NoError(t, err)

	addr, _ := serve(t, certs.Server)
	must.NoError(t, dial(t, addr, tc.OutgoingRPCConfig()))

	addr, _ = serve(t, certs.OtherServer)
	err = dial(t, addr, tc.OutgoingRPCConfig())
	must.Error(t, err)
	var unknown x509.UnknownAuthorityError
	must.True(t, errors.As(err, &unknown), must.Sprintf("want an unknown authority error, got %v", err))

	addr, _ = serve(t, certs.ExpiredServer)
	err = dial(t, addr, tc.OutgoingRPCConfig())
	must.Error(t, err)
	must.StrContains(t, err.Error(), "certificate has expired")
}

// With verify_server_hostname a dialer wants server.<region>.roam: a
// client certificate from the same CA does not pass for a server.
func TestOutgoing_VerifyServerHostname(t *testing.T) {
	certs := tlstest.Write(t, "global")
	tc := certs.Configurator(t, certs.Client, false)

	addr, _ := serve(t, certs.Server)
	must.NoError(t, dial(t, addr, tc.OutgoingRPCConfig()))

	addr, _ = serve(t, certs.Client)
	err := dial(t, addr, tc.OutgoingRPCConfig())
	must.Error(t, err)
	must.StrContains(t, err.Error(), "server.global.roam")
}

func TestReload_KeepsOldOnError(t *testing.T) {
	certs := tlstest.Write(t, "global")
	tc := certs.Configurator(t, certs.Server, false)
	before := tc.LeafExpiry()
	must.NoError(t, os.WriteFile(certs.Server.Cert, []byte("not a certificate"), 0o600))
	must.Error(t, tc.Reload())
	must.Eq(t, before, tc.LeafExpiry())
	addr, _ := serve(t, certs.Client)
	// Still usable: the old material stays.
	cfg := tc.OutgoingRPCConfig()
	cfg.ServerName = "client.global.roam"
	must.NoError(t, dial(t, addr, cfg))
}

// A verify_ setting for a listener that does not speak TLS would leave
// the RPC port refusing every peer (it has no certificate to show), or the
// HTTP API open while the operator believes it checks certificates.
func TestConfig_ValidateVerifyNeedsItsListener(t *testing.T) {
	files := tlsutil.Config{CAFile: "ca.pem", CertFile: "c.pem", KeyFile: "k.pem", Region: "global"}
	for name, tc := range map[string]struct {
		c    func(*tlsutil.Config)
		want string
	}{
		"server hostname without rpc": {func(c *tlsutil.Config) { c.HTTP, c.VerifyServerHostname = true, true },
			"tls.verify_server_hostname needs tls.rpc = true"},
		"server hostname alone": {func(c *tlsutil.Config) { c.VerifyServerHostname = true },
			"tls.verify_server_hostname needs tls.rpc = true"},
		"https client without http": {func(c *tlsutil.Config) { c.RPC, c.VerifyHTTPSClient = true, true },
			"tls.verify_https_client needs tls.http = true"},
	} {
		t.Run(name, func(t *testing.T) {
			c := files
			tc.c(&c)
			err := c.Validate()
			must.ErrorIs(t, err, tlsutil.ErrConfig)
			must.StrContains(t, err.Error(), tc.want)
		})
	}
	ok := files
	ok.RPC, ok.HTTP, ok.VerifyServerHostname, ok.VerifyHTTPSClient = true, true, true, true
	must.NoError(t, ok.Validate())
}
