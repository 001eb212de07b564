package nomad

import (
	"net"
	"time"
)

// raftGateMax bounds the bytes of a Raft connection's first frame that are
// held before the connection goes to Raft. Past it the peer is sending a
// large frame at speed, as a server replicating does, and Raft reads the
// rest under the frame timeout as usual.
const raftGateMax = 64 << 10

// awaitRaftFrame holds a new Raft connection until its first frame has
// arrived whole (or raftGateMax bytes of it), and returns a connection that
// gives Raft those bytes first.
//
// Raft's transport serves each connection it is handed with a goroutine,
// a 256 KiB read buffer, a write buffer and a decoder, all built before it
// reads a byte. Handing over every connection that names the Raft
// protocol let each peer that sends a frame's first bytes and stalls (a
// scanner, or the storm's partial frames) cost that for the whole frame
// timeout, and a new one the moment it was cut. Held here, it costs a
// small buffer until the frame timeout closes it.
//
// As between frames, the wait for the first frame's first byte has no
// deadline (a peer may open a connection before it has anything to send);
// from that byte on the whole frame has timeout, when timeout is positive.
func awaitRaftFrame(conn net.Conn, timeout time.Duration) (net.Conn, error) {
	var sc raftScanner
	buf := make([]byte, 512)
	n := 0
	for {
		if n == len(buf) {
			buf = append(buf, make([]byte, min(len(buf), raftGateMax-len(buf)))...)
		}
		k, err := conn.Read(buf[n:])
		if k > 0 {
			if n == 0 && timeout > 0 {
				if err := conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
					return nil, err
				}
			}
			st, serr := sc.scan(buf[n : n+k])
			n += k
			// A stream the scanner cannot frame goes to Raft as it did
			// before: its decoder fails on the same bytes, and frameConn
			// bounds what is left.
			if serr != nil || !st.inFrame || n >= raftGateMax {
				break
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if err := conn.SetReadDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return &replayConn{Conn: conn, pending: buf[:n]}, nil
}

// replayConn reads pending before reading from its connection.
type replayConn struct {
	net.Conn
	pending []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 {
			c.pending = nil // let the buffer go
		}
		return n, nil
	}
	return c.Conn.Read(p)
}
