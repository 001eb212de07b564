package client

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/roamhq/roam/structs"
)

// Server-to-client RPC. A server calls this client by opening a stream on
// the client's session; the stream starts with a protocol byte (only
// structs.RPCNomad is served) and then carries msgpack net/rpc calls to the
// services registered with RegisterRPC.

// streamHandshakeTimeout bounds the wait for a new stream's protocol byte.
const streamHandshakeTimeout = 5 * time.Second

// RegisterRPC makes svc's methods callable by servers as name.Method, with
// the net/rpc method shape. Services may be registered at any time.
func (c *Client) RegisterRPC(name string, svc any) error {
	if err := c.rpcServer.RegisterName(name, svc); err != nil {
		return fmt.Errorf("client: register rpc service %s: %w", name, err)
	}
	return nil
}

// newClientRPCServer returns the RPC server with the client's built-in
// services. It answers a failed call with the error's sentinel codes, so
// the server that called gets back what the handler meant (a CSI plugin's
// answer, a missing plugin) and not only its text.
func newClientRPCServer(c *Client) (*structs.RPCServer, error) {
	srv := structs.NewRPCServer()
	if err := srv.RegisterName("ClientStatus", &ClientStatus{c: c}); err != nil {
		return nil, fmt.Errorf("client: register ClientStatus: %w", err)
	}
	if err := srv.RegisterName("ClientAllocs", &ClientAllocs{c: c}); err != nil {
		return nil, fmt.Errorf("client: register ClientAllocs: %w", err)
	}
	return srv, nil
}

// serveServerStreamsLocked starts serving the streams servers open on conn's
// session until it closes. c.mu must be held, so the goroutine is counted
// before Shutdown waits.
func (c *Client) serveServerStreamsLocked(conn *serverConn) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.acceptStreams(conn.session)
	}()
}

// acceptStreams serves each stream opened on session in its own goroutine,
// and returns once the session has closed and every stream is done.
func (c *Client) acceptStreams(session *yamux.Session) {
	for {
		stream, err := session.Accept()
		if err != nil {
			if !errors.Is(err, yamux.ErrSessionShutdown) && c.shutdownCtx.Err() == nil {
				c.logger.Debug("server session stopped accepting streams", "error", err)
			}
			return
		}
		// Counted while this goroutine is: Shutdown's Wait cannot have
		// passed zero yet.
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.serveStream(stream)
		}()
	}
}

// serveStream reads the stream's protocol byte and serves its calls until
// the server closes it or the session ends.
func (c *Client) serveStream(stream net.Conn) {
	var b [1]byte
	_ = stream.SetReadDeadline(time.Now().Add(streamHandshakeTimeout))
	if _, err := stream.Read(b[:]); err != nil {
		stream.Close()
		return
	}
	_ = stream.SetReadDeadline(time.Time{})
	if b[0] != structs.RPCNomad {
		c.logger.Warn("server opened a stream with an unknown protocol byte; closing it",
			"byte", fmt.Sprintf("0x%02x", b[0]))
		stream.Close()
		return
	}
	// ServeCodec returns once the stream ends and in-flight calls replied,
	// and closes the stream.
	c.rpcServer.ServeCodec(structs.NewServerCodec(stream))
}

// ClientStatus answers servers' liveness checks of this client.
type ClientStatus struct {
	c *Client
}

// Ping answers with this node's ID.
func (s *ClientStatus) Ping(args *structs.GenericRequest, reply *structs.ClientStatusPingResponse) error {
	reply.NodeID = s.c.NodeID()
	return nil
}
