package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// closeWait bounds how long a test waits for the agent to end a
// connection; reaching it means the agent left the connection open.
const closeWait = 5 * time.Second

// withLimits is a server-only agent's config with the limits fn sets.
func withLimits(fn func(*Limits)) func(*Config) {
	return func(c *Config) {
		c.Client.Enabled = false
		l := DefaultLimits()
		fn(l)
		c.Limits = l
	}
}

// httpConn dials a's HTTP port.
func httpConn(t *testing.T, a *Agent) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", a.HTTPAddr(), closeWait)
	must.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// roundTrip sends a GET on conn, keeping it open, and returns the status.
func roundTrip(t *testing.T, conn net.Conn, br *bufio.Reader, path string) int {
	t.Helper()
	must.NoError(t, conn.SetDeadline(time.Now().Add(closeWait)))
	_, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: roam\r\n\r\n", path)
	must.NoError(t, err)
	req, _ := http.NewRequest(http.MethodGet, path, nil)
	resp, err := http.ReadResponse(br, req)
	must.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	must.NoError(t, conn.SetDeadline(time.Time{}))
	return resp.StatusCode
}

// readUntilClosed reads what the agent sends on conn until it closes it,
// and fails if it does not within closeWait.
func readUntilClosed(t *testing.T, conn net.Conn) string {
	t.Helper()
	must.NoError(t, conn.SetReadDeadline(time.Now().Add(closeWait)))
	var got strings.Builder
	_, err := io.Copy(&got, conn)
	var netErr net.Error
	must.False(t, errors.As(err, &netErr) && netErr.Timeout(),
		must.Sprintf("agent did not close the connection within %s; got %q", closeWait, got.String()))
	return got.String()
}

func TestHTTP_ConnCapPerClient(t *testing.T) {
	const limit = 3
	a := newTestAgent(t, withLimits(func(l *Limits) { l.HTTPMaxConnsPerClient = limit }))
	waitForLeader(t, a)
	must.EqOp(t, 0, a.http.connLimiter.Open("127.0.0.1"))

	// Keep-alive connections, each with a request answered.
	var conns []net.Conn
	for range limit {
		conn := httpConn(t, a)
		must.EqOp(t, http.StatusOK, roundTrip(t, conn, bufio.NewReader(conn), "/v1/agent/self"))
		conns = append(conns, conn)
	}

	// One more is answered 429 (or reset, if its request was still
	// arriving) and closed, without being served.
	over := httpConn(t, a)
	_, _ = fmt.Fprintf(over, "GET /v1/agent/self HTTP/1.1\r\nHost: roam\r\n\r\n")
	got := readUntilClosed(t, over)
	t.Logf("over the cap: %q", got)
	if got != "" {
		must.StrHasPrefix(t, "HTTP/1.1 429 Too Many Requests", got)
	}
	must.EqOp(t, limit, a.http.connLimiter.Open("127.0.0.1"))

	// Closing one makes room for one.
	must.NoError(t, conns[0].Close())
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return a.http.connLimiter.Open("127.0.0.1") == limit-1 }),
		wait.Timeout(closeWait), wait.Gap(5*time.Millisecond)))
	conn := httpConn(t, a)
	must.EqOp(t, http.StatusOK, roundTrip(t, conn, bufio.NewReader(conn), "/v1/agent/self"))
}

func TestHTTP_SlowBodyIsCut(t *testing.T) {
	const bodyTimeout = 300 * time.Millisecond
	a := newTestAgent(t, withLimits(func(l *Limits) { l.HTTPBodyReadTimeout = bodyTimeout.String() }))
	waitForLeader(t, a)

	// A body of 200 bytes sent one byte every 20 ms would take 4 s: bytes
	// keep coming, but the body as a whole is late.
	const size, gap = 200, 20 * time.Millisecond
	conn := httpConn(t, a)
	_, err := fmt.Fprintf(conn, "PUT /v1/jobs HTTP/1.1\r\nHost: roam\r\nContent-Length: %d\r\n\r\n", size)
	must.NoError(t, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(gap)
		defer tick.Stop()
		for range size {
			select {
			case <-tick.C:
			case <-stop:
				return
			}
			if _, err := conn.Write([]byte("{")); err != nil {
				return
			}
		}
	})
	t.Cleanup(func() { close(stop); wg.Wait() })

	start := time.Now()
	got := readUntilClosed(t, conn)
	elapsed := time.Since(start)
	must.StrHasPrefix(t, "HTTP/1.1 408 Request Timeout", got)
	must.StrContains(t, got, "http_body_read_timeout")
	// Cut on the body's deadline, well before the body could have ended.
	t.Logf("slow body cut after %s (timeout %s, whole body %s)", elapsed, bodyTimeout, size*gap)
	must.Less(t, size*gap/2, elapsed)

	// A body that arrives in time is read as usual.
	res := do(t, a, http.MethodGet, "/v1/agent/self")
	must.EqOp(t, http.StatusOK, res.code)
}

func TestHTTP_BlockingQueryOutlivesBodyTimeout(t *testing.T) {
	const bodyTimeout = 200 * time.Millisecond
	a := newTestAgent(t, withLimits(func(l *Limits) { l.HTTPBodyReadTimeout = bodyTimeout.String() }))
	waitForLeader(t, a)

	var nodes []*structs.NodeListStub
	res := get(t, a, "/v1/nodes", &nodes)
	index := res.header.Get("X-Nomad-Index")

	// Ten body timeouts of waiting: the response comes when the wait ends,
	// not when a read deadline would have cut the request off.
	const waitFor = 10 * bodyTimeout
	start := time.Now()
	res = get(t, a, "/v1/nodes?index="+index+"&wait="+waitFor.String(), &nodes)
	elapsed := time.Since(start)
	t.Logf("blocking query answered after %s (wait %s, body timeout %s)", elapsed, waitFor, bodyTimeout)
	must.GreaterEq(t, waitFor, elapsed)
	must.EqOp(t, index, res.header.Get("X-Nomad-Index"))
}

// blockedQueries counts goroutines parked in a server's blocking Node.List
// query, the one these tests send: a client agent in the same process
// keeps blocking queries of its own (its allocations), re-sent now and
// then, which must not count.
func blockedQueries() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "(*Server).blockingRPC") && strings.Contains(g, "WatchSet.WatchCtx") &&
			strings.Contains(g, "nomad.(*Node).List(") {
			count++
		}
	}
	return count
}

// startBlockingQueries sends n blocking GET /v1/nodes to a, each on its own
// connection, all ended by cancelling ctx; it waits until the servers
// hold n of them more than they did.
func startBlockingQueries(t *testing.T, ctx context.Context, a *Agent, n int) *sync.WaitGroup {
	t.Helper()
	before := blockedQueries()
	tr := &http.Transport{DisableKeepAlives: true, MaxConnsPerHost: 0}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	url := "http://" + a.HTTPAddr() + "/v1/nodes?index=" + strconv.Itoa(1<<40) + "&wait=10m"
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			resp, err := hc.Do(req)
			if err == nil {
				resp.Body.Close()
				t.Errorf("blocking query answered %d before its caller left", resp.StatusCode)
			}
		})
	}
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			if got := blockedQueries() - before; got != n {
				return fmt.Errorf("%d blocked queries, want %d", got, n)
			}
			return nil
		}),
		wait.Timeout(30*time.Second), wait.Gap(20*time.Millisecond)))
	return &wg
}

// requireGoroutinesBack waits for the blocked queries to come back to
// baseBlocked and the goroutine count within 10 % of baseline.
func requireGoroutinesBack(t *testing.T, baseBlocked, baseline, peak int) {
	t.Helper()
	var now int
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			if b := blockedQueries(); b != baseBlocked {
				return fmt.Errorf("%d blocking queries held, %d before", b, baseBlocked)
			}
			now = runtime.NumGoroutine()
			if now > baseline+baseline/10 {
				return fmt.Errorf("%d goroutines, baseline %d", now, baseline)
			}
			return nil
		}),
		wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))
	t.Logf("goroutines: baseline %d, with the queries %d, after they left %d", baseline, peak, now)
}

func TestHTTP_BlockingQueriesEndWithTheirCallers(t *testing.T) {
	const n = 500
	a := newTestAgent(t, withLimits(func(l *Limits) { l.HTTPMaxConnsPerClient = 2 * n }))
	waitForLeader(t, a)
	var nodes []*structs.NodeListStub
	get(t, a, "/v1/nodes", &nodes)
	baseBlocked, baseline := blockedQueries(), runtime.NumGoroutine()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	callers := startBlockingQueries(t, ctx, a, n)
	peak := runtime.NumGoroutine()
	cancel()
	callers.Wait()
	requireGoroutinesBack(t, baseBlocked, baseline, peak)
}

func TestHTTP_ClientAgentBlockingQueriesEndWithTheirCallers(t *testing.T) {
	srv := newTestAgent(t, func(c *Config) { c.Client.Enabled = false })
	waitForLeader(t, srv)
	cl := newTestAgent(t, func(c *Config) {
		c.Name = "client-only"
		c.DevMode = false
		c.Server.Enabled = false
		c.Client.Servers = []string{srv.Server().Addr()}
		c.Limits = DefaultLimits()
		c.Limits.HTTPMaxConnsPerClient = 1000
	})
	waitForNodeReady(t, srv, cl.Client().NodeID())
	var nodes []*structs.NodeListStub
	get(t, cl, "/v1/nodes", &nodes)
	baseBlocked, baseline := blockedQueries(), runtime.NumGoroutine()

	// Through the client's session: all share its one call stream, far
	// more than the session's stream cap, and each is ended on the server
	// by name when its caller leaves.
	const n = 300
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	callers := startBlockingQueries(t, ctx, cl, n)
	peak := runtime.NumGoroutine()
	cancel()
	callers.Wait()
	requireGoroutinesBack(t, baseBlocked, baseline, peak)
}

func TestLimits_ReachTheServer(t *testing.T) {
	a := newTestAgent(t, withLimits(func(l *Limits) {
		l.RPCMaxConnsPerClient = 7
		l.RPCHandshakeTimeout = "2s"
		l.RPCFrameTimeout = "3s"
		l.HTTPMaxConnsPerClient = 9
		l.HTTPBodyReadTimeout = "4s"
	}))
	sc := a.Server().Config()
	must.EqOp(t, 7, sc.RPCMaxConnsPerClient)
	must.EqOp(t, 2*time.Second, sc.RPCHandshakeTimeout)
	must.EqOp(t, 3*time.Second, sc.RPCFrameTimeout)
	must.EqOp(t, 9, a.http.connLimiter.Max())
	must.EqOp(t, 4*time.Second, a.http.bodyTimeout)

	// Without a limits block, the documented defaults.
	d := newTestAgent(t, func(c *Config) { c.Client.Enabled = false; c.Limits = nil })
	must.EqOp(t, 100, d.Server().Config().RPCMaxConnsPerClient)
	must.EqOp(t, 5*time.Second, d.Server().Config().RPCHandshakeTimeout)
	must.EqOp(t, 30*time.Second, d.Server().Config().RPCFrameTimeout)
	must.EqOp(t, 100, d.http.connLimiter.Max())
	must.EqOp(t, 30*time.Second, d.http.bodyTimeout)
}
