package nomad

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
)

// A connection may sit idle between frames for as long as its peer likes
// (Raft keeps pooled connections, a client keeps its session), but once a
// frame's first byte arrives the whole frame must arrive within the frame
// timeout. Raft's transport and yamux read their connections themselves,
// with no deadline of their own on the receiving side, so frameConn
// follows their framing as the bytes pass and sets the deadline for them.

// scanState is where a stream stands after a chunk of it.
type scanState struct {
	// inFrame: the chunk ended inside a frame.
	inFrame bool
	// restart: a frame (or a slow part of one, such as a Raft snapshot's
	// data) began within the chunk, so its deadline starts now.
	restart bool
	// scale is how many frame timeouts that part may take, at least 1.
	scale int64
}

// frameScanner follows a stream's framing without buffering its bytes.
type frameScanner interface {
	// scan consumes the next bytes of the stream. An error means the
	// bytes cannot be framed; the reader will fail on them too.
	scan(p []byte) (scanState, error)
}

// frameConn is a connection whose reads are bounded per frame.
type frameConn struct {
	net.Conn
	scanner frameScanner
	timeout time.Duration
	// onTimeout is called once, when a read first fails on the deadline.
	onTimeout func()

	// Reads come from one goroutine (the protocol's reader); these need
	// no lock.
	deadlineSet bool
	broken      bool
	// fresh: a frame began at the end of the last chunk, and its deadline
	// starts over at the next read. The reader may have gone off to serve
	// the frames before it (Raft answers one request at a time, while its
	// leader pipelines the next), and the frame must not be charged for
	// that.
	fresh    bool
	scale    int64
	timedOut sync.Once
}

func newFrameConn(c net.Conn, s frameScanner, timeout time.Duration, onTimeout func()) *frameConn {
	return &frameConn{Conn: c, scanner: s, timeout: timeout, onTimeout: onTimeout}
}

// maxFrameDeadline bounds the deadline of one frame however large it
// claims to be.
const maxFrameDeadline = time.Hour

func (c *frameConn) Read(p []byte) (int, error) {
	if c.fresh {
		c.fresh = false
		c.setDeadline(time.Now().Add(scaleTimeout(c.timeout, c.scale)))
	}
	n, err := c.Conn.Read(p)
	if n > 0 && !c.broken {
		st, serr := c.scanner.scan(p[:n])
		switch {
		case serr != nil:
			// Out of step with the stream for good: the connection gets one
			// more frame timeout, whatever the reader makes of the bytes.
			c.broken, c.fresh = true, false
			c.setDeadline(time.Now().Add(c.timeout))
		case !st.inFrame:
			c.fresh = false
			if c.deadlineSet {
				c.setDeadline(time.Time{})
			}
		case st.restart:
			c.fresh, c.scale = true, st.scale
			c.setDeadline(time.Now().Add(scaleTimeout(c.timeout, st.scale)))
		}
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && c.onTimeout != nil {
		c.timedOut.Do(c.onTimeout)
	}
	return n, err
}

func (c *frameConn) setDeadline(t time.Time) {
	_ = c.Conn.SetReadDeadline(t)
	c.deadlineSet = !t.IsZero()
}

// scaleTimeout is d times scale, at most maxFrameDeadline.
func scaleTimeout(d time.Duration, scale int64) time.Duration {
	if scale <= 1 {
		return min(d, maxFrameDeadline)
	}
	if d > 0 && scale > int64(maxFrameDeadline/d) {
		return maxFrameDeadline
	}
	return d * time.Duration(scale)
}

// yamuxScanner follows yamux frames: a 12-byte header (version, type,
// flags, stream ID, length), then for a data frame length bytes of
// payload. Other frame types carry a value in the length field and no
// payload.
type yamuxScanner struct {
	hdr     [12]byte
	have    int
	payload uint32
}

const yamuxTypeData = 0

func (y *yamuxScanner) scan(p []byte) (scanState, error) {
	st := scanState{scale: 1}
	for len(p) > 0 {
		if y.payload > 0 {
			k := uint32(min(uint64(len(p)), uint64(y.payload)))
			y.payload -= k
			p = p[k:]
			continue
		}
		if y.have == 0 {
			st.restart = true
		}
		k := copy(y.hdr[y.have:], p)
		y.have += k
		p = p[k:]
		if y.have == len(y.hdr) {
			y.have = 0
			if y.hdr[1] == yamuxTypeData {
				y.payload = binary.BigEndian.Uint32(y.hdr[8:12])
			}
		}
	}
	st.inFrame = y.have > 0 || y.payload > 0
	return st, nil
}

// Raft's transport frames a request as one type byte and one msgpack
// value; an InstallSnapshot request is followed by the snapshot's bytes,
// as many as the request's Size says.
const (
	raftRPCInstallSnapshot = 2
	// raftTimeoutScale is how many snapshot bytes earn one more frame
	// timeout, as the sending transport scales its own deadline
	// (raft.DefaultTimeoutScale).
	raftTimeoutScale = raft.DefaultTimeoutScale
	// maxSnapshotRequest bounds the InstallSnapshot request kept to read
	// its Size; the request holds a few IDs and the configuration.
	maxSnapshotRequest = 1 << 20
)

type raftPhase int

const (
	raftBetween  raftPhase = iota // before a frame's type byte
	raftValue                     // inside the request
	raftSnapshot                  // inside a snapshot's data
)

type raftScanner struct {
	phase   raftPhase
	rpcType byte
	value   msgpackSkipper
	// snapReq collects an InstallSnapshot request, to learn its Size.
	snapReq  []byte
	snapLeft int64
}

func (r *raftScanner) scan(p []byte) (scanState, error) {
	st := scanState{scale: 1}
	for len(p) > 0 {
		switch r.phase {
		case raftBetween:
			r.rpcType = p[0]
			p = p[1:]
			r.value.start()
			r.snapReq = r.snapReq[:0]
			r.phase = raftValue
			st.restart, st.scale = true, 1
		case raftValue:
			n, err := r.value.feed(p)
			if r.rpcType == raftRPCInstallSnapshot {
				if len(r.snapReq)+n > maxSnapshotRequest {
					return st, fmt.Errorf("raft snapshot request over %d bytes", maxSnapshotRequest)
				}
				r.snapReq = append(r.snapReq, p[:n]...)
			}
			p = p[n:]
			if err != nil {
				return st, err
			}
			if !r.value.done() {
				continue
			}
			r.phase = raftBetween
			if r.rpcType != raftRPCInstallSnapshot {
				continue
			}
			size, err := snapshotSize(r.snapReq)
			if err != nil {
				return st, err
			}
			if size > 0 {
				r.phase, r.snapLeft = raftSnapshot, size
				st.restart, st.scale = true, max(1, size/raftTimeoutScale)
			}
		case raftSnapshot:
			k := min(int64(len(p)), r.snapLeft)
			r.snapLeft -= k
			p = p[k:]
			if r.snapLeft == 0 {
				r.phase = raftBetween
			}
		}
	}
	st.inFrame = r.phase != raftBetween
	return st, nil
}

// snapshotSize reads the Size of an encoded InstallSnapshot request, with
// the handle Raft's transport decodes it with.
func snapshotSize(buf []byte) (int64, error) {
	var req struct{ Size int64 }
	if err := codec.NewDecoderBytes(buf, &codec.MsgpackHandle{}).Decode(&req); err != nil {
		return 0, fmt.Errorf("raft snapshot request: %w", err)
	}
	return max(req.Size, 0), nil
}

// msgpackSkipper follows one msgpack value through its bytes without
// decoding it. It keeps only a count of the values still to come, so
// deep nesting costs nothing.
type msgpackSkipper struct {
	// pending counts the values still to read, the current one included;
	// zero once the value is complete.
	pending uint64
	// field collects a multi-byte length or count that follows a header.
	field     [4]byte
	fieldLen  int
	fieldHave int
	fieldKind fieldKind
	// skip counts payload bytes to pass before the current value ends.
	skip uint64
}

type fieldKind int

const (
	fieldPayload    fieldKind = iota // a byte length (str, bin)
	fieldExtPayload                  // a byte length, plus the ext type byte
	fieldElems                       // an array's element count
	fieldPairs                       // a map's pair count
)

// maxPending saturates the count of values to come: no stream is long
// enough to tell the difference, and the deadline ends it first.
const maxPending = math.MaxUint64 / 4

var errMsgpackNeverUsed = errors.New("msgpack byte 0xc1 is never used")

func (m *msgpackSkipper) start()     { *m = msgpackSkipper{pending: 1} }
func (m *msgpackSkipper) done() bool { return m.pending == 0 }

// feed consumes bytes of the value and returns how many it used: all of p,
// or fewer when the value ended inside p.
func (m *msgpackSkipper) feed(p []byte) (int, error) {
	i := 0
	for i < len(p) && m.pending > 0 {
		switch {
		case m.skip > 0:
			k := min(uint64(len(p)-i), m.skip)
			m.skip -= k
			i += int(k)
			if m.skip == 0 {
				m.pending--
			}
		case m.fieldLen > 0:
			k := copy(m.field[m.fieldHave:m.fieldLen], p[i:])
			m.fieldHave += k
			i += k
			if m.fieldHave == m.fieldLen {
				var n uint64
				for _, b := range m.field[:m.fieldLen] {
					n = n<<8 | uint64(b)
				}
				m.fieldLen, m.fieldHave = 0, 0
				switch m.fieldKind {
				case fieldPayload:
					m.payload(n)
				case fieldExtPayload:
					m.payload(n + 1)
				case fieldElems:
					m.children(n)
				case fieldPairs:
					m.children(2 * n)
				}
			}
		default:
			b := p[i]
			i++
			if err := m.header(b); err != nil {
				return i, err
			}
		}
	}
	return i, nil
}

// header reads a value's first byte.
func (m *msgpackSkipper) header(b byte) error {
	switch {
	case b <= 0x7f, b >= 0xe0, b == 0xc0, b == 0xc2, b == 0xc3:
		m.pending-- // fixint, nil, bool
	case b <= 0x8f:
		m.children(2 * uint64(b&0x0f)) // fixmap
	case b <= 0x9f:
		m.children(uint64(b & 0x0f)) // fixarray
	case b <= 0xbf:
		m.payload(uint64(b & 0x1f)) // fixstr
	case b == 0xc1:
		return errMsgpackNeverUsed
	case b >= 0xc4 && b <= 0xc6: // bin 8/16/32
		m.collect(1<<(b-0xc4), fieldPayload)
	case b >= 0xc7 && b <= 0xc9: // ext 8/16/32
		m.collect(1<<(b-0xc7), fieldExtPayload)
	case b == 0xca:
		m.payload(4) // float32
	case b == 0xcb:
		m.payload(8) // float64
	case b >= 0xcc && b <= 0xcf: // uint 8/16/32/64
		m.payload(1 << (b - 0xcc))
	case b >= 0xd0 && b <= 0xd3: // int 8/16/32/64
		m.payload(1 << (b - 0xd0))
	case b >= 0xd4 && b <= 0xd8: // fixext 1/2/4/8/16, plus the type byte
		m.payload(1<<(b-0xd4) + 1)
	case b >= 0xd9 && b <= 0xdb: // str 8/16/32
		m.collect(1<<(b-0xd9), fieldPayload)
	case b == 0xdc || b == 0xdd: // array 16/32
		m.collect(2<<(b-0xdc), fieldElems)
	case b == 0xde || b == 0xdf: // map 16/32
		m.collect(2<<(b-0xde), fieldPairs)
	}
	return nil
}

func (m *msgpackSkipper) collect(n int, kind fieldKind) {
	m.fieldLen, m.fieldKind = n, kind
}

// payload ends the current value after n more bytes.
func (m *msgpackSkipper) payload(n uint64) {
	if n == 0 {
		m.pending--
		return
	}
	m.skip = n
}

// children replaces the current value with the n values it contains.
func (m *msgpackSkipper) children(n uint64) {
	m.pending--
	if n > maxPending-m.pending {
		m.pending = maxPending
		return
	}
	m.pending += n
}
