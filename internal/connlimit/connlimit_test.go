package connlimit

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// acceptAll accepts from ln until it closes and sends each connection on.
func acceptAll(t *testing.T, ln net.Listener) <-chan net.Conn {
	t.Helper()
	ch := make(chan net.Conn, 16)
	go func() {
		defer close(ch)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ch <- c
		}
	}()
	return ch
}

func dial(t *testing.T, ln net.Listener) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	must.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// requireClosedByPeer reads until the other side closes c.
func requireClosedByPeer(t *testing.T, c net.Conn) {
	t.Helper()
	must.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	must.False(t, errors.As(err, &ne) && ne.Timeout(), must.Sprint("connection left open"))
}

func TestListen_CapsPerHost(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	lim := New(3)
	var refused atomic.Int64
	ln := Listen(inner, lim, func(c net.Conn) {
		refused.Add(1)
		_ = c.Close()
	})
	t.Cleanup(func() { _ = ln.Close() })
	accepted := acceptAll(t, ln)

	var served []net.Conn
	for range 3 {
		dial(t, ln)
		served = append(served, <-accepted)
	}
	must.EqOp(t, 3, lim.Open("127.0.0.1"))

	// The fourth is closed at once and never reaches Accept's caller.
	requireClosedByPeer(t, dial(t, ln))
	must.EqOp(t, int64(1), refused.Load())

	// Closing one (twice: the count goes back once) makes room for one.
	must.NoError(t, served[0].Close())
	_ = served[0].Close()
	must.EqOp(t, 2, lim.Open("127.0.0.1"))
	dial(t, ln)
	select {
	case c := <-accepted:
		t.Cleanup(func() { _ = c.Close() })
	case <-time.After(5 * time.Second):
		t.Fatal("a connection under the cap was not accepted")
	}
	must.EqOp(t, 3, lim.Open("127.0.0.1"))
	must.EqOp(t, int64(1), refused.Load())
}

func TestLimiter_NoCap(t *testing.T) {
	lim := New(0)
	addr := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 1}
	var releases []func()
	for range 1000 {
		release, ok := lim.Acquire(addr)
		must.True(t, ok)
		releases = append(releases, release)
	}
	must.EqOp(t, 1000, lim.Open("10.0.0.1"))
	for _, r := range releases {
		r()
		r()
	}
	must.EqOp(t, 0, lim.Open("10.0.0.1"))
}
