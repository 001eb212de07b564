package nomad

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/rpc"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"github.com/roamhq/roam/internal/tlsutil"
	"github.com/roamhq/roam/structs"
)

// errFrameTooLarge ends a connection whose request exceeded the limit.
var errFrameTooLarge = errors.New("rpc request exceeds the frame size limit")

// frameReader counts the bytes one request consumes and fails, for good,
// once they pass the limit: after that the stream cannot be trusted to be
// at a frame boundary, so the connection must end.
type frameReader struct {
	r     *bufio.Reader
	limit int
	n     int
	err   error
}

func (f *frameReader) reset() { f.n = 0 }

func (f *frameReader) Read(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	if room := f.limit - f.n; len(p) > room+1 {
		p = p[:room+1]
	}
	n, err := f.r.Read(p)
	f.n += n
	if f.n > f.limit {
		f.err = fmt.Errorf("%w (%d bytes)", errFrameTooLarge, f.limit)
		return 0, f.err
	}
	return n, err
}

func (f *frameReader) ReadByte() (byte, error) {
	if f.err != nil {
		return 0, f.err
	}
	b, err := f.r.ReadByte()
	if err == nil {
		f.n++
		if f.n > f.limit {
			f.err = fmt.Errorf("%w (%d bytes)", errFrameTooLarge, f.limit)
			return 0, f.err
		}
	}
	return b, err
}

func (f *frameReader) UnreadByte() error {
	if err := f.r.UnreadByte(); err != nil {
		return err
	}
	f.n--
	return nil
}

// serverCodec is a msgpack rpc.ServerCodec that bounds each request, in
// size and in time, and ends the connection on the first undecodable
// frame. Requests read from it carry a context that ends with the
// connection, so a blocking query stops waiting once its caller is gone.
//
// Each header and body is read whole (structs.ReadMsgpackValue) before it
// is decoded, so that one holding more than maxContainers maps and arrays
// is refused before the decoder builds a struct for each of them.
type serverCodec struct {
	conn   io.ReadWriteCloser
	frame  *frameReader
	dec    *codec.Decoder
	enc    *codec.Encoder
	bufW   *bufio.Writer
	failed bool
	// maxContainers bounds the maps and arrays of one header or body;
	// zero means structs.DefaultMsgpackMaxContainers.
	maxContainers int
	// session is the client session the stream belongs to, nil outside
	// one; handed to every request that can hold it (see sessionSetter).
	session any
	// frameTimeout, when set, bounds reading one request (header and
	// body) from its first byte; the wait for that byte is unbounded.
	frameTimeout time.Duration
	// readErr is the error that ended the reading, for the listener's log.
	readErr error
	// guard, when set, is asked about each request's method; a method it
	// refuses is answered with its error and never called.
	guard func(method string) error
	// refusal is guard's answer for the request being read.
	refusal error

	// ctx ends when the connection can take no more requests: its reader
	// failed or it was closed.
	ctx    context.Context
	cancel context.CancelFunc

	// queries, when set, tracks the requests a forwarder named for
	// cancelling (see queryCancels); releases holds, per request sequence
	// number, what stops tracking one once its reply is written.
	queries  *queryCancels
	seq      uint64
	relMu    sync.Mutex
	releases map[uint64]func()

	writeMu   sync.Mutex
	closeOnce sync.Once
}

func newServerCodec(conn io.ReadWriteCloser, maxFrame int) *serverCodec {
	fr := &frameReader{r: bufio.NewReader(conn), limit: maxFrame}
	bw := bufio.NewWriter(conn)
	ctx, cancel := context.WithCancel(context.Background())
	return &serverCodec{
		conn:   conn,
		frame:  fr,
		dec:    codec.NewDecoderBytes(nil, structs.MsgpackHandle),
		enc:    codec.NewEncoder(bw, structs.MsgpackHandle),
		bufW:   bw,
		ctx:    ctx,
		cancel: cancel,
	}
}

// readDeadliner is a connection whose reads can be bounded in time.
type readDeadliner interface{ SetReadDeadline(time.Time) error }

func (c *serverCodec) ReadRequestHeader(r *rpc.Request) error {
	if c.failed {
		// net/rpc keeps reading after a bad body; a stream that failed to
		// decode is no longer at a frame boundary, so end it here.
		c.endReading(io.EOF)
		return io.EOF
	}
	if err := c.awaitFrame(); err != nil {
		c.endReading(err)
		return err
	}
	c.frame.reset()
	if err := c.decode(r); err != nil {
		c.endReading(err)
		return err
	}
	c.seq = r.Seq
	if c.guard != nil {
		c.refusal = c.guard(r.ServiceMethod)
	}
	return nil
}

// decode reads one msgpack value from the frame, then decodes it into v.
func (c *serverCodec) decode(v any) error {
	limit := c.maxContainers
	if limit <= 0 {
		limit = structs.DefaultMsgpackMaxContainers
	}
	buf, err := structs.ReadMsgpackValue(c.frame, nil, limit, c.frame.limit-c.frame.n)
	if structs.IsMsgpackTooLarge(err) {
		return fmt.Errorf("%w (%d bytes): %w", errFrameTooLarge, c.frame.limit, err)
	}
	if err != nil {
		return err
	}
	c.dec.ResetBytes(buf)
	return c.dec.Decode(v)
}

// awaitFrame waits, without a deadline, for the next request's first
// byte, then gives the whole request frameTimeout to arrive: a connection
// may idle between requests, but not stall inside one.
func (c *serverCodec) awaitFrame() error {
	d, ok := c.conn.(readDeadliner)
	if c.frameTimeout <= 0 || !ok {
		return nil
	}
	if err := d.SetReadDeadline(time.Time{}); err != nil {
		return err
	}
	if _, err := c.frame.r.Peek(1); err != nil {
		return err
	}
	return d.SetReadDeadline(time.Now().Add(c.frameTimeout))
}

// endReading records why no more requests will be read, and ends the
// context of those still running.
func (c *serverCodec) endReading(err error) {
	if c.readErr == nil {
		c.readErr = err
	}
	c.cancel()
}

// frameTimedOut reports whether the reading ended on the frame deadline.
func (c *serverCodec) frameTimedOut() bool {
	return c.readErr != nil && errors.Is(c.readErr, os.ErrDeadlineExceeded)
}

func (c *serverCodec) ReadRequestBody(body any) error {
	if refusal := c.refusal; refusal != nil {
		// Read past the body, unlooked at, and answer with the refusal:
		// the RPC server replies with a body read error and goes on.
		c.refusal = nil
		var discard any
		if err := c.decode(&discard); err != nil {
			c.failed = true
			return err
		}
		return refusal
	}
	if body == nil {
		// net/rpc discards the body of an unknown method with a nil target;
		// decode into a throwaway value to stay on the frame boundary.
		var discard any
		if err := c.decode(&discard); err != nil {
			c.failed = true
			return err
		}
		return nil
	}
	if err := c.decode(body); err != nil {
		c.failed = true
		if c.readErr == nil {
			c.readErr = err
		}
		return err
	}
	if cs, ok := body.(contextSetter); ok {
		cs.SetContext(c.requestContext(body))
	}
	if c.session != nil {
		if ss, ok := body.(sessionSetter); ok {
			ss.SetSession(c.session)
		}
	}
	return nil
}

// requestContext is the context a request's wait ends with: the
// connection's, and, for a query its forwarder named, a Status.CancelQuery.
func (c *serverCodec) requestContext(body any) context.Context {
	qc, ok := body.(queryCanceller)
	if c.queries == nil || !ok || qc.QueryCancelID() == "" {
		return c.ctx
	}
	ctx, release := c.queries.track(c.ctx, qc.QueryCancelID())
	c.relMu.Lock()
	defer c.relMu.Unlock()
	if c.releases == nil {
		c.releases = make(map[uint64]func())
	}
	if old := c.releases[c.seq]; old != nil {
		old() // a reused sequence number: the earlier request is done with
	}
	c.releases[c.seq] = release
	return ctx
}

// release stops tracking the request with sequence number seq.
func (c *serverCodec) release(seq uint64) {
	c.relMu.Lock()
	rel := c.releases[seq]
	delete(c.releases, seq)
	c.relMu.Unlock()
	if rel != nil {
		rel()
	}
}

// contextSetter is a request that can carry its caller's context
// (structs.QueryOptions, and what embeds it).
type contextSetter interface{ SetContext(context.Context) }

// sessionSetter is a request that can carry the client session it arrived
// on (structs.WriteRequest and QueryOptions, and what embeds them).
type sessionSetter interface{ SetSession(any) }

func (c *serverCodec) WriteResponse(r *rpc.Response, body any) error {
	c.release(r.Seq)
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := c.enc.Encode(r); err != nil {
		return err
	}
	if err := c.enc.Encode(body); err != nil {
		return err
	}
	return c.bufW.Flush()
}

func (c *serverCodec) Close() error {
	var err error
	c.closeOnce.Do(func() {
		c.cancel()
		c.relMu.Lock()
		releases := c.releases
		c.releases = nil
		c.relMu.Unlock()
		for _, rel := range releases {
			rel()
		}
		err = c.conn.Close()
	})
	return err
}

// raftLayer is Raft's stream layer on the shared RPC port: incoming Raft
// connections are handed over by the RPC listener, outgoing ones announce
// themselves with RPCRaft.
type raftLayer struct {
	addr net.Addr
	// source is the IP outgoing connections leave from (netutil.Dialer).
	source string
	// tls, when it wraps RPC, is used for every outgoing connection.
	tls *tlsutil.Configurator
	// dialFn, when set, replaces the TCP dial (Config.Dial).
	dialFn  func(ctx context.Context, addr string) (net.Conn, error)
	connCh  chan net.Conn
	closeCh chan struct{}
	once    sync.Once
	// ctx ends with Close, and with it the dials under way.
	ctx    context.Context
	cancel context.CancelFunc
	// handedOff counts the connections given to Raft.
	handedOff atomic.Int64

	// links holds the outgoing connections Raft has not closed, by peer
	// address (keepRaftLinks); linksClosed is set by Close, after which
	// Dial keeps no connection.
	linksMu     sync.Mutex
	links       map[raft.ServerAddress]map[*raftConn]struct{}
	linksClosed bool
}

var errRaftLayerClosed = errors.New("raft layer closed")

func newRaftLayer(addr net.Addr, source string, tlsConf *tlsutil.Configurator) *raftLayer {
	ctx, cancel := context.WithCancel(context.Background())
	return &raftLayer{
		addr: addr, source: source, tls: tlsConf,
		connCh: make(chan net.Conn), closeCh: make(chan struct{}),
		ctx: ctx, cancel: cancel,
		links: make(map[raft.ServerAddress]map[*raftConn]struct{}),
	}
}

// handoff passes an accepted Raft connection to Raft, or closes it if the
// layer is closed.
func (l *raftLayer) handoff(c net.Conn) {
	select {
	case l.connCh <- c:
		l.handedOff.Add(1)
	case <-l.closeCh:
		c.Close()
	}
}

func (l *raftLayer) Accept() (net.Conn, error) {
	select {
	case c := <-l.connCh:
		return c, nil
	case <-l.closeCh:
		return nil, errRaftLayerClosed
	}
}

// Close stops accepting, cancels the dials under way and closes the
// outgoing connections, so that no request waits out its timeout on them.
func (l *raftLayer) Close() error {
	l.once.Do(func() {
		close(l.closeCh)
		l.cancel()
		l.linksMu.Lock()
		l.linksClosed = true
		var conns []*raftConn
		for _, set := range l.links {
			for c := range set {
				conns = append(conns, c)
			}
		}
		l.linksMu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return nil
}

func (l *raftLayer) Addr() net.Addr { return l.addr }

// Dial opens a Raft connection to address, which stays usable after the
// peer closes it (raftConn).
func (l *raftLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if l.ctx.Err() != nil {
		return nil, errRaftLayerClosed
	}
	dial := func() (net.Conn, net.Conn, error) { return l.dial(address, timeout) }
	conn, raw, err := dial()
	if err != nil {
		return nil, err
	}
	c := &raftConn{dial: dial, conn: conn, raw: raw, onClose: l.forget(address)}
	l.linksMu.Lock()
	if l.linksClosed {
		l.linksMu.Unlock()
		conn.Close()
		return nil, errRaftLayerClosed
	}
	if l.links[address] == nil {
		l.links[address] = make(map[*raftConn]struct{})
	}
	l.links[address][c] = struct{}{}
	l.linksMu.Unlock()
	return c, nil
}

// forget returns what removes a closed connection to address from links.
func (l *raftLayer) forget(address raft.ServerAddress) func(*raftConn) {
	return func(c *raftConn) {
		l.linksMu.Lock()
		defer l.linksMu.Unlock()
		delete(l.links[address], c)
		if len(l.links[address]) == 0 {
			delete(l.links, address)
		}
	}
}

// linked reports whether Raft holds a connection to address whose peer
// has not closed it.
func (l *raftLayer) linked(address raft.ServerAddress) bool {
	l.linksMu.Lock()
	conns := make([]*raftConn, 0, len(l.links[address]))
	for c := range l.links[address] {
		conns = append(conns, c)
	}
	l.linksMu.Unlock()
	for _, c := range conns {
		if !c.closedByPeer() {
			return true
		}
	}
	return false
}

// dial opens a connection to address that announces itself as Raft, and
// returns it with the TCP socket under it.
func (l *raftLayer) dial(address raft.ServerAddress, timeout time.Duration) (conn, raw net.Conn, err error) {
	raw, err = dialServer(l.ctx, l.dialFn, l.source, string(address), timeout)
	if err != nil {
		return nil, nil, err
	}
	conn = raw
	if l.tls.RPC() {
		conn, err = tlsutil.WrapClient(raw, structs.RPCTLS, l.tls.OutgoingRPCConfig(), timeout)
		if err != nil {
			return nil, nil, err
		}
	}
	if _, err := conn.Write([]byte{structs.RPCRaft}); err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, raw, nil
}
