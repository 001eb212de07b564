package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/rpc"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/yamux"
	"github.com/roamhq/roam/internal/tlsutil"
	"github.com/roamhq/roam/structs"
)

// serverConn is the client's one session with one server: a yamux session
// whose first stream carries this client's RPCs. Later streams, opened by
// the server, carry server-to-client calls.
type serverConn struct {
	addr    string
	conn    net.Conn
	session *yamux.Session
	rpc     *rpc.Client
	// queryStreams holds a token per blocking query waiting on a stream
	// of its own (see call).
	queryStreams chan struct{}

	closeOnce sync.Once
}

// maxQueryStreams bounds the blocking queries that wait on streams of
// their own; more share the client's stream. The server allows a session
// 256 streams at once.
const maxQueryStreams = 64

func dialServer(addr string, timeout time.Duration, tlsConf *tlsutil.Configurator, logger hclog.Logger) (*serverConn, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetKeepAlive(true)
		_ = tcp.SetKeepAlivePeriod(10 * time.Second)
	}
	if tlsConf.RPC() {
		conn, err = tlsutil.WrapClient(conn, structs.RPCTLS, tlsConf.OutgoingRPCConfig(), timeout)
		if err != nil {
			return nil, err
		}
	}
	if _, err := conn.Write([]byte{structs.RPCMultiplex}); err != nil {
		conn.Close()
		return nil, err
	}
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = nil
	cfg.Logger = yamuxLogger{logger}
	cfg.ConnectionWriteTimeout = timeout
	session, err := yamux.Client(conn, cfg)
	if err != nil {
		conn.Close()
		return nil, err
	}
	stream, err := session.Open()
	if err != nil {
		session.Close()
		return nil, err
	}
	if _, err := stream.Write([]byte{structs.RPCNomad}); err != nil {
		session.Close()
		return nil, err
	}
	return &serverConn{
		addr:         addr,
		conn:         conn,
		session:      session,
		rpc:          rpc.NewClientWithCodec(structs.NewClientCodec(stream)),
		queryStreams: make(chan struct{}, maxQueryStreams),
	}, nil
}

func (s *serverConn) close() {
	s.closeOnce.Do(func() {
		s.rpc.Close()
		s.session.Close()
	})
}

// errConnLost marks a call whose connection broke after it was sent.
var errConnLost = errors.New("connection to server lost")

// call runs one RPC. A broken connection comes back as errConnLost; a
// handler's error comes back mapped to its sentinel; a caller that went
// away gets its context's error.
//
// A blocking query for a caller that may go away waits on a stream of its
// own, closed when the call ends: the server ends the query when its
// stream closes, so an abandoned query does not hold the server for the
// rest of its wait. Calls on the shared stream cannot be cancelled one by
// one.
func (s *serverConn) call(caller context.Context, method string, args, reply any, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(caller, timeout)
	defer cancel()
	var err error
	if q, release, ok := s.queryStream(caller, args); ok {
		err = structs.CallContext(ctx, q, method, args, reply)
		release()
		var serverErr rpc.ServerError
		if err != nil && ctx.Err() == nil && !errors.As(err, &serverErr) && !s.session.IsClosed() {
			// The stream failed but the session did not (the server
			// refused one more stream): a read is safe to send again.
			err = structs.CallContext(ctx, s.rpc, method, args, reply)
		}
	} else {
		err = structs.CallContext(ctx, s.rpc, method, args, reply)
	}
	if err == nil {
		return nil
	}
	if caller.Err() != nil && errors.Is(err, caller.Err()) {
		return fmt.Errorf("%s: caller gone: %w", method, err)
	}
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		return fmt.Errorf("%w: %s to %s timed out after %s", errConnLost, method, s.addr, timeout)
	}
	var serverErr rpc.ServerError
	if errors.As(err, &serverErr) {
		return structs.FromRPCError(err)
	}
	return fmt.Errorf("%w: %s to %s: %v", errConnLost, method, s.addr, err)
}

// queryStream opens a stream of its own for a blocking query whose caller
// may go away, when fewer than maxQueryStreams are open. release closes
// it.
func (s *serverConn) queryStream(caller context.Context, args any) (c *rpc.Client, release func(), ok bool) {
	q, isQuery := args.(interface{ TimeToBlock() time.Duration })
	if !isQuery || q.TimeToBlock() <= 0 || caller.Done() == nil {
		return nil, nil, false
	}
	select {
	case s.queryStreams <- struct{}{}:
	default:
		return nil, nil, false
	}
	stream, err := s.session.Open()
	if err == nil {
		_, err = stream.Write([]byte{structs.RPCNomad})
		if err != nil {
			stream.Close()
		}
	}
	if err != nil {
		<-s.queryStreams
		return nil, nil, false
	}
	c = rpc.NewClientWithCodec(structs.NewClientCodec(stream))
	return c, func() {
		c.Close()
		<-s.queryStreams
	}, true
}

type yamuxLogger struct{ l hclog.Logger }

func (y yamuxLogger) Print(v ...any)                 { y.l.Debug(fmt.Sprint(v...)) }
func (y yamuxLogger) Printf(format string, v ...any) { y.l.Debug(fmt.Sprintf(format, v...)) }
func (y yamuxLogger) Println(v ...any)               { y.l.Debug(fmt.Sprint(v...)) }
