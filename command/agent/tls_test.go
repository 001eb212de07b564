package agent

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
	"github.com/roamhq/roam/internal/tlsutil/tlstest"
)

// newTLSAgent starts a dev agent with mutual TLS on both ports and
// verify_server_hostname: its client dials its server over TLS, with the
// server's certificate.
func newTLSAgent(t *testing.T) (*Agent, *tlstest.Files) {
	t.Helper()
	certs := tlstest.Write(t, "global")
	a := newTestAgent(t, func(c *Config) {
		c.TLS = &TLSConfig{
			HTTP: true, RPC: true,
			CAFile: certs.CA, CertFile: certs.Server.Cert, KeyFile: certs.Server.Key,
			VerifyServerHostname: true, VerifyHTTPSClient: true,
		}
	})
	waitForLeader(t, a)
	waitForNodeReady(t, a, a.Client().NodeID())
	return a, certs
}

func TestTLS_NomadAPIClientWithCAAndClientCert(t *testing.T) {
	t.Parallel()
	a, certs := newTLSAgent(t)
	must.EqOp(t, "https", a.HTTPScheme())

	c, err := nomadapi.NewClient(&nomadapi.Config{
		Address: "https://" + a.HTTPAddr(),
		TLSConfig: &nomadapi.TLSConfig{
			CACert: certs.CA, ClientCert: certs.CLI.Cert, ClientKey: certs.CLI.Key,
		},
	})
	must.NoError(t, err)
	leader, err := c.Status().Leader()
	must.NoError(t, err)
	must.EqOp(t, a.Server().Addr(), leader)
	nodes, _, err := c.Nodes().List(nil)
	must.NoError(t, err)
	must.Len(t, 1, nodes)
	must.EqOp(t, a.Client().NodeID(), nodes[0].ID)

	// Without a client certificate the agent refuses (verify_https_client).
	bare, err := nomadapi.NewClient(&nomadapi.Config{
		Address:   "https://" + a.HTTPAddr(),
		TLSConfig: &nomadapi.TLSConfig{CACert: certs.CA},
	})
	must.NoError(t, err)
	_, err = bare.Status().Leader()
	must.Error(t, err)
	must.StrContains(t, err.Error(), "certificate required")

	// Plain HTTP gets no answer from the API.
	resp, err := http.Get("http://" + a.HTTPAddr() + "/v1/status/leader")
	must.NoError(t, err)
	resp.Body.Close()
	must.EqOp(t, http.StatusBadRequest, resp.StatusCode)
}

func TestTLS_APIClientFromEnv(t *testing.T) {
	a, certs := newTLSAgent(t)
	t.Setenv(api.AddressEnv, "https://"+a.HTTPAddr())
	t.Setenv(api.CACertEnv, certs.CA)
	t.Setenv(api.ClientCertEnv, certs.CLI.Cert)
	t.Setenv(api.ClientKeyEnv, certs.CLI.Key)
	// The agent is dialed by IP; the name is the one every server
	// certificate carries.
	t.Setenv(api.TLSServerNameEnv, "server.global.roam")
	c, err := api.NewClient(nil)
	must.NoError(t, err)
	leader, err := c.Status().Leader()
	must.NoError(t, err)
	must.EqOp(t, a.Server().Addr(), leader)

	// A server name the certificate does not carry is refused.
	t.Setenv(api.TLSServerNameEnv, "server.elsewhere.roam")
	c, err = api.NewClient(nil)
	must.NoError(t, err)
	_, err = c.Status().Leader()
	must.Error(t, err)
	must.True(t, strings.Contains(err.Error(), "server.elsewhere.roam"), must.Sprint(err))
}

func TestTLS_ConfigNamesMissingFiles(t *testing.T) {
	c := DevConfig()
	c.TLS = &TLSConfig{RPC: true, CAFile: "ca.pem"}
	err := c.Validate()
	must.Error(t, err)
	must.StrContains(t, err.Error(), "tls.cert_file, tls.key_file must be set")
}

// verify_server_hostname without tls.rpc left every server's RPC port
// refusing every peer, clients and servers alike, with a log that blamed
// their certificates; the agent now refuses the config and says why.
func TestTLS_ConfigVerifyNeedsItsListener(t *testing.T) {
	c := DevConfig()
	c.TLS = &TLSConfig{HTTP: true, CAFile: "ca.pem", CertFile: "c.pem", KeyFile: "k.pem", VerifyServerHostname: true}
	must.ErrorContains(t, c.Validate(), "tls.verify_server_hostname needs tls.rpc = true")
	c.TLS = &TLSConfig{RPC: true, CAFile: "ca.pem", CertFile: "c.pem", KeyFile: "k.pem", VerifyHTTPSClient: true}
	must.ErrorContains(t, c.Validate(), "tls.verify_https_client needs tls.http = true")
}

func TestTLS_ParseBlock(t *testing.T) {
	c, err := ParseConfig("tls.hcl", []byte(`
tls {
  http = true
  rpc  = true
  ca_file   = "ca.pem"
  cert_file = "cert.pem"
  key_file  = "key.pem"
  verify_server_hostname = true
  verify_https_client    = true
}
`))
	must.NoError(t, err)
	must.Eq(t, &TLSConfig{HTTP: true, RPC: true, CAFile: "ca.pem", CertFile: "cert.pem", KeyFile: "key.pem",
		VerifyServerHostname: true, VerifyHTTPSClient: true}, c.TLS)
	merged := DefaultConfig().Merge(c)
	must.EqOp(t, "server.global.roam", "server."+merged.tlsConfig().Region+".roam")
}

// httpsClient presents pair's certificate and trusts certs' CA.
func httpsClient(t *testing.T, certs *tlstest.Files, pair tlstest.Pair) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(certs.CA)
	must.NoError(t, err)
	pool := x509.NewCertPool()
	must.True(t, pool.AppendCertsFromPEM(pem))
	cert, err := tls.LoadX509KeyPair(pair.Cert, pair.Key)
	must.NoError(t, err)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
	}}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// Every node holds the client certificate. Over HTTPS it must not take a
// snapshot (every node's secret is in it), restore one, or change the
// Raft configuration, as it may not over RPC; the cli certificate may.
func TestTLS_ClientCertCannotCallOperatorRoutes(t *testing.T) {
	a, certs := newTLSAgent(t)
	base := "https://" + a.HTTPAddr()
	do := func(c *http.Client, method, path string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader("not a snapshot"))
		must.NoError(t, err)
		resp, err := c.Do(req)
		must.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		must.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	client := httpsClient(t, certs, certs.Client)
	for _, rt := range []struct{ method, path string }{
		{http.MethodGet, "/v1/operator/snapshot"},
		{http.MethodPut, "/v1/operator/snapshot"},
		{http.MethodDelete, "/v1/operator/raft/peer?id=" + a.Server().ID()},
		{http.MethodPut, "/v1/operator/raft/transfer-leadership"},
	} {
		code, body := do(client, rt.method, rt.path)
		must.EqOp(t, http.StatusForbidden, code, must.Sprintf("%s %s: %s", rt.method, rt.path, body))
		must.StrContains(t, body, "client certificate")
	}
	cfg, err := a.Server().Raft().GetConfiguration().Configuration(), a.Server().Raft().GetConfiguration().Error()
	must.NoError(t, err)
	must.Len(t, 1, cfg.Servers)

	code, body := do(httpsClient(t, certs, certs.CLI), http.MethodGet, "/v1/operator/snapshot")
	must.EqOp(t, http.StatusOK, code)
	must.StrContains(t, body, a.Client().NodeID(), must.Sprint("the operator's snapshot holds the node"))
}
