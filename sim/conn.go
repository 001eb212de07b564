package sim

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

	"github.com/roamhq/roam/internal/netutil"
	"github.com/roamhq/roam/structs"
)

// session is one simulated node's connection to one server, made the way
// the client agent makes it (client/conn.go): a TCP connection, the
// multiplex byte, a yamux session whose first stream carries the node's
// own RPCs; streams the server opens carry its calls to the node and are
// served by srv.
type session struct {
	addr    string
	session *yamux.Session
	rpc     *rpc.Client

	closeOnce sync.Once
}

// errConnLost marks a call whose connection broke: the node dials again.
var errConnLost = errors.New("sim: connection to server lost")

// errCallTimedOut marks a call that ran out of time while the server still
// answers on the session: busy, not gone, so the node keeps its session
// (and the servers' calls to it), as the client agent does.
var errCallTimedOut = errors.New("sim: call to server timed out")

// retryable says whether a failed call may succeed if sent again: the
// servers said so, or the connection broke or timed out with the outcome
// unknown.
func retryable(err error) bool {
	return structs.IsRetryable(err) || errors.Is(err, errConnLost) || errors.Is(err, errCallTimedOut)
}

func dialSession(addr, source string, timeout time.Duration, srv *structs.RPCServer, logger hclog.Logger, wg *sync.WaitGroup) (*session, error) {
	conn, err := netutil.Dialer(source, timeout).Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("sim: dial %s from %s: %w", addr, source, err)
	}
	if _, err := conn.Write([]byte{structs.RPCMultiplex}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("sim: %s: %w", addr, err)
	}
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = nil
	cfg.Logger = yamuxLogger{logger}
	cfg.ConnectionWriteTimeout = timeout
	ys, err := yamux.Client(conn, cfg)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("sim: %s: yamux: %w", addr, err)
	}
	stream, err := ys.Open()
	if err != nil {
		ys.Close()
		return nil, fmt.Errorf("sim: %s: open stream: %w", addr, err)
	}
	if _, err := stream.Write([]byte{structs.RPCNomad}); err != nil {
		ys.Close()
		return nil, fmt.Errorf("sim: %s: %w", addr, err)
	}
	s := &session{addr: addr, session: ys, rpc: rpc.NewClientWithCodec(structs.NewClientCodec(stream))}
	if srv != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			serveStreams(ys, srv, wg)
		}()
	}
	return s, nil
}

// serveStreams serves the calls a server makes on the session until it
// closes, each stream in its own goroutine, as the client agent does.
func serveStreams(ys *yamux.Session, srv *structs.RPCServer, wg *sync.WaitGroup) {
	for {
		stream, err := ys.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b [1]byte
			_ = stream.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := stream.Read(b[:]); err != nil || b[0] != structs.RPCNomad {
				stream.Close()
				return
			}
			_ = stream.SetReadDeadline(time.Time{})
			srv.ServeCodec(structs.NewServerCodec(stream))
		}()
	}
}

func (s *session) close() {
	s.closeOnce.Do(func() {
		s.rpc.Close()
		s.session.Close()
	})
}

// call runs one RPC; a transport failure wraps errConnLost, a handler's
// error comes back mapped to its sentinel.
func (s *session) call(ctx context.Context, method string, args, reply any, timeout time.Duration) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := structs.CallContext(cctx, s.rpc, method, args, reply)
	if err == nil {
		return nil
	}
	var serverErr rpc.ServerError
	if errors.As(err, &serverErr) {
		return structs.FromRPCError(err)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", method, ctx.Err())
	}
	if errors.Is(err, context.DeadlineExceeded) && cctx.Err() != nil {
		if _, perr := s.session.Ping(); perr == nil {
			return fmt.Errorf("%w: %s to %s after %s; the server still answers on the session", errCallTimedOut, method, s.addr, timeout)
		}
	}
	return fmt.Errorf("%w: %s to %s: %v", errConnLost, method, s.addr, err)
}

type yamuxLogger struct{ l hclog.Logger }

func (y yamuxLogger) Print(v ...any)                 { y.l.Trace(fmt.Sprint(v...)) }
func (y yamuxLogger) Printf(format string, v ...any) { y.l.Trace(fmt.Sprintf(format, v...)) }
func (y yamuxLogger) Println(v ...any)               { y.l.Trace(fmt.Sprint(v...)) }

// sourceAddr is the loopback address node i dials from. Servers bound
// the connections from one address (rpc_max_conns_per_client), as they
// should: a real fleet has an address per node, and so do simulated
// nodes, nodesPerAddr to an address. A non-loopback server is dialled
// from wherever the kernel picks.
func sourceAddr(server string, i, nodesPerAddr int) string {
	host, _, err := net.SplitHostPort(server)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return ""
	}
	k := i / nodesPerAddr
	return fmt.Sprintf("127.%d.%d.%d", 100+k/(250*250)%100, k/250%250, k%250+1)
}
