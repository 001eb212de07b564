package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/yamux"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// failing answers Fail with the error registered under its argument.
type failing struct{ errs map[string]error }

func (f failing) Fail(id string, reply *string) error { return f.errs[id] }

// clientErrors are errors a client handler or a server might answer with:
// every CSI sentinel as the plugin boundary wraps it, a few generic ones,
// and errors whose text quotes a sentinel they do not wrap.
func clientErrors() map[string]error {
	errs := map[string]error{
		"os error quoting not found":        errors.New("stat /csi/vol: volume not found on disk"),
		"os error quoting no leader":        errors.New("iscsi: no cluster leader in target portal group"),
		"invalid argument quoting no ldr":   fmt.Errorf("csi ControllerPublishVolume: %w: rpc error: code = InvalidArgument desc = no cluster leader", structs.ErrCSIInvalidArgument),
		"precondition quoting plugin":       fmt.Errorf("csi ControllerPublishVolume: %w: csi plugin not on this client", structs.ErrCSIFailedPrecondition),
		"unavailable, caller gave up":       fmt.Errorf("csi ControllerPublishVolume: %w: caller gave up: %w", structs.ErrCSIUnavailable, context.Canceled),
		"outcome unknown":                   fmt.Errorf("raft apply: %w: leadership lost", structs.ErrOutcomeUnknown),
		"controller unavailable, last node": fmt.Errorf("%w: plugin \"p\": last on node n2: %w", structs.ErrCSIControllerUnavailable, structs.ErrNodeNotConnected),
	}
	for _, s := range []error{
		structs.ErrCSIPluginNotFound, structs.ErrCSIInvalidArgument, structs.ErrCSINotFound,
		structs.ErrCSIFailedPrecondition, structs.ErrCSIResourceExhausted, structs.ErrCSIAlreadyExists,
		structs.ErrCSIUnimplemented, structs.ErrCSIUnavailable, structs.ErrCSIInternal,
		structs.ErrNoLeader, structs.ErrPermissionDenied, structs.ErrNotFound, structs.ErrCSIMaxClaims,
		structs.ErrClaimInProgress, structs.ErrShutdown, structs.ErrStaleLeaderTerm,
	} {
		errs[s.Error()] = fmt.Errorf("csi %s: %w: volume v1", "call", s)
	}
	return errs
}

// requireSameMeaning checks that got, received over RPC, means what sent
// meant.
func requireSameMeaning(t *testing.T, sent, got error) {
	t.Helper()
	must.Eq(t, sent.Error(), got.Error())
	must.Eq(t, structs.ErrorCodes(sent), structs.ErrorCodes(got), must.Sprint(sent))
	must.Eq(t, structs.IsRetryable(sent), structs.IsRetryable(got), must.Sprint(sent))
	for _, s := range []error{structs.ErrNoLeader, structs.ErrNotFound, structs.ErrCSIPluginNotFound,
		structs.ErrOutcomeUnknown, structs.ErrNodeNotConnected, structs.ErrCSIControllerUnavailable} {
		must.Eq(t, errors.Is(sent, s), errors.Is(got, s), must.Sprintf("%q vs %v", sent, s))
	}
}

// Server-to-client calls: the client's handler errors reach the server
// with their sentinels, through the client's own RPC server on a stream
// the server opened.
func TestRPCErrors_ClientHandlerToServer(t *testing.T) {
	addr, sessions := fakeSessionServer(t)
	c := testClient(t, TestConfig(t, addr))
	var session *yamux.Session
	select {
	case session = <-sessions:
	case <-time.After(10 * time.Second):
		t.Fatal("client did not connect")
	}
	t.Cleanup(func() { session.Close() })

	errs := clientErrors()
	must.NoError(t, c.RegisterRPC("Failing", failing{errs: errs}))
	rc := openRPCStream(t, session)
	for id, sent := range errs {
		var out string
		got := structs.FromRPCError(rc.Call("Failing.Fail", id, &out))
		requireSameMeaning(t, sent, got)
	}
}

// fakeRPCServer serves srv the way a server serves a client: a yamux
// session whose streams each start with the RPC protocol byte.
func fakeRPCServer(t *testing.T, srv *structs.RPCServer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		var b [1]byte
		if _, err := io.ReadFull(conn, b[:]); err != nil || b[0] != structs.RPCMultiplex {
			conn.Close()
			return
		}
		cfg := yamux.DefaultConfig()
		cfg.LogOutput = io.Discard
		session, err := yamux.Server(conn, cfg)
		if err != nil {
			conn.Close()
			return
		}
		defer session.Close()
		stream, err := session.Accept()
		if err != nil {
			return
		}
		if _, err := io.ReadFull(stream, b[:]); err != nil || b[0] != structs.RPCNomad {
			return
		}
		srv.ServeCodec(structs.NewServerCodec(stream))
	}()
	return ln.Addr().String()
}

// Client-to-server calls: a server's error reaches the client's caller
// with its sentinels, through serverConn.call.
func TestRPCErrors_ServerToClientCaller(t *testing.T) {
	errs := clientErrors()
	srv := structs.NewRPCServer()
	must.NoError(t, srv.RegisterName("Failing", failing{errs: errs}))
	conn, err := dialServer(fakeRPCServer(t, srv), "", 5*time.Second, nil, hclog.NewNullLogger())
	must.NoError(t, err)
	t.Cleanup(conn.close)

	for id, sent := range errs {
		var out string
		got := conn.call(context.Background(), "Failing.Fail", id, &out, 5*time.Second)
		requireSameMeaning(t, sent, got)
		must.False(t, errors.Is(got, errConnLost))
	}
	var out string
	got := conn.call(context.Background(), "Failing.Nope", "x", &out, 5*time.Second)
	must.ErrorIs(t, got, structs.ErrUnknownMethod)
}

// slowHandler answers Wait only once release is closed, and Now at once.
type slowHandler struct{ release chan struct{} }

func (h slowHandler) Wait(_ string, reply *string) error { <-h.release; *reply = "late"; return nil }
func (h slowHandler) Now(_ string, reply *string) error  { *reply = "now"; return nil }

// A call that runs out of time while the server still answers on the
// session is a busy server, not a lost one: the session stays up, with the
// servers' calls to this node on it, and carries the next call.
func TestServerConn_TimeoutOnLiveSessionKeepsIt(t *testing.T) {
	srv := structs.NewRPCServer()
	h := slowHandler{release: make(chan struct{})}
	must.NoError(t, srv.RegisterName("Slow", h))
	conn, err := dialServer(fakeRPCServer(t, srv), "", 5*time.Second, nil, hclog.NewNullLogger())
	must.NoError(t, err)
	t.Cleanup(conn.close)
	// Cleanups run last first: the held call ends before the fake server
	// waits for its calls.
	t.Cleanup(func() { close(h.release) })

	var out string
	err = conn.call(context.Background(), "Slow.Wait", "x", &out, 200*time.Millisecond)
	must.ErrorIs(t, err, errCallTimedOut)
	must.False(t, errors.Is(err, errConnLost), must.Sprintf("a busy server is not a lost connection: %v", err))
	must.True(t, retryableCall(err))
	must.False(t, conn.session.IsClosed())
	must.NoError(t, conn.call(context.Background(), "Slow.Now", "x", &out, 5*time.Second))
	must.Eq(t, "now", out)
}
