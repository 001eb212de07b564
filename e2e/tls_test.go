//go:build e2e

package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// The TLS suite: the core CSI and leadership cases on a cluster whose RPC
// port speaks mutual TLS with verify_server_hostname, made with the
// certificates `roam tls` writes. The harness talks to the agents over
// plain HTTP; HTTPS is covered by the agent and CLI packages' tests.

// makeTLSCerts runs `roam tls ca create` and `roam tls cert create` for
// each role in a new directory, as the README tells an operator to, and
// returns the directory.
func makeTLSCerts(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, args := range [][]string{
		{"tls", "ca", "create"},
		{"tls", "cert", "create", "-server"},
		{"tls", "cert", "create", "-client"},
		{"tls", "cert", "create", "-cli"},
	} {
		cmd := exec.Command(roamBinary(t), args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("e2e: roam %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return dir
}

// tlsBlock is the agent config's tls block for role's certificate in dir:
// TLS on the RPC port only, with verify_server_hostname.
func tlsBlock(dir, role string) string {
	return fmt.Sprintf(`tls {
  rpc                    = true
  ca_file                = %q
  cert_file              = %q
  key_file               = %q
  verify_server_hostname = true
}
`, filepath.Join(dir, "roam-agent-ca.pem"),
		filepath.Join(dir, "global-"+role+"-roam.pem"),
		filepath.Join(dir, "global-"+role+"-roam-key.pem"))
}

// tlsCSIOpts adds mutual TLS to opts.
func tlsCSIOpts(t testing.TB, opts csiOpts) csiOpts {
	dir := makeTLSCerts(t)
	opts.ServerConfigExtra += "\n" + tlsBlock(dir, "server")
	opts.ClientConfigExtra += "\n" + tlsBlock(dir, "client")
	return opts
}

// requirePlainRefused checks that a server's RPC port closes a plain TCP
// connection that speaks msgpack RPC, and logs why.
func requirePlainRefused(t *testing.T, a *Agent) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", a.RPCAddr(), 5*time.Second)
	must.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte{0x01}) // msgpack RPC
	must.NoError(t, err)
	must.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = conn.Read(make([]byte, 1))
	must.Error(t, err)
	var ne net.Error
	must.False(t, errors.As(err, &ne) && ne.Timeout(), must.Sprint("server kept a plain connection open"))
	WaitFor(t, 5*time.Second, func() error {
		if !strings.Contains(a.Log(), "this server requires tls") {
			return fmt.Errorf("%s did not log the refusal", a.Name)
		}
		return nil
	})
}

// TestTLS_CoreCases runs, on three servers and two clients speaking
// mutual TLS with verify_server_hostname: a SIGTERM handoff of the leader
// during a controller publish (then the old leader rejoins over TLS), a
// claim by a batch job, and a drain of the node holding a volume. The
// plugins see no overlapping controller call.
func TestTLS_CoreCases(t *testing.T) {
	cc := startCSICluster(t, tlsCSIOpts(t, csiOpts{Servers: 3, Clients: 2, PublishLatency: leadPublishLatency}))
	for _, s := range cc.Servers {
		requirePlainRefused(t, s)
	}

	// 1. SIGTERM handoff during a publish.
	old := cc.Leader()
	before := cc.dutyCounts()
	startPublishing(t, cc)
	code := cc.KillServer(old, syscall.SIGTERM)
	must.Eq(t, 0, code, must.Sprintf("%s exited with code %d after SIGTERM", cc.Servers[old].Name, code))
	leader, gap := cc.waitNewLeader(t, old, before)
	t.Logf("handoff: new leader %s, leaderless gap %s", cc.Servers[leader].Name, gap)
	pub := cc.waitCSIAllocs(t, "pub", csiSettle, oneAlloc("running"))[0]
	cc.waitClaim(t, "vol1", pub.ID)
	must.Eq(t, 1, cc.totalCalls(t, "ControllerPublishVolume"), must.Sprint("publishes after the handoff"))
	cc.RestartServer(old)
	cc.waitRejoined(t, old)
	cc.mustNoOverlaps(t)

	// 2. A claim by a batch job, released when it completes.
	ext := cc.createVolumes(t, "client-0", "vol2")
	cc.registerVolumeHTTP(t, "vol2", ext[0])
	token := randomToken(t)
	cc.RunJob(csiJob("writer", "batch", 1, "vol2", false, "",
		fmt.Sprintf(`echo %s > "$ROAM_TASK_DIR/data/token"`, token)))
	writer := cc.waitCSIAllocs(t, "writer", csiSettle, oneAlloc("complete"))[0]
	WaitFor(t, csiSettle, func() error {
		v, err := cc.volume("vol2")
		if err != nil {
			return err
		}
		if len(v.Claims) != 0 {
			return fmt.Errorf("volume vol2 still claimed: %s", claimsString(v))
		}
		return nil
	})
	t.Logf("claim: writer %s completed on %s and its claim was released", writer, writer.NodeName)
	cc.mustNoOverlaps(t)

	// 3. Drain the node whose allocation holds vol1.
	drain(cc.Cluster, pub.NodeID, "-deadline", "60s")
	var repl *Alloc
	WaitFor(t, csiSettle, func() error {
		list, err := JobAllocs(cc.API(), "pub")
		if err != nil {
			return err
		}
		r := running(list)
		if len(r) != 1 || r[0].ID == pub.ID {
			return fmt.Errorf("want one running replacement of %s:\n%s", shortAlloc(pub.ID), allocTable(list))
		}
		repl = r[0]
		return nil
	})
	must.NotEq(t, pub.NodeID, repl.NodeID, must.Sprintf("replacement %s on the drained node", repl))
	cc.waitClaim(t, "vol1", repl.ID)
	waitDrained(t, cc.Cluster, pub.NodeID, drainSettle)
	t.Logf("drain: replacement %s claims vol1 on %s", repl, repl.NodeName)

	cc.mustNoOverlaps(t)
	for name := range cc.Plugins {
		calls, err := cc.calls(name)
		must.NoError(t, err)
		t.Logf("controller calls of %s: %v", name, calls)
	}
}

// dialTLSSerial opens a TLS connection to a server's RPC port as a client
// holding the certificate in dir, and returns the serial number of the
// certificate the server presented.
func dialTLSSerial(t *testing.T, a *Agent, dir string) string {
	t.Helper()
	pemCA, err := os.ReadFile(filepath.Join(dir, "roam-agent-ca.pem"))
	must.NoError(t, err)
	pool := x509.NewCertPool()
	must.True(t, pool.AppendCertsFromPEM(pemCA))
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "global-client-roam.pem"), filepath.Join(dir, "global-client-roam-key.pem"))
	must.NoError(t, err)
	raw, err := net.DialTimeout("tcp", a.RPCAddr(), 5*time.Second)
	must.NoError(t, err)
	defer raw.Close()
	_, err = raw.Write([]byte{0x04}) // TLS
	must.NoError(t, err)
	conn := tls.Client(raw, &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, ServerName: "server.global.roam"})
	must.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
	must.NoError(t, conn.Handshake())
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestTLS_SighupReloadsCertificate replaces a running server's certificate
// files with a new certificate from the same CA and sends SIGHUP: new
// connections get the new certificate, and the cluster goes on working.
func TestTLS_SighupReloadsCertificate(t *testing.T) {
	dir := makeTLSCerts(t)
	c := StartCluster(t, Opts{Servers: 1, Clients: 1,
		ServerConfigExtra: tlsBlock(dir, "server"), ClientConfigExtra: tlsBlock(dir, "client")})
	first := dialTLSSerial(t, c.Servers[0], dir)

	fresh := t.TempDir()
	cmd := exec.Command(roamBinary(t), "tls", "cert", "create", "-server",
		"-ca", filepath.Join(dir, "roam-agent-ca.pem"), "-key", filepath.Join(dir, "roam-agent-ca-key.pem"))
	cmd.Dir = fresh
	out, err := cmd.CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	for _, f := range []string{"global-server-roam.pem", "global-server-roam-key.pem"} {
		b, err := os.ReadFile(filepath.Join(fresh, f))
		must.NoError(t, err)
		must.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o600))
	}
	// Until the signal, the old certificate is served.
	must.EqOp(t, first, dialTLSSerial(t, c.Servers[0], dir))

	must.NoError(t, c.Servers[0].Signal(syscall.SIGHUP))
	WaitFor(t, 10*time.Second, func() error {
		if !strings.Contains(c.Servers[0].Log(), "tls certificates reloaded") {
			return fmt.Errorf("%s did not log the reload", c.Servers[0].Name)
		}
		return nil
	})
	must.NotEq(t, first, dialTLSSerial(t, c.Servers[0], dir))
	must.True(t, c.Servers[0].Running(), must.Sprint("SIGHUP stopped the server"))
	nodes, err := Nodes(c.ServerHTTP(0), false)
	must.NoError(t, err)
	must.Len(t, 1, nodes)
	must.EqOp(t, "ready", nodes[0].Status)
}
