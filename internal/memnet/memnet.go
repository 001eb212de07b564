// Package memnet is an in-process network of named listeners joined by
// in-memory connections, for tests that run several agents in one process
// and need to cut the links between them.
//
// A link is directed: Cut(from, to) makes every dial from `from` to `to`
// fail and closes the connections `from` already opened to `to`, while `to`
// can still dial `from` and get answers back on its own connections. That
// is the same one-way model as hashicorp/raft's InmemTransport Disconnect,
// so a test can cut Raft and RPC together and get one consistent picture.
// Cut both directions for a full partition.
package memnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// ErrRefused is returned by a dial to an address that has no listener, or
// over a link that is cut.
var ErrRefused = errors.New("memnet: connection refused")

// ErrClosed is returned by Accept on a closed listener.
var ErrClosed = errors.New("memnet: listener closed")

// Network is a set of listeners and the links between them. The zero value
// is not usable; call New.
type Network struct {
	// mu guards every field below.
	mu        sync.Mutex
	listeners map[string]*Listener
	cut       map[link]bool
	// conns are the open connections per link, each kept by its dialing
	// end so a Cut can close them.
	conns map[link]map[*conn]struct{}
}

// link is a direction: from the dialer's address to the listener's.
type link struct{ from, to string }

// New returns an empty network.
func New() *Network {
	return &Network{
		listeners: make(map[string]*Listener),
		cut:       make(map[link]bool),
		conns:     make(map[link]map[*conn]struct{}),
	}
}

// Listen binds addr, which must be a host:port not yet bound on this
// network. The address is a name only; nothing touches the kernel.
func (n *Network) Listen(addr string) (*Listener, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("memnet: listen on %q: %w", addr, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.listeners[addr]; ok {
		return nil, fmt.Errorf("memnet: listen on %q: address in use", addr)
	}
	l := &Listener{net: n, addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
	n.listeners[addr] = l
	return l, nil
}

// Dialer returns a dial function whose connections leave from the address
// from (normally the dialer's own listening address, so that links are
// named by the two agents' addresses).
func (n *Network) Dialer(from string) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		return n.dial(ctx, from, addr)
	}
}

func (n *Network) dial(ctx context.Context, from, to string) (net.Conn, error) {
	lk := link{from: from, to: to}
	n.mu.Lock()
	l := n.listeners[to]
	refused := l == nil || n.cut[lk]
	n.mu.Unlock()
	if refused {
		return nil, fmt.Errorf("dial %s from %s: %w", to, from, ErrRefused)
	}

	a, b := net.Pipe()
	local := &conn{Conn: a, local: addr(from), remote: addr(to)}
	remote := &conn{Conn: b, local: addr(to), remote: addr(from)}
	select {
	case l.ch <- remote:
	case <-l.done:
		a.Close()
		b.Close()
		return nil, fmt.Errorf("dial %s from %s: %w", to, from, ErrRefused)
	case <-ctx.Done():
		a.Close()
		b.Close()
		return nil, fmt.Errorf("dial %s from %s: %w", to, from, ctx.Err())
	}

	n.mu.Lock()
	defer n.mu.Unlock()
	// The link may have been cut while the listener took the connection.
	if n.cut[lk] {
		a.Close()
		b.Close()
		return nil, fmt.Errorf("dial %s from %s: %w", to, from, ErrRefused)
	}
	set := n.conns[lk]
	if set == nil {
		set = make(map[*conn]struct{})
		n.conns[lk] = set
	}
	set[local] = struct{}{}
	local.peer = remote
	local.forget = func() {
		n.mu.Lock()
		delete(n.conns[lk], local)
		n.mu.Unlock()
	}
	return local, nil
}

// Cut stops traffic from `from` to `to`: new dials fail with ErrRefused and
// the connections `from` opened to `to` are closed at both ends.
// Connections `to` opened to `from` are left alone.
func (n *Network) Cut(from, to string) {
	lk := link{from: from, to: to}
	n.mu.Lock()
	n.cut[lk] = true
	open := n.conns[lk]
	delete(n.conns, lk)
	n.mu.Unlock()
	for c := range open {
		c.closeBoth()
	}
}

// Heal restores the link from `from` to `to`.
func (n *Network) Heal(from, to string) {
	n.mu.Lock()
	delete(n.cut, link{from: from, to: to})
	n.mu.Unlock()
}

// HealAll restores every link.
func (n *Network) HealAll() {
	n.mu.Lock()
	clear(n.cut)
	n.mu.Unlock()
}

// Listener accepts the connections dialed to its address.
type Listener struct {
	net  *Network
	addr string
	ch   chan net.Conn
	once sync.Once
	done chan struct{}
}

var _ net.Listener = (*Listener)(nil)

// Accept waits for the next connection.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, ErrClosed
	}
}

// Close unbinds the address; dials to it fail from now on. Connections
// already accepted stay open.
func (l *Listener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.net.mu.Lock()
		if l.net.listeners[l.addr] == l {
			delete(l.net.listeners, l.addr)
		}
		l.net.mu.Unlock()
	})
	return nil
}

// Addr is the bound address.
func (l *Listener) Addr() net.Addr { return addr(l.addr) }

// conn is one end of a pipe with the agents' addresses on it.
type conn struct {
	net.Conn
	local, remote addr
	// peer and forget are set on the dialing end only.
	peer   *conn
	forget func()
	once   sync.Once
}

func (c *conn) LocalAddr() net.Addr  { return c.local }
func (c *conn) RemoteAddr() net.Addr { return c.remote }

func (c *conn) Close() error {
	c.once.Do(func() {
		if c.forget != nil {
			c.forget()
		}
	})
	return c.Conn.Close()
}

// closeBoth closes this end and its peer, as a cut link does.
func (c *conn) closeBoth() {
	c.Conn.Close()
	if c.peer != nil {
		c.peer.Conn.Close()
	}
}

// addr is a host:port on a memnet network. Its Network is "tcp" so that
// code which reads the IP out of a remote address (per-IP connection
// limits, logs) treats it like a TCP peer.
type addr string

func (a addr) Network() string { return "tcp" }
func (a addr) String() string  { return string(a) }
