package client

import (
	"io"
	"net"
	"net/rpc"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// fakeSessionServer accepts one client connection the way a server does and
// returns the server end of the client's yamux session.
func fakeSessionServer(t *testing.T) (addr string, sessions <-chan *yamux.Session) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	ch := make(chan *yamux.Session, 1)
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
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
		ch <- session
	}()
	return ln.Addr().String(), ch
}

// openRPCStream opens a stream on session as a server does for a call.
func openRPCStream(t *testing.T, session *yamux.Session) *rpc.Client {
	t.Helper()
	stream, err := session.Open()
	must.NoError(t, err)
	_, err = stream.Write([]byte{structs.RPCNomad})
	must.NoError(t, err)
	c := rpc.NewClientWithCodec(structs.NewClientCodec(stream))
	t.Cleanup(func() { c.Close() })
	return c
}

type greeter struct{}

func (greeter) Hello(args string, reply *string) error { *reply = "hello " + args; return nil }

func TestServerRPC_ServesStreamsFromServer(t *testing.T) {
	addr, sessions := fakeSessionServer(t)
	c := testClient(t, TestConfig(t, addr))
	var session *yamux.Session
	select {
	case session = <-sessions:
	case <-time.After(10 * time.Second):
		t.Fatal("client did not connect")
	}
	t.Cleanup(func() { session.Close() })

	// A stream with an unknown protocol byte is closed by the client.
	bad, err := session.Open()
	must.NoError(t, err)
	_, err = bad.Write([]byte{0x7f})
	must.NoError(t, err)
	must.NoError(t, bad.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = bad.Read(make([]byte, 1))
	must.ErrorIs(t, err, io.EOF)

	// The client keeps serving others.
	rc := openRPCStream(t, session)
	var pong structs.ClientStatusPingResponse
	must.NoError(t, rc.Call("ClientStatus.Ping", &structs.GenericRequest{}, &pong))
	must.Eq(t, c.NodeID(), pong.NodeID)

	// Services registered later are served, on new and existing streams.
	must.NoError(t, c.RegisterRPC("Greeter", greeter{}))
	var out string
	must.NoError(t, rc.Call("Greeter.Hello", "roam", &out))
	must.Eq(t, "hello roam", out)
	must.NoError(t, openRPCStream(t, session).Call("Greeter.Hello", "again", &out))
	must.Eq(t, "hello again", out)

	// Registering a name twice is an error.
	must.Error(t, c.RegisterRPC("Greeter", greeter{}))
}
