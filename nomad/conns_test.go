package nomad

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/rpc"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// syncBuffer collects log output written from many goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// requireConnOpen checks that the server has not closed conn: a short read
// times out rather than ending.
func requireConnOpen(t *testing.T, conn net.Conn) {
	t.Helper()
	must.NoError(t, conn.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err := conn.Read(make([]byte, 1))
	var netErr net.Error
	must.True(t, errors.As(err, &netErr) && netErr.Timeout(), must.Sprintf("connection ended: %v", err))
	must.NoError(t, conn.SetReadDeadline(time.Time{}))
}

func TestConn_CapPerClient(t *testing.T) {
	const limit = 4
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.RPCMaxConnsPerClient = limit
	})
	waitForLeaderDuties(t, srv)
	// A lone server dials nobody; every connection counted is the test's.
	must.EqOp(t, 0, srv.connLimiter.Open("127.0.0.1"))

	var conns []net.Conn
	for range limit {
		conn := rawConn(t, srv, structs.RPCNomad)
		requireCallsWork(t, rpcClientOn(t, conn))
		conns = append(conns, conn)
	}
	// One more, whatever it speaks, is closed at once.
	for name, prefix := range map[string][]byte{
		"rpc":     {structs.RPCNomad},
		"raft":    {structs.RPCRaft},
		"session": {structs.RPCMultiplex},
		"nothing": nil,
	} {
		t.Run(name, func(t *testing.T) {
			requireConnClosed(t, rawConn(t, srv, prefix...))
		})
	}
	must.EqOp(t, limit, srv.connLimiter.Open("127.0.0.1"))

	// Closing one makes room for one.
	must.NoError(t, conns[0].Close())
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return srv.connLimiter.Open("127.0.0.1") == limit-1 }),
		wait.Timeout(5*time.Second), wait.Gap(5*time.Millisecond)))
	requireServesRPC(t, srv)
}

func TestConn_HandshakeTimeout(t *testing.T) {
	t.Parallel()
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.RPCHandshakeTimeout = 200 * time.Millisecond
	})
	waitForLeaderDuties(t, srv)

	requireConnClosed(t, rawConn(t, srv))

	// A stream of a client session that never says what it is, too.
	session := yamuxSession(t, srv)
	stream, err := session.Open()
	must.NoError(t, err)
	requireConnClosed(t, stream)
	must.False(t, session.IsClosed())
	requireServesRPC(t, srv)
}

func TestConn_RPCFrameTimeout(t *testing.T) {
	t.Parallel()
	const frameTimeout = 300 * time.Millisecond
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.RPCFrameTimeout = frameTimeout
	})
	waitForLeaderDuties(t, srv)

	header := msgpackBytes(t, &rpc.Request{ServiceMethod: "Node.List", Seq: 1})
	body := msgpackBytes(t, &structs.NodeListRequest{})
	cases := map[string][]byte{
		"part of a header":    header[:3],
		"header, no body":     header,
		"header, part body":   append(append([]byte{}, header...), body[:2]...),
		"one call, then half": concatBytes(header, body, header[:4]),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			// An idle connection, opened first, outlives the stalled one.
			idle := rpcClientOn(t, rawConn(t, srv, structs.RPCNomad))
			requireCallsWork(t, idle)

			stalled := rawConn(t, srv, append([]byte{structs.RPCNomad}, data...)...)
			requireConnClosed(t, stalled)
			// Closing took at least the frame timeout, all of which the idle
			// connection spent idle.
			requireCallsWork(t, idle)
		})
	}

	t.Run("on a session stream", func(t *testing.T) {
		session := yamuxSession(t, srv)
		idle, err := session.Open()
		must.NoError(t, err)
		_, err = idle.Write([]byte{structs.RPCNomad})
		must.NoError(t, err)
		idleRPC := rpcClientOn(t, idle)
		requireCallsWork(t, idleRPC)

		stalled, err := session.Open()
		must.NoError(t, err)
		_, err = stalled.Write(append([]byte{structs.RPCNomad}, header[:3]...))
		must.NoError(t, err)
		requireConnClosed(t, stalled)
		must.False(t, session.IsClosed())
		requireCallsWork(t, idleRPC)
	})
}

// raftBytes encodes a Raft transport frame: the type byte, then the
// request as Raft's transport encodes it.
func raftBytes(t *testing.T, rpcType byte, req any) []byte {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteByte(rpcType)
	must.NoError(t, newRaftEncoder(&buf).Encode(req))
	return buf.Bytes()
}

func TestConn_RaftFrameTimeout(t *testing.T) {
	t.Parallel()
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.RPCFrameTimeout = 300 * time.Millisecond
	})
	waitForLeaderDuties(t, srv)

	vote := raftBytes(t, 1, &raft.RequestVoteRequest{Term: 1, Candidate: []byte("x")})
	snap := raftBytes(t, raftRPCInstallSnapshot, &raft.InstallSnapshotRequest{Term: 1, Size: 1000})
	cases := map[string][]byte{
		"type byte only":           {0},
		"part of a request":        vote[:len(vote)/2],
		"snapshot without data":    snap,
		"snapshot with some data":  append(append([]byte{}, snap...), make([]byte, 10)...),
		"a map that never ends":    {0, 0xdf, 0xff, 0xff, 0xff, 0xff, 0xc0},
		"a string that never ends": {0, 0x81, 0xa4, 'T', 'e', 'r', 'm', 0xdb, 0, 0, 1, 0},
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			// An idle Raft connection, opened first, stays.
			idle := rawConn(t, srv, structs.RPCRaft)
			stalled := rawConn(t, srv, append([]byte{structs.RPCRaft}, data...)...)
			requireConnClosed(t, stalled)
			requireConnOpen(t, idle)
		})
	}
}

func TestConn_SessionFrameTimeout(t *testing.T) {
	t.Parallel()
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.RPCFrameTimeout = 300 * time.Millisecond
	})
	waitForLeaderDuties(t, srv)

	// A window update for stream 1 (type 1, flag SYN): a whole frame.
	open := []byte{0, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0}
	data := []byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 100}
	cases := map[string][]byte{
		"part of a header":      {0, 1, 0},
		"data frame, half sent": append(append(append([]byte{}, open...), data...), make([]byte, 50)...),
	}
	for name, prefix := range cases {
		t.Run(name, func(t *testing.T) {
			idle := yamuxSession(t, srv)
			stream, err := idle.Open()
			must.NoError(t, err)
			_, err = stream.Write([]byte{structs.RPCNomad})
			must.NoError(t, err)
			idleRPC := rpcClientOn(t, stream)
			requireCallsWork(t, idleRPC)

			requireConnClosed(t, rawConn(t, srv, append([]byte{structs.RPCMultiplex}, prefix...)...))
			must.False(t, idle.IsClosed())
			requireCallsWork(t, idleRPC)
		})
	}
}

// loggedCount adds up how many times msg was logged: a plain line counts
// once, a rate-limited summary "msg (N more ...)" counts N.
func loggedCount(logs, msg string) (lines, events int) {
	more := regexp.MustCompile(regexp.QuoteMeta(msg) + ` \((\d+) more in the last`)
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		lines++
		if m := more.FindStringSubmatch(line); m != nil {
			n, _ := strconv.Atoi(m[1])
			events += n
		} else {
			events++
		}
	}
	return lines, events
}

func TestConn_BadConnectionsLogRateLimited(t *testing.T) {
	logs := &syncBuffer{}
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.RPCMaxConnsPerClient = 0 // the test opens them faster than they close
		c.Logger = hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Warn})
	})
	waitForLeaderDuties(t, srv)

	const n = 1000
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				conn, err := net.DialTimeout("tcp", srv.Addr(), closeWait)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = conn.Write([]byte{0xff})
				_ = conn.SetReadDeadline(time.Now().Add(closeWait))
				_, err = conn.Read(make([]byte, 1))
				var netErr net.Error
				if errors.As(err, &netErr) && netErr.Timeout() {
					t.Error("server left a bad connection open")
				}
				_ = conn.Close()
			}
		})
	}
	wg.Wait()
	must.NoError(t, srv.Shutdown(context.Background()))

	lines, events := loggedCount(logs.String(), "unknown protocol byte, closing connection")
	t.Logf("%d bad connections logged in %d lines", events, lines)
	must.EqOp(t, n, events)
	// One line as the first comes, one summary per 10 s window after.
	must.LessEq(t, 4, lines)
}

func TestConn_IntraClusterUnderCap(t *testing.T) {
	t.Parallel()
	servers := testClusterWith(t, 3, withLongHeartbeats)
	leader := waitForLeaderDuties(t, servers...)
	// Forward a few writes from each follower so the pools are in use.
	for _, f := range followers(servers) {
		c := rpcClientOn(t, rawConn(t, f, structs.RPCNomad))
		for i := range 3 {
			var resp structs.NodeUpdateResponse
			callRetry(t, c, "Node.Register", &structs.NodeRegisterRequest{
				Node: testNode(f.ID()[:8] + strconv.Itoa(i)),
			}, &resp)
		}
	}
	// All of them on 127.0.0.1: the whole cluster's Raft and forwarding
	// connections, plus the test's, into each server.
	for _, s := range servers {
		open := s.connLimiter.Open("127.0.0.1")
		t.Logf("server %s (leader %v): %d connections from 127.0.0.1", s.ID()[:8], s == leader, open)
		must.Less(t, DefaultConfig().RPCMaxConnsPerClient/4, open)
	}
}
