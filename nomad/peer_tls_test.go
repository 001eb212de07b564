package nomad

import (
	"crypto/tls"
	"io"
	"net"
	"net/rpc"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/yamux"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/internal/tlsutil"
	"github.com/roamhq/roam/internal/tlsutil/tlstest"
	"github.com/roamhq/roam/structs"
)

// tlsServer starts a lone server whose RPC port requires TLS with
// verify_server_hostname, logging into the returned buffer.
func tlsServer(t *testing.T, certs *tlstest.Files) (*Server, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.Region = certs.Region
		c.TLS = certs.Configurator(t, certs.Server, false)
		c.Logger = hclog.New(&hclog.LoggerOptions{Name: "tls", Level: hclog.Info, Output: logs})
	})
	waitForLeaderDuties(t, srv)
	return srv, logs
}

// dialTLS opens a TLS connection to srv presenting pair (trusting the
// CA certs.CA), and sends proto inside it.
func dialTLS(t *testing.T, srv *Server, cfg *tls.Config, proto byte) (net.Conn, error) {
	t.Helper()
	raw, err := net.DialTimeout("tcp", srv.Addr(), closeWait)
	must.NoError(t, err)
	conn, err := tlsutil.WrapClient(raw, structs.RPCTLS, cfg, closeWait)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = conn.Close() })
	_, err = conn.Write([]byte{proto})
	return conn, err
}

// outgoing is the dialer config of an agent holding pair.
func outgoing(t *testing.T, certs *tlstest.Files, pair tlstest.Pair) *tls.Config {
	t.Helper()
	return certs.Configurator(t, pair, false).OutgoingRPCConfig()
}

// tlsSession opens a client session over TLS presenting pair.
func tlsSession(t *testing.T, srv *Server, certs *tlstest.Files, pair tlstest.Pair) *yamux.Session {
	t.Helper()
	conn, err := dialTLS(t, srv, outgoing(t, certs, pair), structs.RPCMultiplex)
	must.NoError(t, err)
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	session, err := yamux.Client(conn, cfg)
	must.NoError(t, err)
	t.Cleanup(func() { _ = session.Close() })
	return session
}

// sessionRPC opens an RPC stream on session.
func sessionRPC(t *testing.T, session *yamux.Session) *rpc.Client {
	t.Helper()
	stream, err := session.Open()
	must.NoError(t, err)
	_, err = stream.Write([]byte{structs.RPCNomad})
	must.NoError(t, err)
	return rpcClientOn(t, stream)
}

// raftState is what an attack on Raft must leave as it was.
type raftState struct {
	term, last uint64
	servers    int
	leader     bool
}

func raftStateOf(t *testing.T, srv *Server) raftState {
	t.Helper()
	f := srv.raft.GetConfiguration()
	must.NoError(t, f.Error())
	return raftState{srv.raft.CurrentTerm(), srv.raft.LastIndex(), len(f.Configuration().Servers), srv.IsLeader()}
}

func TestTLS_ClusterFormsAndForwards(t *testing.T) {
	t.Parallel()
	certs := tlstest.Write(t, structs.DefaultRegion)
	servers := testClusterWith(t, 3, func(c *Config) {
		withLongHeartbeats(c)
		c.TLS = certs.Configurator(t, certs.Server, false)
	})
	leader := waitForLeaderDuties(t, servers...)
	// A write at a follower reaches the leader over the TLS pool.
	f := followers(servers)[0]
	var resp structs.NodeUpdateResponse
	node := testNode("tls-node")
	must.NoError(t, f.RPC("Node.Register", &structs.NodeRegisterRequest{Node: node}, &resp))
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		n, err := leader.State().NodeByID(nil, node.ID)
		return err == nil && n != nil
	}), wait.Timeout(5*time.Second), wait.Gap(10*time.Millisecond)))
}

func TestTLS_PlainConnectionRefused(t *testing.T) {
	certs := tlstest.Write(t, structs.DefaultRegion)
	srv, logs := tlsServer(t, certs)
	before := raftStateOf(t, srv)
	for name, b := range map[string]byte{
		"rpc":     structs.RPCNomad,
		"raft":    structs.RPCRaft,
		"session": structs.RPCMultiplex,
	} {
		t.Run(name, func(t *testing.T) {
			requireConnClosed(t, rawConn(t, srv, b))
		})
	}
	must.StrContains(t, logs.String(), "this server requires tls")
	must.Eq(t, before, raftStateOf(t, srv))
}

func TestTLS_ClientCertCannotSpeakRaft(t *testing.T) {
	certs := tlstest.Write(t, structs.DefaultRegion)
	srv, logs := tlsServer(t, certs)
	before := raftStateOf(t, srv)

	// An AppendEntries from a far later term would make the leader step
	// down if Raft ever read it.
	conn, err := dialTLS(t, srv, outgoing(t, certs, certs.Client), structs.RPCRaft)
	must.NoError(t, err)
	_, err = conn.Write(raftBytes(t, 0, &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("x"), Addr: []byte("127.0.0.1:1")},
		Term:      before.term + 100,
		Leader:    []byte("127.0.0.1:1"),
	}))
	must.NoError(t, err)
	// Wait for the server to close the connection, or for Raft to answer.
	_ = conn.SetReadDeadline(time.Now().Add(closeWait))
	n, _ := conn.Read(make([]byte, 64))
	must.Eq(t, before, raftStateOf(t, srv), must.Sprint("raft state changed"))
	must.Zero(t, n, must.Sprint("raft answered a client certificate"))
	must.StrContains(t, logs.String(), "raft refused: the peer's certificate is not a server certificate")
}

func TestTLS_ClientCertCannotJoinOrCallServerOnlyRPCs(t *testing.T) {
	certs := tlstest.Write(t, structs.DefaultRegion)
	srv, logs := tlsServer(t, certs)
	before := raftStateOf(t, srv)
	join := &structs.ServerJoinRequest{Member: structs.ServerMember{
		ID: "00000000-0000-0000-0000-00000000beef", Name: "rogue", Addr: "127.0.0.1:1",
		Region: structs.DefaultRegion, Datacenter: "dc1", Status: structs.MemberAlive, Voter: true,
	}}

	t.Run("rpc outside a session", func(t *testing.T) {
		conn, err := dialTLS(t, srv, outgoing(t, certs, certs.Client), structs.RPCNomad)
		must.NoError(t, err)
		var resp structs.ServerJoinResponse
		err = rpcClientOn(t, conn).Call("Status.Join", join, &resp)
		must.Error(t, err)
		must.StrContains(t, logs.String(), "rpc outside a client session refused: the peer's certificate is not a server certificate")
	})
	t.Run("server-only rpcs in a session", func(t *testing.T) {
		c := sessionRPC(t, tlsSession(t, srv, certs, certs.Client))
		calls := map[string][2]any{
			"Status.Join":        {join, &structs.ServerJoinResponse{}},
			"Status.HasNodeConn": {&structs.NodeSpecificRequest{NodeID: "x"}, &structs.NodeConnQueryResponse{}},
			"ClientRPC.Forward": {&structs.ClientRPCForwardRequest{NodeID: "x", Method: "ClientCSI.ControllerDeleteVolume"},
				&structs.ClientRPCForwardResponse{}},
		}
		for method, ar := range calls {
			err := structs.FromRPCError(c.Call(method, ar[0], ar[1]))
			must.ErrorIs(t, err, structs.ErrPermissionDenied, must.Sprint(method))
			must.StrContains(t, err.Error(), method+" is a server-only rpc and the caller's certificate is a client certificate")
		}
		// The session stays usable for what a client agent calls.
		requireCallsWork(t, c)
	})
	must.Eq(t, before, raftStateOf(t, srv))
}

func TestTLS_ServerCertMaySpeakEverything(t *testing.T) {
	certs := tlstest.Write(t, structs.DefaultRegion)
	srv, _ := tlsServer(t, certs)

	conn, err := dialTLS(t, srv, outgoing(t, certs, certs.Server), structs.RPCNomad)
	must.NoError(t, err)
	requireCallsWork(t, rpcClientOn(t, conn))
	c := sessionRPC(t, tlsSession(t, srv, certs, certs.Server))
	var resp structs.NodeConnQueryResponse
	must.NoError(t, c.Call("Status.HasNodeConn", &structs.NodeSpecificRequest{NodeID: "x"}, &resp))
}

func TestTLS_CLICertCannotOpenSession(t *testing.T) {
	certs := tlstest.Write(t, structs.DefaultRegion)
	srv, logs := tlsServer(t, certs)
	conn, err := dialTLS(t, srv, outgoing(t, certs, certs.CLI), structs.RPCMultiplex)
	must.NoError(t, err)
	requireConnClosed(t, conn)
	must.StrContains(t, logs.String(), "client session refused")
}

func TestTLS_OtherCAServerCertRefused(t *testing.T) {
	certs := tlstest.Write(t, structs.DefaultRegion)
	srv, logs := tlsServer(t, certs)
	before := raftStateOf(t, srv)

	// As a peer dialing in: the server does not know its CA.
	otherPair := mustKeyPair(t, certs.OtherServer)
	rogue := &tls.Config{
		// Present it whatever CAs the server asks for.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &otherPair, nil },
		RootCAs:              certs.Configurator(t, certs.Server, false).OutgoingRPCConfig().RootCAs,
		ServerName:           tlsutil.ServerName(certs.Region),
	}
	conn, err := dialTLS(t, srv, rogue, structs.RPCRaft)
	if err == nil {
		// TLS 1.3 reports the server's refusal on the first read.
		_, err = conn.Read(make([]byte, 1))
	}
	must.Error(t, err)
	must.StrContains(t, err.Error(), "unknown certificate authority")
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		return strings.Contains(logs.String(), "certificate signed by unknown authority")
	}), wait.Timeout(5*time.Second), wait.Gap(10*time.Millisecond)))

	// As a server dialed: an agent refuses a server the CA did not sign.
	impostor := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.TLS = mustConfigurator(t, tlsutil.Config{RPC: true, CAFile: certs.OtherCA,
			CertFile: certs.OtherServer.Cert, KeyFile: certs.OtherServer.Key,
			VerifyServerHostname: true, Region: certs.Region})
	})
	_, err = dialTLS(t, impostor, outgoing(t, certs, certs.Client), structs.RPCMultiplex)
	must.Error(t, err)
	must.StrContains(t, err.Error(), "certificate signed by unknown authority")
	must.Eq(t, before, raftStateOf(t, srv))
}

func TestTLS_ExpiredCertRefused(t *testing.T) {
	certs := tlstest.Write(t, structs.DefaultRegion)
	srv, logs := tlsServer(t, certs)

	conn, err := dialTLS(t, srv, outgoing(t, certs, certs.ExpiredClient), structs.RPCMultiplex)
	if err == nil {
		_, err = conn.Read(make([]byte, 1))
	}
	must.Error(t, err)
	must.StrContains(t, err.Error(), "expired certificate")
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		return strings.Contains(logs.String(), "certificate has expired")
	}), wait.Timeout(5*time.Second), wait.Gap(10*time.Millisecond)))

	// A server whose own certificate expired is refused by those dialing it.
	stale := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.TLS = certs.Configurator(t, certs.ExpiredServer, false)
	})
	_, err = dialTLS(t, stale, outgoing(t, certs, certs.Client), structs.RPCMultiplex)
	must.Error(t, err)
	must.StrContains(t, err.Error(), "certificate has expired")
}

func TestTLS_HandshakeTimeout(t *testing.T) {
	t.Parallel()
	certs := tlstest.Write(t, structs.DefaultRegion)
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.RPCHandshakeTimeout = 200 * time.Millisecond
		c.TLS = certs.Configurator(t, certs.Server, false)
	})
	waitForLeaderDuties(t, srv)
	// The TLS byte, then nothing: the handshake never starts.
	requireConnClosed(t, rawConn(t, srv, structs.RPCTLS))
	// A completed handshake, then no protocol byte.
	raw, err := net.DialTimeout("tcp", srv.Addr(), closeWait)
	must.NoError(t, err)
	conn, err := tlsutil.WrapClient(raw, structs.RPCTLS, outgoing(t, certs, certs.Client), closeWait)
	must.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	requireConnClosed(t, conn)
}

func TestTLS_ReloadServesNewCert(t *testing.T) {
	certs := tlstest.Write(t, structs.DefaultRegion)
	tc := certs.Configurator(t, certs.Server, false)
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.TLS = tc
	})
	waitForLeaderDuties(t, srv)
	oldClient := outgoing(t, certs, certs.Client)
	serial := func() string {
		raw, err := net.DialTimeout("tcp", srv.Addr(), closeWait)
		must.NoError(t, err)
		conn, err := tlsutil.WrapClient(raw, structs.RPCTLS, oldClient, closeWait)
		must.NoError(t, err)
		defer conn.Close()
		return conn.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	first := serial()
	// Replace the server's files with a fresh certificate; until the
	// reload, new connections still get the old one.
	fresh := tlstest.Write(t, structs.DefaultRegion)
	copyFile(t, fresh.CA, certs.CA)
	copyFile(t, fresh.Server.Cert, certs.Server.Cert)
	copyFile(t, fresh.Server.Key, certs.Server.Key)
	must.EqOp(t, first, serial())
	must.NoError(t, tc.Reload())
	// The dialer trusts only the old CA: a dial must now fail...
	_, err := dialTLS(t, srv, oldClient, structs.RPCMultiplex)
	must.Error(t, err)
	// ...and succeed with the new CA, seeing a new certificate.
	c := fresh.Configurator(t, fresh.Client, false)
	raw, err := net.DialTimeout("tcp", srv.Addr(), closeWait)
	must.NoError(t, err)
	conn, err := tlsutil.WrapClient(raw, structs.RPCTLS, c.OutgoingRPCConfig(), closeWait)
	must.NoError(t, err)
	defer conn.Close()
	must.NotEq(t, first, conn.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.String())
}

func mustKeyPair(t *testing.T, p tlstest.Pair) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(p.Cert, p.Key)
	must.NoError(t, err)
	return c
}

func mustConfigurator(t *testing.T, c tlsutil.Config) *tlsutil.Configurator {
	t.Helper()
	tc, err := tlsutil.NewConfigurator(c)
	must.NoError(t, err)
	return tc
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	buf, err := os.ReadFile(from)
	must.NoError(t, err)
	must.NoError(t, os.WriteFile(to, buf, 0o600))
}

// A server certificate for another region, signed by the same CA, is no
// server here.
func TestTLS_OtherRegionServerCertCannotSpeakRaft(t *testing.T) {
	certs := tlstest.Write(t, structs.DefaultRegion)
	srv, logs := tlsServer(t, certs)
	before := raftStateOf(t, srv)

	caPEM, err := os.ReadFile(certs.CA)
	must.NoError(t, err)
	keyPEM, err := os.ReadFile(certs.CAKey)
	must.NoError(t, err)
	certPEM, certKey, err := tlsutil.GenerateCert(caPEM, keyPEM, tlsutil.CertOptions{Role: tlsutil.RoleServer, Region: "east"})
	must.NoError(t, err)
	east := tlstest.Pair{Cert: filepath.Join(t.TempDir(), "east.pem"), Key: filepath.Join(t.TempDir(), "east-key.pem")}
	must.NoError(t, os.WriteFile(east.Cert, certPEM, 0o600))
	must.NoError(t, os.WriteFile(east.Key, certKey, 0o600))

	conn, err := dialTLS(t, srv, outgoing(t, certs, east), structs.RPCRaft)
	must.NoError(t, err)
	_, err = conn.Write(raftBytes(t, 0, &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("x"), Addr: []byte("127.0.0.1:1")},
		Term:      before.term + 100,
		Leader:    []byte("127.0.0.1:1"),
	}))
	must.NoError(t, err)
	_ = conn.SetReadDeadline(time.Now().Add(closeWait))
	n, _ := conn.Read(make([]byte, 64))
	must.Eq(t, before, raftStateOf(t, srv), must.Sprint("raft state changed"))
	must.Zero(t, n, must.Sprint("raft answered another region's server certificate"))
	must.StrContains(t, logs.String(), "raft refused: the peer's certificate is not a server certificate")
}

// The per-address cap and the frame timeout hold inside TLS as they do
// without it.
func TestTLS_ConnLimitsHold(t *testing.T) {
	t.Parallel()
	const limit = 3
	certs := tlstest.Write(t, structs.DefaultRegion)
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.RPCMaxConnsPerClient = limit
		c.RPCFrameTimeout = 300 * time.Millisecond
		c.TLS = certs.Configurator(t, certs.Server, false)
	})
	waitForLeaderDuties(t, srv)
	cfg := outgoing(t, certs, certs.Server)

	t.Run("frame timeout", func(t *testing.T) {
		idle, err := dialTLS(t, srv, cfg, structs.RPCNomad)
		must.NoError(t, err)
		idleRPC := rpcClientOn(t, idle)
		requireCallsWork(t, idleRPC)
		stalled, err := dialTLS(t, srv, cfg, structs.RPCNomad)
		must.NoError(t, err)
		header := msgpackBytes(t, &rpc.Request{ServiceMethod: "Node.List", Seq: 1})
		_, err = stalled.Write(header[:3])
		must.NoError(t, err)
		requireConnClosed(t, stalled)
		requireCallsWork(t, idleRPC)
		_ = idle.Close()
	})
	t.Run("per-address cap", func(t *testing.T) {
		must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
			return srv.connLimiter.Open("127.0.0.1") == 0
		}), wait.Timeout(5*time.Second), wait.Gap(10*time.Millisecond)))
		for range limit {
			conn, err := dialTLS(t, srv, cfg, structs.RPCNomad)
			must.NoError(t, err)
			requireCallsWork(t, rpcClientOn(t, conn))
		}
		// One more is closed before its handshake.
		raw, err := net.DialTimeout("tcp", srv.Addr(), closeWait)
		must.NoError(t, err)
		_, err = tlsutil.WrapClient(raw, structs.RPCTLS, cfg, closeWait)
		must.Error(t, err)
		must.EqOp(t, limit, srv.connLimiter.Open("127.0.0.1"))
	})
}

// A node holds a client certificate; that must not make it an operator
// of Raft. In a session, a client certificate can neither change the Raft
// configuration nor take a snapshot, which holds every node's secret
// (with it, a node could act for any other) and, restored, replaces all
// state.
func TestTLS_ClientCertCannotCallOperatorRPCs(t *testing.T) {
	certs := tlstest.Write(t, structs.DefaultRegion)
	srv, _ := tlsServer(t, certs)
	victim := testNode("victim")
	registerNode(t, srv, victim)
	before := raftStateOf(t, srv)

	c := sessionRPC(t, tlsSession(t, srv, certs, certs.Client))
	calls := map[string][2]any{
		"Operator.RaftRemovePeerByID": {&structs.RaftPeerRequest{ID: srv.ID()}, &structs.GenericResponse{}},
		"Operator.TransferLeadership": {&structs.TransferLeadershipRequest{}, &structs.TransferLeadershipResponse{}},
		"Operator.SnapshotSave":       {&structs.SnapshotSaveRequest{}, &structs.SnapshotSaveResponse{}},
		"Operator.SnapshotRead":       {&structs.SnapshotChunkRequest{ID: "x"}, &structs.SnapshotChunkResponse{}},
		"Operator.SnapshotUpload":     {&structs.SnapshotUploadRequest{Data: []byte("x")}, &structs.SnapshotUploadResponse{}},
		"Operator.SnapshotRestore":    {&structs.SnapshotRestoreRequest{ID: "x"}, &structs.SnapshotRestoreResponse{}},
	}
	for method, ar := range calls {
		t.Run(method, func(t *testing.T) {
			err := structs.FromRPCError(c.Call(method, ar[0], ar[1]))
			if save, ok := ar[1].(*structs.SnapshotSaveResponse); ok && save.ID != "" {
				var chunk structs.SnapshotChunkResponse
				if c.Call("Operator.SnapshotRead", &structs.SnapshotChunkRequest{ID: save.ID}, &chunk) == nil &&
					strings.Contains(string(chunk.Data), victim.SecretID) {
					t.Errorf("a client certificate read node %s's secret from a snapshot", victim.ID)
				}
			}
			must.ErrorIs(t, err, structs.ErrPermissionDenied, must.Sprint(method))
			must.StrContains(t, err.Error(), method+" is a server-only rpc and the caller's certificate is a client certificate")
		})
	}
	requireCallsWork(t, c)
	must.Eq(t, before, raftStateOf(t, srv))
	must.True(t, srv.IsLeader())
}

// With TLS but without verify_server_hostname a certificate says nothing
// about its holder's role, so the checks that hold without TLS must hold
// here: a client certificate, on a connection outside a session or in
// one, cannot join, relay to a node, speak Raft under a made-up header,
// or register a new node without an intro token.
func TestTLS_WithoutVerifyServerHostnameTrustChecksHold(t *testing.T) {
	certs := tlstest.Write(t, structs.DefaultRegion)
	logs := &syncBuffer{}
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.Region = certs.Region
		tc := certs.Config(certs.Server, false)
		tc.VerifyServerHostname = false
		c.TLS = mustConfigurator(t, tc)
		c.ClientIntroTokens = []string{"intro-1"}
		c.Logger = hclog.New(&hclog.LoggerOptions{Name: "tls", Level: hclog.Info, Output: logs})
	})
	waitForLeaderDuties(t, srv)
	victim := testNode("victim")
	must.NoError(t, srv.RPC("Node.Register", &structs.NodeRegisterRequest{Node: victim, IntroToken: "intro-1"},
		&structs.NodeUpdateResponse{}))
	before := raftStateOf(t, srv)
	noVerify := func(p tlstest.Pair) *tls.Config {
		tc := certs.Config(p, false)
		tc.VerifyServerHostname = false
		return mustConfigurator(t, tc).OutgoingRPCConfig()
	}
	join := &structs.ServerJoinRequest{Member: structs.ServerMember{
		ID: "00000000-0000-0000-0000-00000000beef", Name: "rogue", Addr: "127.0.0.1:1",
		Region: structs.DefaultRegion, Datacenter: "dc1", Status: structs.MemberAlive, Voter: true,
	}}
	relay := &structs.ClientRPCForwardRequest{NodeID: victim.ID, Method: "ClientCSI.ControllerDeleteVolume"}
	rogue := &structs.NodeRegisterRequest{Node: testNode("rogue")}

	conn, err := dialTLS(t, srv, noVerify(certs.Client), structs.RPCNomad)
	must.NoError(t, err)
	out := rpcClientOn(t, conn)
	raw, err := net.DialTimeout("tcp", srv.Addr(), closeWait)
	must.NoError(t, err)
	sconn, err := tlsutil.WrapClient(raw, structs.RPCTLS, noVerify(certs.Client), closeWait)
	must.NoError(t, err)
	_, err = sconn.Write([]byte{structs.RPCMultiplex})
	must.NoError(t, err)
	ycfg := yamux.DefaultConfig()
	ycfg.LogOutput = io.Discard
	session, err := yamux.Client(sconn, ycfg)
	must.NoError(t, err)
	t.Cleanup(func() { _ = session.Close() })
	in := sessionRPC(t, session)
	// The victim's own session, so that a relay to it gets as far as the
	// check of who is relaying.
	vs := sessionRPC(t, tlsSession(t, srv, certs, certs.Client))
	must.NoError(t, vs.Call("Node.UpdateStatus", &structs.NodeUpdateStatusRequest{NodeID: victim.ID,
		Status: structs.NodeStatusReady, WriteRequest: structs.WriteRequest{AuthToken: victim.SecretID}},
		&structs.NodeUpdateResponse{}))
	_, held := srv.nodeSession(victim.ID)
	must.True(t, held)

	for name, c := range map[string]*rpc.Client{"outside a session": out, "in a session": in} {
		t.Run(name, func(t *testing.T) {
			var jr structs.ServerJoinResponse
			err := structs.FromRPCError(c.Call("Status.Join", join, &jr))
			if name == "in a session" {
				must.ErrorIs(t, err, structs.ErrPermissionDenied)
				must.StrContains(t, err.Error(), "not a server")
			} else {
				// Answered, but the address is only one to probe.
				must.NoError(t, err)
			}
			err = structs.FromRPCError(c.Call("ClientRPC.Forward", relay, &structs.ClientRPCForwardResponse{}))
			must.ErrorIs(t, err, structs.ErrPermissionDenied)
			must.StrContains(t, err.Error(), "not a server")
			err = structs.FromRPCError(c.Call("Node.Register", rogue, &structs.NodeUpdateResponse{}))
			must.ErrorIs(t, err, structs.ErrPermissionDenied)
			must.StrContains(t, err.Error(), "intro token")
		})
	}
	t.Run("raft under a made-up header", func(t *testing.T) {
		conn, err := dialTLS(t, srv, noVerify(certs.Client), structs.RPCRaft)
		must.NoError(t, err)
		_, err = conn.Write(raftBytes(t, 0, &raft.AppendEntriesRequest{
			RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("x"), Addr: []byte("127.0.0.1:1")},
			Term:      before.term + 100,
			Leader:    []byte("127.0.0.1:1"),
		}))
		must.NoError(t, err)
		must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
			return strings.Contains(logs.String(), "raft rpc refused: sender is not a server of this cluster")
		}), wait.Timeout(5*time.Second), wait.Gap(10*time.Millisecond)))
	})
	// The join above only named an address to probe: nothing answers
	// there, so it never becomes a member.
	must.Eq(t, before, raftStateOf(t, srv))
	must.True(t, srv.IsLeader())
	n, err := srv.State().NodeByID(nil, rogue.Node.ID)
	must.NoError(t, err)
	must.Nil(t, n)
}
