package structs

import (
	"bufio"
	"io"
	"net/rpc"
	"sync"

	"github.com/hashicorp/go-msgpack/v2/codec"
)

// clientCodec is the calling side of a msgpack RPC connection whose protocol
// byte has been written. net/rpc reads from one goroutine and writes from
// many; Close may race with both, so it only closes the connection, which
// ends any read in progress.
type clientCodec struct {
	conn io.ReadWriteCloser
	dec  *codec.Decoder
	enc  *codec.Encoder
	bufW *bufio.Writer

	writeMu   sync.Mutex
	closeOnce sync.Once
	closeErr  error
}

// NewClientCodec returns an rpc.ClientCodec speaking msgpack over conn.
func NewClientCodec(conn io.ReadWriteCloser) rpc.ClientCodec {
	bw := bufio.NewWriter(conn)
	return &clientCodec{
		conn: conn,
		dec:  codec.NewDecoder(bufio.NewReader(conn), MsgpackHandle),
		enc:  codec.NewEncoder(bw, MsgpackHandle),
		bufW: bw,
	}
}

func (c *clientCodec) WriteRequest(r *rpc.Request, body any) error {
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

func (c *clientCodec) ReadResponseHeader(r *rpc.Response) error { return c.dec.Decode(r) }

func (c *clientCodec) ReadResponseBody(body any) error {
	if body == nil {
		var discard any
		return c.dec.Decode(&discard)
	}
	return c.dec.Decode(body)
}

func (c *clientCodec) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.conn.Close() })
	return c.closeErr
}

// serverCodec is the answering side of a msgpack RPC stream whose protocol
// byte has been read: clients use it to serve the calls a server opens on
// their session. net/rpc reads from one goroutine and writes replies from
// many.
type serverCodec struct {
	conn io.ReadWriteCloser
	dec  *codec.Decoder
	enc  *codec.Encoder
	bufW *bufio.Writer
	// failed is set, by the reading goroutine only, once a body failed to
	// decode: the stream is then no longer at a frame boundary.
	failed bool

	writeMu   sync.Mutex
	closeOnce sync.Once
	closeErr  error
}

// NewServerCodec returns an rpc.ServerCodec speaking msgpack over conn. A
// request whose body does not decode ends the stream after its error reply,
// since what follows cannot be trusted to start a new request.
func NewServerCodec(conn io.ReadWriteCloser) rpc.ServerCodec {
	bw := bufio.NewWriter(conn)
	return &serverCodec{
		conn: conn,
		dec:  codec.NewDecoder(bufio.NewReader(conn), MsgpackHandle),
		enc:  codec.NewEncoder(bw, MsgpackHandle),
		bufW: bw,
	}
}

func (c *serverCodec) ReadRequestHeader(r *rpc.Request) error {
	if c.failed {
		return io.EOF
	}
	return c.dec.Decode(r)
}

func (c *serverCodec) ReadRequestBody(body any) error {
	var err error
	if body == nil {
		// An unknown method: read past its body to stay on the boundary.
		var discard any
		err = c.dec.Decode(&discard)
	} else {
		err = c.dec.Decode(body)
	}
	if err != nil {
		c.failed = true
	}
	return err
}

func (c *serverCodec) WriteResponse(r *rpc.Response, body any) error {
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
	c.closeOnce.Do(func() { c.closeErr = c.conn.Close() })
	return c.closeErr
}
