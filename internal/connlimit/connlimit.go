// Package connlimit caps the connections open at once from one client
// address, so that one caller cannot take every file descriptor and
// goroutine an agent has. The RPC listener and the HTTP server share it.
package connlimit

import (
	"errors"
	"net"
	"sync"
)

// Limiter counts open connections per remote host (the IP, without the
// port). The zero value is not usable; call New.
type Limiter struct {
	max int

	mu   sync.Mutex
	open map[string]int
}

// New returns a Limiter that admits up to max connections per host; max of
// zero or less admits any number (they are still counted).
func New(max int) *Limiter {
	return &Limiter{max: max, open: make(map[string]int)}
}

// Max is the cap per host, zero or less for none.
func (l *Limiter) Max() int { return l.max }

// Host is the key a remote address is counted under: its IP, or the whole
// address when it has no port.
func Host(addr net.Addr) string {
	if addr == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return host
}

// Acquire counts one connection from addr. It reports false, and counts
// nothing, when addr's host has max open already; otherwise the caller
// must call release exactly once when the connection closes.
func (l *Limiter) Acquire(addr net.Addr) (release func(), ok bool) {
	host := Host(addr)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.max > 0 && l.open[host] >= l.max {
		return nil, false
	}
	l.open[host]++
	var once sync.Once
	return func() { once.Do(func() { l.release(host) }) }, true
}

func (l *Limiter) release(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[host]--; l.open[host] <= 0 {
		delete(l.open, host)
	}
}

// Open is how many connections from host are open now.
func (l *Limiter) Open(host string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[host]
}

// Listen wraps ln: every connection it accepts counts against its host
// until it is closed, and a connection over the cap is handed to refuse
// (which must close it) instead of being returned.
func Listen(ln net.Listener, l *Limiter, refuse func(net.Conn)) net.Listener {
	return &listener{Listener: ln, limiter: l, refuse: refuse}
}

type listener struct {
	net.Listener
	limiter *Limiter
	refuse  func(net.Conn)
}

func (ln *listener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		release, ok := ln.limiter.Acquire(c.RemoteAddr())
		if !ok {
			ln.refuse(c)
			continue
		}
		return &conn{Conn: c, release: release}, nil
	}
}

// conn gives its count back when closed, however often Close is called.
type conn struct {
	net.Conn
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// CloseWrite half-closes the connection when the wrapped one can, as
// *net.TCPConn does.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// Unwrap returns the wrapped connection.
func (c *conn) Unwrap() net.Conn { return c.Conn }
