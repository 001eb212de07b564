// Package tlstest writes certificate sets for tests, as httptest does
// servers: a CA and a certificate per role, plus the bad ones an attacker
// would bring (another CA's server certificate, an expired one).
package tlstest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/roamhq/roam/internal/tlsutil"
)

// Pair is a certificate and its key, as file paths.
type Pair struct{ Cert, Key string }

// Files are a test's certificate files, all under one directory.
type Files struct {
	Dir    string
	Region string
	// CA signs Server, Client and CLI; CAKey is its key.
	CA     string
	CAKey  string
	Server Pair
	Client Pair
	CLI    Pair
	// OtherServer is a server certificate for the same region signed by
	// another CA, OtherCA.
	OtherCA     string
	OtherServer Pair
	// ExpiredClient and ExpiredServer are signed by CA and expired a day
	// ago.
	ExpiredClient Pair
	ExpiredServer Pair
}

// Write makes a certificate set for region under a new temp directory.
func Write(t testing.TB, region string) *Files {
	t.Helper()
	dir := t.TempDir()
	f := &Files{Dir: dir, Region: region}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatalf("tlstest: %v", err)
		}
		return p
	}
	ca, caKey, err := tlsutil.GenerateCA(tlsutil.CAOptions{})
	if err != nil {
		t.Fatalf("tlstest: %v", err)
	}
	f.CA = write("ca.pem", ca)
	f.CAKey = write("ca-key.pem", caKey)
	other, otherKey, err := tlsutil.GenerateCA(tlsutil.CAOptions{CommonName: "Someone Else's CA"})
	if err != nil {
		t.Fatalf("tlstest: %v", err)
	}
	f.OtherCA = write("other-ca.pem", other)
	leaf := func(name string, caPEM, keyPEM []byte, o tlsutil.CertOptions) Pair {
		o.Region = region
		cert, key, err := tlsutil.GenerateCert(caPEM, keyPEM, o)
		if err != nil {
			t.Fatalf("tlstest: %s: %v", name, err)
		}
		return Pair{Cert: write(name+".pem", cert), Key: write(name+"-key.pem", key)}
	}
	expired := time.Now().Add(-48 * time.Hour)
	f.Server = leaf("server", ca, caKey, tlsutil.CertOptions{Role: tlsutil.RoleServer})
	f.Client = leaf("client", ca, caKey, tlsutil.CertOptions{Role: tlsutil.RoleClient})
	f.CLI = leaf("cli", ca, caKey, tlsutil.CertOptions{Role: tlsutil.RoleCLI})
	f.OtherServer = leaf("other-server", other, otherKey, tlsutil.CertOptions{Role: tlsutil.RoleServer})
	f.ExpiredClient = leaf("expired-client", ca, caKey, tlsutil.CertOptions{Role: tlsutil.RoleClient, NotBefore: expired, Days: 1})
	f.ExpiredServer = leaf("expired-server", ca, caKey, tlsutil.CertOptions{Role: tlsutil.RoleServer, NotBefore: expired, Days: 1})
	return f
}

// Config is a tls block for RPC (and HTTP if http is set) with pair's
// certificate, the CA, and verify_server_hostname on.
func (f *Files) Config(pair Pair, http bool) tlsutil.Config {
	return tlsutil.Config{
		HTTP:                 http,
		RPC:                  true,
		CAFile:               f.CA,
		CertFile:             pair.Cert,
		KeyFile:              pair.Key,
		VerifyServerHostname: true,
		Region:               f.Region,
	}
}

// Configurator is NewConfigurator(f.Config(pair, http)), failing the test
// on error.
func (f *Files) Configurator(t testing.TB, pair Pair, http bool) *tlsutil.Configurator {
	t.Helper()
	c, err := tlsutil.NewConfigurator(f.Config(pair, http))
	if err != nil {
		t.Fatalf("tlstest: %v", err)
	}
	return c
}
