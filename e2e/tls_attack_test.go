//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/rpc"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/yamux"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// Issue 12's attacks again, on the trust cluster with mutual TLS and
// verify_server_hostname, sent by an attacker who broke into a node's host
// and holds the cluster's client certificate (which every node holds), or
// by one with no certificate at all. Each must fail with an error that
// says why, or a closed connection, and change nothing.

// attackerTLS is the TLS config of an attacker holding role's
// certificate from dir ("" for none), trusting the cluster's CA.
func attackerTLS(t *testing.T, dir, role string) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(filepath.Join(dir, "roam-agent-ca.pem"))
	must.NoError(t, err)
	pool := x509.NewCertPool()
	must.True(t, pool.AppendCertsFromPEM(pem))
	cfg := &tls.Config{RootCAs: pool, ServerName: "server.global.roam", MinVersion: tls.VersionTLS12}
	if role != "" {
		cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "global-"+role+"-roam.pem"),
			filepath.Join(dir, "global-"+role+"-roam-key.pem"))
		must.NoError(t, err)
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

// dialAttackerTLS opens a TLS connection to addr from the attacker's
// address and sends proto inside it.
func dialAttackerTLS(t *testing.T, addr string, cfg *tls.Config, proto byte) (net.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	raw, err := dialFrom(ctx, attackerAddr(3), addr)
	must.NoError(t, err)
	t.Cleanup(func() { _ = raw.Close() })
	if _, err := raw.Write([]byte{structs.RPCTLS}); err != nil {
		return nil, err
	}
	tc := tls.Client(raw, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, err
	}
	_, err = tc.Write([]byte{proto})
	return tc, err
}

// attackerSession opens a client session with cfg's certificate and an
// RPC stream on it.
func attackerSession(t *testing.T, addr string, cfg *tls.Config) *rpc.Client {
	t.Helper()
	conn, err := dialAttackerTLS(t, addr, cfg, structs.RPCMultiplex)
	must.NoError(t, err)
	ycfg := yamux.DefaultConfig()
	ycfg.LogOutput = io.Discard
	session, err := yamux.Client(conn, ycfg)
	must.NoError(t, err)
	t.Cleanup(func() { _ = session.Close() })
	stream, err := session.Open()
	must.NoError(t, err)
	_, err = stream.Write([]byte{structs.RPCNomad})
	must.NoError(t, err)
	c := rpc.NewClientWithCodec(structs.NewClientCodec(stream))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// attackerCall makes one RPC on c, bounded in time.
func attackerCall(t *testing.T, c *rpc.Client, method string, args, reply any) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	return structs.FromRPCError(structs.CallContext(ctx, c, method, args, reply))
}

// mustClosedTLS checks that the server closed conn without answering.
func mustClosedTLS(t *testing.T, conn net.Conn, what string) {
	t.Helper()
	must.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	n, err := conn.Read(make([]byte, 64))
	must.Zero(t, n, must.Sprintf("%s: the server answered", what))
	var ne net.Error
	must.False(t, errors.As(err, &ne) && ne.Timeout(), must.Sprintf("%s: the server kept the connection open", what))
}

func TestTLS_AttacksWithClientCert(t *testing.T) {
	dir := makeTLSCerts(t)
	e := startTrustEnv(t, func(o *csiOpts) {
		o.ServerConfigExtra += "\n" + tlsBlock(dir, "server")
		o.ClientConfigExtra += "\n" + tlsBlock(dir, "client")
	})
	rpcAddr := e.server.RPCAddr()
	clientCert := attackerTLS(t, dir, "client")

	t.Run("no_certificate", func(t *testing.T) {
		before := e.snapshot(t)
		conn, err := dialAttackerTLS(t, rpcAddr, attackerTLS(t, dir, ""), structs.RPCNomad)
		if err == nil {
			// TLS 1.3: the client's side of the handshake ends before the
			// server has checked for a certificate; its refusal comes next.
			frame := rpcFrame(t, "Node.Deregister", &structs.NodeDeregisterRequest{NodeIDs: []string{e.nodeID}})
			_, _ = conn.Write(frame)
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = conn.Read(make([]byte, 64))
		}
		must.Error(t, err)
		must.StrContains(t, err.Error(), "certificate required")
		e.mustUnchanged(t, before)
	})
	t.Run("plain_connection", func(t *testing.T) {
		before := e.snapshot(t)
		ans, err := rawRPC(attackerAddr(1), rpcAddr, rpcFrame(t, "Node.Deregister",
			&structs.NodeDeregisterRequest{NodeIDs: []string{e.nodeID}}), 10*time.Second)
		must.NoError(t, err)
		must.True(t, ans.Closed, must.Sprintf("a plain connection was answered: %q", ans.Error))
		e.mustUnchanged(t, before)
	})

	// Attack 3, from a client session: the certificate says "a client",
	// not "this node".
	t.Run("deregister_and_take_over_node", func(t *testing.T) {
		before := e.snapshot(t)
		c := attackerSession(t, rpcAddr, clientCert)
		err := attackerCall(t, c, "Node.Deregister", &structs.NodeDeregisterRequest{NodeIDs: []string{e.nodeID}}, &structs.GenericResponse{})
		must.ErrorIs(t, err, structs.ErrPermissionDenied)
		err = attackerCall(t, c, "Node.Register", &structs.NodeRegisterRequest{
			Node: &structs.Node{ID: e.nodeID, SecretID: uuid.NewString(), Name: "client-0",
				Datacenter: "dc1", Status: structs.NodeStatusReady, HTTPAddr: "127.0.1.1:1"},
		}, &structs.NodeUpdateResponse{})
		must.ErrorIs(t, err, structs.ErrPermissionDenied)
		must.StrContains(t, err.Error(), "another secret")
		e.mustUnchanged(t, before)
	})

	// Attack 4: a relay to the node's controller, in a session and outside
	// one.
	t.Run("forward_controller_delete", func(t *testing.T) {
		before := e.snapshot(t)
		var args []byte
		must.NoError(t, codec.NewEncoderBytes(&args, structs.MsgpackHandle).Encode(
			&structs.ClientCSIControllerDeleteVolumeRequest{PluginID: csiPluginID, ExternalVolumeID: e.extID}))
		req := &structs.ClientRPCForwardRequest{NodeID: e.nodeID, Method: "ClientCSI.ControllerDeleteVolume", Args: args}
		err := attackerCall(t, attackerSession(t, rpcAddr, clientCert), "ClientRPC.Forward", req, &structs.ClientRPCForwardResponse{})
		must.ErrorIs(t, err, structs.ErrPermissionDenied)
		must.StrContains(t, err.Error(), "server-only rpc")

		conn, err := dialAttackerTLS(t, rpcAddr, clientCert, structs.RPCNomad)
		must.NoError(t, err)
		_, _ = conn.Write(rpcFrame(t, "ClientRPC.Forward", req))
		mustClosedTLS(t, conn, "ClientRPC.Forward outside a session")
		e.mustUnchanged(t, before)
	})

	// Attack 2: a Join, in a session and outside one.
	t.Run("join", func(t *testing.T) {
		before := e.snapshot(t)
		req := &structs.ServerJoinRequest{Member: structs.ServerMember{
			ID: uuid.NewString(), Name: "rogue-server", Addr: "127.0.0.1:1", Region: "global", Datacenter: "dc1",
			Status: structs.MemberAlive, Voter: true,
		}}
		err := attackerCall(t, attackerSession(t, rpcAddr, clientCert), "Status.Join", req, &structs.ServerJoinResponse{})
		must.ErrorIs(t, err, structs.ErrPermissionDenied)
		conn, err := dialAttackerTLS(t, rpcAddr, clientCert, structs.RPCNomad)
		must.NoError(t, err)
		_, _ = conn.Write(rpcFrame(t, "Status.Join", req))
		mustClosedTLS(t, conn, "Status.Join outside a session")
		e.mustUnchanged(t, before)
	})

	// Attack 1: Raft with a client certificate, under a real server's
	// own ID and address (which the HTTP API lists).
	t.Run("raft_append_entries", func(t *testing.T) {
		before := e.snapshot(t)
		rc, err := RaftConfig(e.server.HTTPAddr())
		must.NoError(t, err)
		must.SliceNotEmpty(t, rc.Servers)
		var buf bytes.Buffer
		buf.WriteByte(0) // raft's rpcAppendEntries
		must.NoError(t, codec.NewEncoder(&buf, &codec.MsgpackHandle{}).Encode(&raft.AppendEntriesRequest{
			RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax,
				ID: []byte(rc.Servers[0].ID), Addr: []byte(rc.Servers[0].Address)},
			Term: 1 << 40,
		}))
		conn, err := dialAttackerTLS(t, rpcAddr, clientCert, structs.RPCRaft)
		must.NoError(t, err)
		_, _ = conn.Write(buf.Bytes())
		mustClosedTLS(t, conn, "raft from a client certificate")
		e.mustUnchanged(t, before)
	})

	// A node's certificate must not read every node's secret from a
	// snapshot, restore one, or change the Raft configuration.
	t.Run("operator_rpcs", func(t *testing.T) {
		before := e.snapshot(t)
		c := attackerSession(t, rpcAddr, clientCert)
		var save structs.SnapshotSaveResponse
		err := attackerCall(t, c, "Operator.SnapshotSave", &structs.SnapshotSaveRequest{}, &save)
		must.ErrorIs(t, err, structs.ErrPermissionDenied, must.Sprintf("snapshot %q taken", save.ID))
		rc, err := RaftConfig(e.server.HTTPAddr())
		must.NoError(t, err)
		err = attackerCall(t, c, "Operator.RaftRemovePeerByID", &structs.RaftPeerRequest{ID: rc.Servers[0].ID}, &structs.GenericResponse{})
		must.ErrorIs(t, err, structs.ErrPermissionDenied)
		e.mustUnchanged(t, before)
	})
}
