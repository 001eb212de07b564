package nomad

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/rpc"
	"sync"
	"time"

	"github.com/roamhq/roam/internal/netutil"
	"github.com/roamhq/roam/internal/tlsutil"
	"github.com/roamhq/roam/structs"
)

// connPool keeps one multiplexing RPC client per server address for
// server-to-server calls (forwarding, joining). net/rpc matches replies to
// calls by sequence number, so concurrent calls share one connection.
type connPool struct {
	dialTimeout time.Duration
	// source is the IP connections leave from (see netutil.Dialer).
	source string
	// tls, when it wraps RPC, is used for every connection.
	tls *tlsutil.Configurator
	// dialFn, when set, replaces the TCP dial (Config.Dial).
	dialFn func(ctx context.Context, addr string) (net.Conn, error)

	mu       sync.Mutex
	clients  map[string]*rpc.Client
	shutdown bool
}

func newConnPool(dialTimeout time.Duration, source string, tlsConf *tlsutil.Configurator,
	dialFn func(ctx context.Context, addr string) (net.Conn, error)) *connPool {
	return &connPool{
		dialTimeout: dialTimeout,
		source:      source,
		tls:         tlsConf,
		dialFn:      dialFn,
		clients:     make(map[string]*rpc.Client),
	}
}

// errDial marks a failure to reach the server at all: nothing was sent, so
// the call is safe to retry anywhere.
var errDial = errors.New("dial failed")

// errConnLost marks a connection that broke after the call was sent: the
// call may or may not have run.
var errConnLost = errors.New("connection lost")

func (p *connPool) get(addr string) (*rpc.Client, error) {
	p.mu.Lock()
	if p.shutdown {
		p.mu.Unlock()
		return nil, structs.ErrShutdown
	}
	if c, ok := p.clients[addr]; ok {
		p.mu.Unlock()
		return c, nil
	}
	p.mu.Unlock()

	// Dial without the lock; a racing dial to the same address loses below.
	c, err := p.dial(addr)
	if err != nil {
		return nil, err
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shutdown {
		c.Close()
		return nil, structs.ErrShutdown
	}
	if existing, ok := p.clients[addr]; ok {
		c.Close()
		return existing, nil
	}
	p.clients[addr] = c
	return c, nil
}

// dial opens an RPC connection to addr.
func (p *connPool) dial(addr string) (*rpc.Client, error) {
	conn, err := dialServer(context.Background(), p.dialFn, p.source, addr, p.dialTimeout)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errDial, addr, err)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetKeepAlive(true)
		_ = tcp.SetKeepAlivePeriod(10 * time.Second)
	}
	if p.tls.RPC() {
		conn, err = tlsutil.WrapClient(conn, structs.RPCTLS, p.tls.OutgoingRPCConfig(), p.dialTimeout)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", errDial, addr, err)
		}
	}
	if _, err := conn.Write([]byte{structs.RPCNomad}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%w: %s: %v", errDial, addr, err)
	}
	return rpc.NewClientWithCodec(structs.NewClientCodec(conn)), nil
}

// drop forgets a broken client so the next call dials afresh.
func (p *connPool) drop(addr string, c *rpc.Client) {
	p.mu.Lock()
	if p.clients[addr] == c {
		delete(p.clients, addr)
	}
	p.mu.Unlock()
	c.Close()
}

// RPC calls method on the server at addr. It returns when the reply
// arrives, ctx ends, or the connection breaks. Errors from the remote
// handler come back mapped to their sentinels.
func (p *connPool) RPC(ctx context.Context, addr, method string, args, reply any) error {
	c, err := p.get(addr)
	if err != nil {
		return err
	}
	err = structs.CallContext(ctx, c, method, args, reply)
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		// Abandoned: a late reply lands in a throwaway value, and the
		// connection stays usable for other calls.
		return err
	}
	if err != nil {
		var serverErr rpc.ServerError
		if errors.As(err, &serverErr) {
			return structs.FromRPCError(err)
		}
		// The connection failed: forget it. Whether the call ran is unknown.
		p.drop(addr, c)
		return fmt.Errorf("%w: rpc %s to %s: %v", errConnLost, method, addr, err)
	}
	return nil
}

// Shutdown closes every connection. Safe to call twice.
func (p *connPool) Shutdown() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.shutdown = true
	for addr, c := range p.clients {
		c.Close()
		delete(p.clients, addr)
	}
}

// dialServer opens a connection to another server within timeout: through
// dialFn when the server runs on another network, else over TCP from
// source; ctx ends it early.
func dialServer(ctx context.Context, dialFn func(context.Context, string) (net.Conn, error), source, addr string, timeout time.Duration) (net.Conn, error) {
	if dialFn == nil {
		return netutil.Dialer(source, timeout).DialContext(ctx, "tcp", addr)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return dialFn(ctx, addr)
}
