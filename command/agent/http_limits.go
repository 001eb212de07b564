package agent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	metrics "github.com/hashicorp/go-metrics"
)

// limits returns the agent's limits, the defaults where none were given.
func (c *Config) limits() *Limits {
	if c == nil || c.Limits == nil {
		return DefaultLimits()
	}
	return DefaultLimits().merge(c.Limits)
}

// tooManyConns is written to a connection over the per-address cap before
// it is closed. It goes out before the request is read, so a client that
// is still sending may see the connection reset instead.
var tooManyConns = func() []byte {
	const body = "Too many open connections from this address.\n"
	return fmt.Appendf(nil, "HTTP/1.1 429 Too Many Requests\r\n"+
		"Content-Type: text/plain; charset=utf-8\r\n"+
		"Connection: close\r\n"+
		"Content-Length: %d\r\n\r\n%s", len(body), body)
}()

// refuseOverCap answers a connection over the per-address cap with 429
// and closes it, without reading its request: a fresh connection's send
// buffer is empty, so the short write does not block the accept loop.
func (s *HTTPServer) refuseOverCap(c net.Conn) {
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = c.Write(tooManyConns)
	_ = c.Close()
	s.connRejected("over_cap", "http connection refused: too many open from one address",
		"remote", c.RemoteAddr(), "limit", s.connLimiter.Max())
}

// connRejected counts a connection or request cut off for misbehaving, by
// reason, and logs it rate-limited.
func (s *HTTPServer) connRejected(reason, msg string, args ...any) {
	metrics.IncrCounterWithLabels([]string{"http", "conn", "rejected"}, 1,
		[]metrics.Label{{Name: "reason", Value: reason}})
	s.connLog.Warn(msg, args...)
}

// limitBodyRead gives r's body bodyTimeout to arrive. The deadline is on
// the connection, which the server goes on reading after the body to
// notice the client going away; that read ending would cancel the
// request's context and with it a blocking query that waits longer than
// the body timeout. So a request without a body gets no deadline (that
// read has already begun), and the deadline is lifted at the body's end
// (net/http lifts it then too, before that read begins).
func (s *HTTPServer) limitBodyRead(w http.ResponseWriter, r *http.Request) {
	if s.bodyTimeout <= 0 || r.Body == nil || r.Body == http.NoBody {
		return
	}
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Now().Add(s.bodyTimeout)); err != nil {
		return
	}
	r.Body = &timedBody{ReadCloser: r.Body, rc: rc, s: s, remote: r.RemoteAddr}
}

// timedBody lifts the body's read deadline at the end of the body, and
// turns the deadline's error into a 408 naming the limit.
type timedBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	s      *HTTPServer
	remote string
	once   sync.Once
}

func (b *timedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case errors.Is(err, io.EOF):
		b.once.Do(func() { _ = b.rc.SetReadDeadline(time.Time{}) })
	case err != nil && errors.Is(err, os.ErrDeadlineExceeded):
		b.once.Do(func() {
			b.s.connRejected("body_timeout", "http request body not received within the body read timeout; connection closed",
				"remote", b.remote, "timeout", b.s.bodyTimeout)
		})
		return n, &codedError{code: http.StatusRequestTimeout,
			msg: fmt.Sprintf("Request body not received within %s (limits.http_body_read_timeout)", b.s.bodyTimeout)}
	}
	return n, err
}

// closeBodyUnread closes r's body without reading it, for a request
// refused by its headers alone. net/http would otherwise read up to 256
// KiB of the body after the handler returns, before it writes the answer
// (waiting for them, from a client that sends slowly, up to the body read
// timeout). A body closed with more than that unread makes the server
// close the connection after the answer instead, lingering briefly so
// that the client, still sending, reads the answer before a reset.
func closeBodyUnread(r *http.Request) {
	if r.Body == nil {
		return
	}
	// The server looks at the request's own body to decide; take off the
	// read timeout's wrapper (limitBodyRead) so that it sees it.
	if tb, ok := r.Body.(*timedBody); ok {
		r.Body = tb.ReadCloser
	}
	_ = r.Body.Close()
}
