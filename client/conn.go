package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/rpc"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/yamux"
	"github.com/roamhq/roam/internal/netutil"
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

	closeOnce sync.Once
}

func dialServer(addr, source string, timeout time.Duration, tlsConf *tlsutil.Configurator, logger hclog.Logger) (*serverConn, error) {
	conn, err := netutil.Dialer(source, timeout).Dial("tcp", addr)
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
		addr:    addr,
		conn:    conn,
		session: session,
		rpc:     rpc.NewClientWithCodec(structs.NewClientCodec(stream)),
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

// errCallTimedOut marks a call that ran out of time while the server still
// answers on the session: it is busy (a claim queued behind many in a
// plugin's lane, say), not gone. The session is kept: it also carries the
// servers' calls to this node (controller and node CSI calls), and
// dropping it would fail those too and fence a plugin's calls to a node
// the servers can no longer reach. Whether the call ran is unknown, as
// with a lost connection.
var errCallTimedOut = errors.New("call to server timed out")

// retryableCall says whether a failed call to the servers may succeed if
// sent again: the servers said so, the connection broke or timed out
// with the outcome unknown, or no server could be dialed.
func retryableCall(err error) bool {
	return structs.IsRetryable(err) || errors.Is(err, errConnLost) || errors.Is(err, errCallTimedOut) || isDialError(err)
}

// call runs one RPC. A broken connection comes back as errConnLost; a
// handler's error comes back mapped to its sentinel; a caller that went
// away gets its context's error.
//
// Every call shares the client's stream. A blocking query for a caller
// that may go away is named (QueryOptions.CancelID), and when the caller
// goes the server is told to end it (Status.CancelQuery), so an abandoned
// query does not hold the server for the rest of its wait.
func (s *serverConn) call(caller context.Context, method string, args, reply any, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(caller, timeout)
	defer cancel()
	cancelID := nameQuery(caller, args)
	err := structs.CallContext(ctx, s.rpc, method, args, reply)
	if err == nil {
		return nil
	}
	if caller.Err() != nil && errors.Is(err, caller.Err()) {
		if cancelID != "" {
			s.cancelQuery(cancelID)
		}
		return fmt.Errorf("%s: caller gone: %w", method, err)
	}
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		if s.answers() {
			return fmt.Errorf("%w: %s to %s timed out after %s; the server still answers on the session",
				errCallTimedOut, method, s.addr, timeout)
		}
		return fmt.Errorf("%w: %s to %s timed out after %s", errConnLost, method, s.addr, timeout)
	}
	var serverErr rpc.ServerError
	if errors.As(err, &serverErr) {
		return structs.FromRPCError(err)
	}
	return fmt.Errorf("%w: %s to %s: %v", errConnLost, method, s.addr, err)
}

// answers reports whether the server still answers on the session: one
// yamux ping, bounded by the session's write timeout (the dial timeout).
// A server cut off by a partition, whose connection nothing closes, does
// not.
func (s *serverConn) answers() bool {
	_, err := s.session.Ping()
	return err == nil
}

// nameQuery gives a blocking query whose caller may go away a CancelID,
// and returns it ("" for any other call).
func nameQuery(caller context.Context, args any) string {
	q, isQuery := args.(interface{ TimeToBlock() time.Duration })
	n, canName := args.(interface{ SetQueryCancelID(string) })
	if !isQuery || !canName || q.TimeToBlock() <= 0 || caller.Done() == nil {
		return ""
	}
	id := uuid.NewString()
	n.SetQueryCancelID(id)
	return id
}

// queryCancelTimeout bounds telling a server to end a query whose caller
// left; should it fail, the query ends with its own wait.
const queryCancelTimeout = 2 * time.Second

// cancelQuery tells the server to end the blocking query named id.
func (s *serverConn) cancelQuery(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), queryCancelTimeout)
	defer cancel()
	var reply structs.QueryCancelResponse
	_ = structs.CallContext(ctx, s.rpc, "Status.CancelQuery", &structs.QueryCancelRequest{CancelID: id}, &reply)
}

type yamuxLogger struct{ l hclog.Logger }

func (y yamuxLogger) Print(v ...any)                 { y.l.Debug(fmt.Sprint(v...)) }
func (y yamuxLogger) Printf(format string, v ...any) { y.l.Debug(fmt.Sprintf(format, v...)) }
func (y yamuxLogger) Println(v ...any)               { y.l.Debug(fmt.Sprint(v...)) }
