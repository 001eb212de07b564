package nomad

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/rpc"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/yamux"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// closeWait bounds how long a test waits for the server to end a
// connection; reaching it means the server left the connection open.
const closeWait = 5 * time.Second

// rawConn dials srv's RPC port and writes prefix, without any framing.
func rawConn(t *testing.T, srv *Server, prefix ...byte) net.Conn {
	t.Helper()
	var (
		conn net.Conn
		err  error
	)
	if dial := srv.config.Dial; dial != nil {
		// A server on an in-memory network (memCluster): the connection
		// comes from the server's own address there.
		ctx, cancel := context.WithTimeout(context.Background(), closeWait)
		conn, err = dial(ctx, srv.Addr())
		cancel()
	} else {
		conn, err = net.DialTimeout("tcp", srv.Addr(), closeWait)
	}
	must.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	if len(prefix) > 0 {
		_, err = conn.Write(prefix)
		must.NoError(t, err)
	}
	return conn
}

// rpcClientOn speaks msgpack RPC over conn, whose protocol byte has been
// written already.
func rpcClientOn(t *testing.T, conn io.ReadWriteCloser) *rpc.Client {
	t.Helper()
	c := rpc.NewClientWithCodec(structs.NewClientCodec(conn))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// requireConnClosed reads from conn, discarding anything the server sends,
// until the server ends the connection. A read deadline bounds the wait: a
// timeout means the server kept the connection open.
func requireConnClosed(t *testing.T, conn net.Conn) {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(closeWait)); err != nil {
		// The in-memory network's pipes refuse a deadline once the other
		// end has closed: the server closed it before this was set.
		must.ErrorIs(t, err, io.ErrClosedPipe)
		return
	}
	buf := make([]byte, 4096)
	for {
		_, err := conn.Read(buf)
		if err == nil {
			continue
		}
		var netErr net.Error
		timedOut := errors.As(err, &netErr) && netErr.Timeout()
		must.False(t, timedOut, must.Sprintf("server did not close the connection within %s", closeWait))
		// io.EOF, or a reset when the server closed with unread input.
		return
	}
}

// requireServesRPC checks that srv still answers valid calls on a fresh
// connection.
func requireServesRPC(t *testing.T, srv *Server) {
	t.Helper()
	c := rpcClientOn(t, rawConn(t, srv, structs.RPCNomad))
	requireCallsWork(t, c)
}

// requireCallsWork makes a valid ping and a valid read on c.
func requireCallsWork(t *testing.T, c *rpc.Client) {
	t.Helper()
	var pong structs.StatusPingResponse
	must.NoError(t, c.Call("Status.Ping", &structs.GenericRequest{}, &pong))
	var list structs.NodeListResponse
	must.NoError(t, c.Call("Node.List", &structs.NodeListRequest{}, &list))
	must.Positive(t, list.Index)
}

// callRetry makes a call on c, trying again while it fails with a
// retryable error (a server that just became leader may not serve writes
// yet); any other error fails the test.
func callRetry(t *testing.T, c *rpc.Client, method string, args, reply any) {
	t.Helper()
	var fatal error
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			err := c.Call(method, args, reply)
			if err != nil && !structs.IsRetryable(err) {
				fatal = err
				return nil
			}
			return err
		}),
		wait.Timeout(10*time.Second),
		wait.Gap(10*time.Millisecond),
	))
	must.NoError(t, fatal)
}

// msgpackBytes encodes each value in turn, as the client codec does.
func msgpackBytes(t *testing.T, vals ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := codec.NewEncoder(&buf, structs.MsgpackHandle)
	for _, v := range vals {
		must.NoError(t, enc.Encode(v))
	}
	return buf.Bytes()
}

func TestRPC_GarbageAfterProtocolByte(t *testing.T) {
	srv := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, srv)

	cases := map[string][]byte{
		"text":          []byte("GET / HTTP/1.1\r\nHost: roam\r\n\r\n"),
		"reserved byte": {0xc1, 0xc1, 0xc1, 0xc1},
		"integer":       {0x07},
		"header of wrong types": msgpackBytes(t, map[string]any{
			"ServiceMethod": 42, "Seq": "not a number",
		}),
	}
	for name, garbage := range cases {
		t.Run(name, func(t *testing.T) {
			conn := rawConn(t, srv, append([]byte{structs.RPCNomad}, garbage...)...)
			requireConnClosed(t, conn)
			requireServesRPC(t, srv)
		})
	}
}

func TestRPC_TruncatedFrame(t *testing.T) {
	srv := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, srv)

	header := msgpackBytes(t, &rpc.Request{ServiceMethod: "Status.Ping", Seq: 1})
	full := append(header, msgpackBytes(t, &structs.GenericRequest{})...)
	cases := map[string][]byte{
		"half a header":        header[:len(header)/2],
		"header without body":  header,
		"header and half body": full[:len(header)+(len(full)-len(header))/2],
	}
	for name, frame := range cases {
		t.Run(name, func(t *testing.T) {
			conn := rawConn(t, srv, append([]byte{structs.RPCNomad}, frame...)...)
			must.NoError(t, conn.(*net.TCPConn).CloseWrite())
			requireConnClosed(t, conn)
			requireServesRPC(t, srv)
		})
	}
}

func TestRPC_OversizedFrame(t *testing.T) {
	const limit = 4096
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.RPCMaxFrameBytes = limit
	})
	waitForLeaderDuties(t, srv)

	t.Run("body over the limit", func(t *testing.T) {
		node := testNode("huge")
		node.Meta = map[string]string{"blob": strings.Repeat("x", 16*limit)}
		for i := range 200 {
			node.Meta[strings.Repeat("k", 20)+string(rune('a'+i%26))+strings.Repeat("v", i)] = "value"
		}

		c := rpcClientOn(t, rawConn(t, srv, structs.RPCNomad))
		var resp structs.NodeUpdateResponse
		err := c.Call("Node.Register", &structs.NodeRegisterRequest{Node: node}, &resp)
		must.Error(t, err)
		t.Logf("register over the limit: %v", err)
		var serverErr rpc.ServerError
		if errors.As(err, &serverErr) {
			// The server answered before closing: it must say why.
			must.StrContains(t, err.Error(), errFrameTooLarge.Error())
		}
		// Whatever the client saw, the connection is done for: the stream
		// is no longer at a frame boundary.
		err = c.Call("Status.Ping", &structs.GenericRequest{}, &structs.StatusPingResponse{})
		must.Error(t, err)

		nodes, err := srv.State().Nodes(nil)
		must.NoError(t, err)
		must.SliceEmpty(t, nodes)
		idx, err := srv.State().Index("nodes")
		must.NoError(t, err)
		must.Zero(t, idx)
		requireServesRPC(t, srv)
	})

	t.Run("header over the limit", func(t *testing.T) {
		header := msgpackBytes(t, &rpc.Request{ServiceMethod: strings.Repeat("N", 2*limit), Seq: 1})
		conn := rawConn(t, srv, append([]byte{structs.RPCNomad}, header...)...)
		requireConnClosed(t, conn)
		requireServesRPC(t, srv)
	})

	t.Run("a request just under the limit still works", func(t *testing.T) {
		node := testNode("fits")
		node.Meta = map[string]string{"blob": strings.Repeat("x", limit/2)}
		c := rpcClientOn(t, rawConn(t, srv, structs.RPCNomad))
		var resp structs.NodeUpdateResponse
		callRetry(t, c, "Node.Register", &structs.NodeRegisterRequest{Node: node}, &resp)
		got, err := srv.State().NodeByID(nil, node.ID)
		must.NoError(t, err)
		must.NotNil(t, got)
		// Frames are counted one request at a time, so many calls on one
		// connection that add up past the limit are fine.
		for range 10 {
			must.NoError(t, c.Call("Node.Register", &structs.NodeRegisterRequest{Node: node}, &resp))
		}
		requireCallsWork(t, c)
	})
}

func TestRPC_UnknownMethod(t *testing.T) {
	srv := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, srv)

	c := rpcClientOn(t, rawConn(t, srv, structs.RPCNomad))
	for _, method := range []string{"Nope.Nothing", "Status.Nothing", "NoDot"} {
		err := c.Call(method, &structs.GenericRequest{}, &structs.StatusPingResponse{})
		must.Error(t, err)
		var serverErr rpc.ServerError
		must.True(t, errors.As(err, &serverErr), must.Sprintf("want a server error, got %T: %v", err, err))
		must.StrContains(t, err.Error(), method)
		// The same connection still serves valid calls: the unknown call's
		// body was consumed and the stream is at a frame boundary.
		requireCallsWork(t, c)
	}

	// A body of another shape than the method's argument is an error for
	// that call; the connection then ends rather than guessing where the
	// next frame starts.
	err := c.Call("Node.GetNode", "a string, not a NodeSpecificRequest", &structs.SingleNodeResponse{})
	must.Error(t, err)
	requireServesRPC(t, srv)

	// A header that decodes but names no method (nil, or an empty map) is
	// answered with an error once its body is read, and the connection,
	// still at a frame boundary, goes on serving.
	for name, header := range map[string][]byte{"nil": {0xc0}, "empty map": {0x80}} {
		t.Run("ill-formed header "+name, func(t *testing.T) {
			conn := rawConn(t, srv, structs.RPCNomad)
			_, err := conn.Write(append(header, 0xc0)) // and a nil body
			must.NoError(t, err)
			must.NoError(t, conn.SetReadDeadline(time.Now().Add(closeWait)))
			dec := codec.NewDecoder(conn, structs.MsgpackHandle)
			var resp rpc.Response
			must.NoError(t, dec.Decode(&resp))
			must.StrContains(t, resp.Error, "ill-formed")
			var body any
			must.NoError(t, dec.Decode(&body))
			must.NoError(t, conn.SetReadDeadline(time.Time{}))
			requireCallsWork(t, rpcClientOn(t, conn))
		})
	}

	// In-process calls report an unknown method too.
	err = srv.RPC("Nope.Nothing", &structs.GenericRequest{}, &structs.StatusPingResponse{})
	must.ErrorContains(t, err, "Nope.Nothing")
	must.ErrorIs(t, err, structs.ErrUnknownMethod)
}

func TestRPC_UnknownProtocolByte(t *testing.T) {
	srv := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, srv)

	cases := map[string][]byte{
		"0xff":                  {0xff},
		"0x00":                  {0x00},
		"tls when not enabled":  {structs.RPCTLS, 0x16, 0x03, 0x01},
		"0xff followed by data": append([]byte{0xff}, msgpackBytes(t, &rpc.Request{ServiceMethod: "Status.Ping"})...),
	}
	for name, prefix := range cases {
		t.Run(name, func(t *testing.T) {
			conn := rawConn(t, srv, prefix...)
			requireConnClosed(t, conn)
			requireServesRPC(t, srv)
		})
	}
}

func TestRPC_HugeDeclaredLength(t *testing.T) {
	const limit = 4096
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.RPCMaxFrameBytes = limit
	})
	waitForLeaderDuties(t, srv)

	header := msgpackBytes(t, &rpc.Request{ServiceMethod: "Node.Register", Seq: 1})
	// Filler the decoder will read as map entries: fixstr "a" => nil. More
	// than the frame limit of it, so the limit, not the sender, ends it.
	filler := bytes.Repeat([]byte{0xa1, 'a', 0xc0}, 2*limit/3+1)
	huge32 := []byte{0xff, 0xff, 0xff, 0xff}

	cases := []struct {
		name string
		data []byte
		// closeWrite ends the sender's side after data; otherwise the server
		// must end the connection on its own.
		closeWrite bool
	}{
		{name: "str32 as header", data: append([]byte{0xdb}, huge32...)},
		{name: "bin32 as header", data: append([]byte{0xc6}, huge32...)},
		{name: "map32 as header, then filler", data: append(append([]byte{0xdf}, huge32...), filler...)},
		{name: "array32 as header, then eof", data: append([]byte{0xdd}, huge32...), closeWrite: true},
		{name: "map32 as body, then filler", data: concatBytes(header, []byte{0xdf}, huge32, filler)},
		{name: "array32 as body, then eof", data: concatBytes(header, []byte{0xdd}, huge32), closeWrite: true},
		{
			name: "str32 in a node field, then filler",
			data: concatBytes(header,
				[]byte{0x81, 0xa4}, []byte("Node"),
				[]byte{0x81, 0xa4}, []byte("Name"),
				[]byte{0xdb}, huge32, bytes.Repeat([]byte{'n'}, 2*limit)),
		},
		{
			name: "map32 in node meta, then filler",
			data: concatBytes(header,
				[]byte{0x81, 0xa4}, []byte("Node"),
				[]byte{0x81, 0xa4}, []byte("Meta"),
				[]byte{0xdf}, huge32, bytes.Repeat([]byte{0xa1, 'k', 0xa1, 'v'}, limit)),
		},
	}

	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn := rawConn(t, srv, append([]byte{structs.RPCNomad}, tc.data...)...)
			if tc.closeWrite {
				must.NoError(t, conn.(*net.TCPConn).CloseWrite())
			}
			requireConnClosed(t, conn)
			requireServesRPC(t, srv)
		})
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	// Allocating what any one of those lengths declares would be 4 GiB or
	// more; everything these cases allocate together stays far below that.
	must.Less(t, uint64(256<<20), after.TotalAlloc-before.TotalAlloc,
		must.Sprint("bytes allocated while serving frames with huge declared lengths"))

	nodes, err := srv.State().Nodes(nil)
	must.NoError(t, err)
	must.SliceEmpty(t, nodes)
}

func concatBytes(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// yamuxSession opens a client session to srv, as a client agent does.
func yamuxSession(t *testing.T, srv *Server) *yamux.Session {
	t.Helper()
	conn := rawConn(t, srv, structs.RPCMultiplex)
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	session, err := yamux.Client(conn, cfg)
	must.NoError(t, err)
	t.Cleanup(func() { _ = session.Close() })
	return session
}

func TestRPC_YamuxSession(t *testing.T) {
	srv := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, srv)
	session := yamuxSession(t, srv)

	openRPC := func() *rpc.Client {
		stream, err := session.Open()
		must.NoError(t, err)
		_, err = stream.Write([]byte{structs.RPCNomad})
		must.NoError(t, err)
		return rpcClientOn(t, stream)
	}

	// Several RPC streams on one session, used at once.
	first, second := openRPC(), openRPC()
	requireCallsWork(t, first)
	requireCallsWork(t, second)
	requireCallsWork(t, first)

	// A stream may not switch to Raft, nest a session, or claim TLS.
	for name, b := range map[string]byte{
		"raft":      structs.RPCRaft,
		"multiplex": structs.RPCMultiplex,
		"tls":       structs.RPCTLS,
		"unknown":   0xff,
	} {
		t.Run(name, func(t *testing.T) {
			stream, err := session.Open()
			must.NoError(t, err)
			t.Cleanup(func() { _ = stream.Close() })
			_, err = stream.Write([]byte{b})
			must.NoError(t, err)
			requireConnClosed(t, stream)

			// The refusal ends that stream only: the session and its other
			// streams carry on.
			must.False(t, session.IsClosed())
			requireCallsWork(t, first)
			requireCallsWork(t, openRPC())
		})
	}

	t.Run("garbage on one stream leaves the others alone", func(t *testing.T) {
		stream, err := session.Open()
		must.NoError(t, err)
		_, err = stream.Write([]byte{structs.RPCNomad, 0xc1, 0xc1})
		must.NoError(t, err)
		requireConnClosed(t, stream)
		must.False(t, session.IsClosed())
		requireCallsWork(t, second)
	})
}
