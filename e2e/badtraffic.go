//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/rpc"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"

	"github.com/roamhq/roam/structs"
)

// Bad traffic, as a careless user or an attacker would send it: the
// inputs of issue 9's table, each a function the bad-input suite sends
// once and the storm sends over and over. Everything goes to 127.0.0.1.
// Traffic that holds connections open leaves from other loopback
// addresses (127.0.1.1, 127.0.1.2, ...), each one a different "client" to
// the agent's per-address connection caps, so that the harness's own
// requests from 127.0.0.1 are not the ones a cap turns away.

// attackerAddr returns the i-th loopback source address handed to bad
// traffic: 127.0.1.1, ..., 127.0.1.250, 127.0.2.1, ...
func attackerAddr(i int) string {
	return fmt.Sprintf("127.0.%d.%d", 1+i/250, 1+i%250)
}

// dialFrom opens a TCP connection to addr from the loopback address src.
func dialFrom(ctx context.Context, src, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return d.DialContext(ctx, "tcp", addr)
}

// httpFrom is an HTTP client whose connections leave from src and are
// never reused, so each request is one connection the test can reason
// about, and none lingers idle in the agent after the test is done.
func httpFrom(src string, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return dialFrom(ctx, src, addr)
			},
			DisableKeepAlives: true,
		},
	}
}

// maxKeptBody is how much of an answer's body is kept for messages; the
// rest is only counted.
const maxKeptBody = 64 << 10

// httpAnswer is one HTTP answer: its status, the start of its body, and
// the body's full size.
type httpAnswer struct {
	Status int
	Body   string
	Size   int64
}

func (a *httpAnswer) String() string {
	body := strings.TrimSpace(a.Body)
	if len(body) > 300 {
		body = body[:300] + "..."
	}
	return fmt.Sprintf("%d (%d bytes): %s", a.Status, a.Size, body)
}

// sendHTTP sends one request with cl and reads the whole answer, keeping
// its first maxKeptBody bytes.
func sendHTTP(cl *http.Client, method, url string, body []byte) (*httpAnswer, error) {
	return sendHTTPCtx(context.Background(), cl, method, url, body)
}

// sendHTTPCtx is sendHTTP that gives up when ctx ends.
func sendHTTPCtx(ctx context.Context, cl *http.Client, method, url string, body []byte) (*httpAnswer, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := cl.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var kept bytes.Buffer
	n, err := io.Copy(&kept, io.LimitReader(resp.Body, maxKeptBody))
	if err == nil {
		var more int64
		more, err = io.Copy(io.Discard, resp.Body)
		n += more
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: read answer: %w", method, url, err)
	}
	return &httpAnswer{Status: resp.StatusCode, Body: kept.String(), Size: n}, nil
}

// nestedParseBody is a /v1/jobs/parse body whose task config holds depth
// nested lists: the 100,000 `[` (200 KB) overflowed the parser's
// stack.
func nestedParseBody(depth int) []byte {
	hcl := `job "nested" {
  datacenters = ["dc1"]
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
        args    = ` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `
      }
    }
  }
}
`
	b, _ := json.Marshal(map[string]any{"JobHCL": hcl, "Canonicalize": true})
	return b
}

// hugeCountJob is a register body for a job of one group with count
// allocations in a datacenter no node is in: nothing can ever place, so
// an unbounded count became unbounded work.
func hugeCountJob(id string, count uint64, dc string) []byte {
	return []byte(fmt.Sprintf(`{"Job": {"ID": %q, "Name": %q, "Type": "service", "Datacenters": [%q],
  "TaskGroups": [{"Name": "g", "Count": %d,
    "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]}}`,
		id, id, dc, count))
}

// emptyGroupsJobJSON is a register body of at most size bytes whose job
// has as many empty task groups ({}) as fit: 4 MiB holds about 1.39
// million of them.
func emptyGroupsJobJSON(id string, size int) []byte {
	head := fmt.Sprintf(`{"Job": {"ID": %q, "Name": %q, "Type": "service", "Datacenters": ["dc1"], "TaskGroups": [`, id, id)
	const tail = `]}}`
	n := (size - len(head) - len(tail) + 1) / 3 // "{}," per group, less the last comma
	var b bytes.Buffer
	b.Grow(size)
	b.WriteString(head)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("{}")
	}
	b.WriteString(tail)
	return b.Bytes()
}

// rpcHeader is a msgpack net/rpc request header as Roam's RPC codec
// writes it.
func rpcHeader(method string, seq uint64) []byte {
	var b bytes.Buffer
	if err := codec.NewEncoder(&b, structs.MsgpackHandle).Encode(&rpc.Request{ServiceMethod: method, Seq: seq}); err != nil {
		panic(fmt.Sprintf("encode rpc header: %v", err)) // a fixed struct always encodes
	}
	return b.Bytes()
}

// msgpackStr appends s as a msgpack fixstr (len < 32).
func msgpackStr(b []byte, s string) []byte {
	if len(s) >= 32 {
		panic("msgpackStr: " + s + " is too long for a fixstr")
	}
	return append(append(b, 0xa0|byte(len(s))), s...)
}

// emptyGroupsRegisterFrame is one msgpack RPC request (header and body,
// without the protocol byte) of at most size bytes: a Job.Register whose
// job has as many empty task groups as fit. An empty map is one byte, so
// 4 MiB holds about 4.19 million groups.
func emptyGroupsRegisterFrame(id string, size int) []byte {
	b := rpcHeader("Job.Register", 1)
	// {"Job": {"ID": id, "Name": id, "Type": "service",
	//          "Datacenters": ["dc1"], "TaskGroups": [{}, {}, ...]}}
	b = append(b, 0x81)
	b = msgpackStr(b, "Job")
	b = append(b, 0x85)
	b = msgpackStr(b, "ID")
	b = msgpackStr(b, id)
	b = msgpackStr(b, "Name")
	b = msgpackStr(b, id)
	b = msgpackStr(b, "Type")
	b = msgpackStr(b, "service")
	b = msgpackStr(b, "Datacenters")
	b = append(b, 0x91)
	b = msgpackStr(b, "dc1")
	b = msgpackStr(b, "TaskGroups")
	n := size - len(b) - 5
	b = append(b, 0xdd) // array 32
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	return append(b, bytes.Repeat([]byte{0x80}, n)...)
}

// rpcAnswer is what came back for one raw RPC request.
type rpcAnswer struct {
	// Error is the reply header's error string; "" on success.
	Error string
	// Size is the bytes of the whole reply, header and body.
	Size int
	// Closed: the server closed the connection without a reply.
	Closed bool
	// Took is from the last byte written to the reply (or the close).
	Took time.Duration
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// rawRPC opens a connection to a server's RPC port from src, writes the
// msgpack RPC protocol byte and frame, and reads one reply (or the close)
// within timeout.
func rawRPC(src, addr string, frame []byte, timeout time.Duration) (*rpcAnswer, error) {
	return rawRPCCtx(context.Background(), src, addr, frame, timeout)
}

// rawRPCCtx is rawRPC that gives up when ctx ends.
func rawRPCCtx(ctx context.Context, src, addr string, frame []byte, timeout time.Duration) (*rpcAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := dialFrom(ctx, src, addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	if _, err := conn.Write(append([]byte{structs.RPCNomad}, frame...)); err != nil && !isClosedErr(err) {
		return nil, fmt.Errorf("write frame: %w", err)
	}
	sent := time.Now()
	cr := &countingReader{r: bufio.NewReader(conn)}
	dec := codec.NewDecoder(cr, structs.MsgpackHandle)
	var resp rpc.Response
	if err := dec.Decode(&resp); err != nil {
		if isClosedErr(err) {
			return &rpcAnswer{Closed: true, Took: time.Since(sent)}, nil
		}
		return nil, fmt.Errorf("read reply header after %s: %w", time.Since(sent), err)
	}
	var body any
	if err := dec.Decode(&body); err != nil && !isClosedErr(err) {
		return nil, fmt.Errorf("read reply body: %w", err)
	}
	return &rpcAnswer{Error: resp.Error, Size: cr.n, Took: time.Since(sent)}, nil
}

// isClosedErr reports whether err means the peer closed or reset the
// connection (as opposed to our own deadline passing).
func isClosedErr(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "connection reset") ||
		strings.Contains(err.Error(), "broken pipe")
}

// partialRPCFrame is the protocol byte of msgpack RPC and the first half
// of a request header: a frame that never completes.
func partialRPCFrame() []byte {
	h := rpcHeader("Status.Ping", 1)
	return append([]byte{structs.RPCNomad}, h[:len(h)/2]...)
}

// partialRaftFrame is the protocol byte of Raft, an AppendEntries type
// byte, and the start of its msgpack body: a map of 15 entries whose first
// key stops after two of its four bytes.
func partialRaftFrame() []byte {
	return []byte{structs.RPCRaft, 0x00, 0x8f, 0xa4, 'T', 'e'}
}

// holdOpen opens a connection from src to addr, writes prefix, and waits
// (up to limit) for the server to close it. It returns how long after the
// write the close came; a connection still open at limit is an error.
func holdOpen(ctx context.Context, src, addr string, prefix []byte, limit time.Duration) (time.Duration, error) {
	conn, err := dialFrom(ctx, src, addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	start := time.Now()
	if len(prefix) > 0 {
		if _, err := conn.Write(prefix); err != nil {
			if isClosedErr(err) {
				return time.Since(start), nil
			}
			return 0, err
		}
	}
	return waitClosed(ctx, conn, start, limit)
}

// waitClosed reads and discards until the peer closes conn, and returns
// how long after start that was; past limit (or ctx) it is an error.
func waitClosed(ctx context.Context, conn net.Conn, start time.Time, limit time.Duration) (time.Duration, error) {
	deadline := start.Add(limit)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetReadDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 4096)
	for {
		_, err := conn.Read(buf)
		if err == nil {
			continue
		}
		if isClosedErr(err) {
			return time.Since(start), nil
		}
		return time.Since(start), fmt.Errorf("still open %s after the last byte was sent: %w", time.Since(start).Round(time.Millisecond), err)
	}
}

// slowBodyGap is how often a slow body sends its next byte: often enough
// that a per-read idle timeout never fires, so only a deadline on the
// whole body stops it.
const slowBodyGap = 500 * time.Millisecond

// slowBody starts a job register on the HTTP server at addr (host:port)
// from src whose body promises 1 MiB and then trickles one byte per
// slowBodyGap. It returns how long after the headers the server answered
// or closed the connection, and the status line if it answered; still
// open at limit is an error.
func slowBody(ctx context.Context, src, addr string, limit time.Duration) (time.Duration, string, error) {
	conn, err := dialFrom(ctx, src, addr)
	if err != nil {
		return 0, "", err
	}
	defer conn.Close()
	start := time.Now()
	head := "PUT /v1/jobs HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n" +
		"Content-Length: " + strconv.Itoa(1<<20) + "\r\n\r\n{"
	if _, err := conn.Write([]byte(head)); err != nil {
		return 0, "", err
	}
	type result struct {
		status string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		_ = conn.SetReadDeadline(start.Add(limit))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			if isClosedErr(err) {
				done <- result{}
				return
			}
			done <- result{err: err}
			return
		}
		resp.Body.Close()
		done <- result{status: resp.Status}
	}()
	tick := time.NewTicker(slowBodyGap)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			took := time.Since(start)
			if r.err != nil {
				return took, "", fmt.Errorf("no answer and no close %s after the headers: %w", took.Round(time.Millisecond), r.err)
			}
			return took, r.status, nil
		case <-ctx.Done():
			_ = conn.SetReadDeadline(time.Now())
		case <-tick.C:
			// A failed write means the server closed; the reader sees it.
			_, _ = conn.Write([]byte(" "))
		}
	}
}

// blockingQueryUntil runs a blocking query for jobs from src against the
// HTTP API at base and hangs up when ctx ends. It returns nil if the
// query was still waiting when the caller hung up, as it should be.
func blockingQueryUntil(ctx context.Context, src, base string, index uint64) error {
	cl := httpFrom(src, 0)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		fmt.Sprintf("%s/v1/jobs?index=%d&wait=5m", base, index), nil)
	if err != nil {
		return err
	}
	resp, err := cl.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil // hung up while waiting
		}
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return fmt.Errorf("blocking query answered %s before the caller hung up", resp.Status)
}

// badFirstBytes are the first bytes the RPC port has no protocol for,
// with TLS (which no test agent configures) among them.
func badFirstBytes() []byte {
	var out []byte
	for b := 0; b < 256; b++ {
		switch byte(b) {
		case structs.RPCNomad, structs.RPCRaft, structs.RPCMultiplex:
			continue
		}
		out = append(out, byte(b))
	}
	return out
}
