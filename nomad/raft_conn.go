package nomad

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// raftConn is an outgoing Raft connection that does not carry a request
// into a connection its peer has closed.
//
// Raft's network transport keeps idle connections in a pool and takes one
// for each request. A pooled connection whose peer has restarted since
// fails the request it is taken for: a vote asked that way is lost, and a
// candidate that cannot get a majority without it waits out a whole
// election timeout before it asks again. Before writing a new request,
// raftConn looks at the socket without reading from it; if the peer has
// closed it, or bytes wait on it that no request asked for (over TLS, the
// alert a peer sends as it closes), raftConn dials again and writes the
// request on the new connection, as the transport itself would have with
// an empty pool.
//
// The transport uses a connection for one request at a time: it writes a
// request, then reads the whole answer. A Write after a Read therefore
// starts a request, and nothing of the previous one is left in flight.
type raftConn struct {
	// dial opens a new connection to the same peer, ready for a request;
	// raw is the socket under it, which lookAt looks at (nil when the
	// dialer gave none).
	dial func() (conn, raw net.Conn, err error)
	// onClose is called once, when the transport closes the connection.
	onClose func(*raftConn)

	mu   sync.Mutex
	conn net.Conn
	raw  net.Conn
	// answered is set once an answer was read on conn: until then bytes
	// may wait that the TLS layer reads itself (session tickets), and a
	// connection just dialed is not worth looking at.
	answered bool
	writing  bool // a request is being written; its answer not yet read
	closed   bool
	// The deadlines the transport set last, which a new connection gets
	// too: the transport sets them before it writes a request.
	readDeadline, writeDeadline time.Time

	// redials counts the connections replaced because the peer had
	// closed them.
	redials atomic.Int64
}

// peerState is what a look at an idle socket tells.
type peerState int

const (
	peerOpen    peerState = iota // nothing to read, not closed
	peerClosed                   // the peer closed it, or it failed
	peerPending                  // bytes wait that no request asked for
)

// Write writes b, first replacing the connection if this starts a request
// and the peer has closed the one held.
func (c *raftConn) Write(b []byte) (int, error) {
	conn, err := c.requestConn()
	if err != nil {
		return 0, err
	}
	return conn.Write(b)
}

// requestConn returns the connection to write on.
func (c *raftConn) requestConn() (net.Conn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, net.ErrClosed
	}
	conn, raw := c.conn, c.raw
	check := !c.writing && c.answered
	c.writing = true
	c.mu.Unlock()
	if !check || lookAt(raw) == peerOpen {
		return conn, nil
	}

	fresh, freshRaw, err := c.dial()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		if fresh != nil {
			fresh.Close()
		}
		return nil, net.ErrClosed
	}
	if err != nil {
		return nil, err
	}
	if err := errors.Join(fresh.SetReadDeadline(c.readDeadline), fresh.SetWriteDeadline(c.writeDeadline)); err != nil {
		fresh.Close()
		return nil, err
	}
	c.conn.Close()
	c.conn, c.raw, c.answered = fresh, freshRaw, false
	c.redials.Add(1)
	return fresh, nil
}

// closedByPeer reports whether the peer has closed the connection, for a
// caller that does not use it (keepRaftLinks). Bytes waiting may be an
// answer being read, so only the socket's state counts.
func (c *raftConn) closedByPeer() bool {
	c.mu.Lock()
	raw, closed := c.raw, c.closed
	c.mu.Unlock()
	if closed {
		return true
	}
	gone := false
	if !onSocket(raw, func(fd uintptr) { gone = peerHasClosed(fd) }) {
		return true
	}
	return gone
}

func (c *raftConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	conn := c.conn
	c.writing = false
	c.mu.Unlock()
	n, err := conn.Read(b)
	if n > 0 {
		c.mu.Lock()
		if c.conn == conn {
			c.answered = true
		}
		c.mu.Unlock()
	}
	return n, err
}

func (c *raftConn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	conn := c.conn
	c.mu.Unlock()
	if c.onClose != nil {
		c.onClose(c)
	}
	return conn.Close()
}

func (c *raftConn) current() net.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}

func (c *raftConn) LocalAddr() net.Addr  { return c.current().LocalAddr() }
func (c *raftConn) RemoteAddr() net.Addr { return c.current().RemoteAddr() }

func (c *raftConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDeadline, c.writeDeadline = t, t
	return c.conn.SetDeadline(t)
}

func (c *raftConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDeadline = t
	return c.conn.SetReadDeadline(t)
}

func (c *raftConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writeDeadline = t
	return c.conn.SetWriteDeadline(t)
}

// lookAt tells, without reading anything, whether raw's peer has closed
// it or bytes wait on it: one non-blocking peek, which is all a request
// needs, since it redials on either. A socket it cannot look at counts as
// open.
func lookAt(raw net.Conn) peerState {
	state := peerOpen
	if !onSocket(raw, func(fd uintptr) { state = peek(fd) }) {
		return peerClosed
	}
	return state
}

// onSocket runs f on raw's descriptor, neither waiting for a Read under way
// nor minding the deadlines. It reports false if the socket is closed; a
// connection with no socket to look at (f not run) reports true.
func onSocket(raw net.Conn, f func(fd uintptr)) bool {
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	return rc.Control(f) == nil
}
