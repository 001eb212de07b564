package nomad

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/roamhq/roam/internal/tlsutil"
	"github.com/roamhq/roam/internal/tlsutil/tlstest"
	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// echoPeer accepts Raft connections on loopback and echoes what each
// sends after its protocol byte (after a TLS handshake, when tlsConf is
// set). Its conns channel gets every accepted connection, for the test to
// close or write to.
type echoPeer struct {
	ln       net.Listener
	conns    chan net.Conn
	accepted sync.WaitGroup
	echoes   sync.WaitGroup
}

func newEchoPeer(t *testing.T, tlsConf *tls.Config) *echoPeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	p := &echoPeer{ln: ln, conns: make(chan net.Conn, 8)}
	p.accepted.Add(1)
	go func() {
		defer p.accepted.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if tlsConf != nil {
				var b [1]byte
				if _, err := io.ReadFull(c, b[:]); err != nil || b[0] != structs.RPCTLS {
					c.Close()
					continue
				}
				c = tls.Server(c, tlsConf)
			}
			p.conns <- c
			p.echoes.Add(1)
			go func() {
				defer p.echoes.Done()
				var b [1]byte
				if _, err := io.ReadFull(c, b[:]); err != nil || b[0] != structs.RPCRaft {
					c.Close()
					return
				}
				io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.accepted.Wait()
		close(p.conns)
		for c := range p.conns {
			c.Close()
		}
		p.echoes.Wait()
	})
	return p
}

func (p *echoPeer) addr() raft.ServerAddress { return raft.ServerAddress(p.ln.Addr().String()) }

// nextConn returns the next connection the peer accepted.
func (p *echoPeer) nextConn(t *testing.T) net.Conn {
	t.Helper()
	select {
	case c := <-p.conns:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("the peer accepted no connection within 5s")
		return nil
	}
}

// roundTrip writes msg on c and reads the echo back, as one request.
func roundTrip(c net.Conn, msg string) error {
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return errors.New("echo of " + msg + " came back as " + string(buf))
	}
	return nil
}

// waitPeerClosed waits until c's socket shows that the peer closed it.
func waitPeerClosed(t *testing.T, c *raftConn) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(c.closedByPeer),
		wait.Timeout(5*time.Second), wait.Gap(5*time.Millisecond)),
		must.Sprint("the peer's close never reached the socket"))
}

// answeredConn dials an echo peer through a raft layer, over TLS when
// certs is set, and makes one request on the connection.
func answeredConn(t *testing.T, certs *tlstest.Files) (*echoPeer, *raftLayer, *raftConn) {
	t.Helper()
	var (
		peerTLS *tls.Config
		conf    *tlsutil.Configurator
	)
	if certs != nil {
		conf = certs.Configurator(t, certs.Server, false)
		peerTLS = conf.IncomingRPCConfig()
	}
	p := newEchoPeer(t, peerTLS)
	layer := newRaftLayer(p.ln.Addr(), "", conf)
	nc, err := layer.Dial(p.addr(), 5*time.Second)
	must.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	c := nc.(*raftConn)
	must.NoError(t, roundTrip(c, "first"))
	return p, layer, c
}

func TestRaftConn_RedialsAConnectionThePeerClosed(t *testing.T) {
	p, layer, c := answeredConn(t, nil)
	must.True(t, layer.linked(p.addr()))

	// The peer restarts: the pooled connection is closed under the
	// transport. The next request goes out on a new connection.
	p.nextConn(t).Close()
	waitPeerClosed(t, c)
	must.False(t, layer.linked(p.addr()), must.Sprint("a connection the peer closed counts as a link"))
	must.NoError(t, roundTrip(c, "second"), must.Sprint("the request went out on the closed connection"))
	must.Eq(t, 1, c.redials.Load())
	p.nextConn(t)
	must.True(t, layer.linked(p.addr()))

	// Within a request nothing is replaced: the answer is read where the
	// request was written.
	must.NoError(t, roundTrip(c, "third"))
	must.Eq(t, 1, c.redials.Load())
}

func TestRaftConn_StrayBytesOnAnIdleConnection(t *testing.T) {
	p, _, c := answeredConn(t, nil)

	// Bytes no request asked for: over plain TCP the stream is out of
	// step, and the next request must not read them as its answer.
	_, err := p.nextConn(t).Write([]byte("zzzzz"))
	must.NoError(t, err)
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return lookAt(c.raw) == peerPending }),
		wait.Timeout(5*time.Second), wait.Gap(5*time.Millisecond)))
	must.NoError(t, roundTrip(c, "aaaaa"))
	must.Eq(t, 1, c.redials.Load())
}

func TestRaftConn_NewConnectionKeepsTheDeadlines(t *testing.T) {
	p, _, c := answeredConn(t, nil)
	p.nextConn(t).Close()
	waitPeerClosed(t, c)

	// The transport sets the request's deadline before it writes; the
	// connection dialed for that write must keep to it.
	must.NoError(t, c.SetDeadline(time.Now().Add(-time.Second)))
	_, err := c.Write([]byte("late"))
	must.ErrorIs(t, err, os.ErrDeadlineExceeded)
	must.Eq(t, 1, c.redials.Load())
}

func TestRaftConn_ClosedConnectionIsForgotten(t *testing.T) {
	p := newEchoPeer(t, nil)
	layer := newRaftLayer(p.ln.Addr(), "", nil)
	nc, err := layer.Dial(p.addr(), 5*time.Second)
	must.NoError(t, err)
	must.True(t, layer.linked(p.addr()))
	must.NoError(t, nc.Close())
	must.False(t, layer.linked(p.addr()))
	_, err = nc.Write([]byte("x"))
	must.ErrorIs(t, err, net.ErrClosed)
	must.NoError(t, nc.Close(), must.Sprint("a second close"))
}

// Over TLS a peer closes with an alert before its FIN: the bytes wait in
// front of the close, and still the next request goes out on a new
// connection.
func TestRaftConn_TLSPeerThatClosedCleanly(t *testing.T) {
	p, _, c := answeredConn(t, tlstest.Write(t, structs.DefaultRegion))
	must.NoError(t, roundTrip(c, "second"))
	must.Eq(t, 0, c.redials.Load(), must.Sprint("a live TLS connection was replaced"))

	p.nextConn(t).Close() // tls.Conn: close_notify, then FIN
	waitPeerClosed(t, c)
	must.NoError(t, roundTrip(c, "third"))
	must.Eq(t, 1, c.redials.Load())
}

// An idle connection's last deadline has passed (the transport never
// clears it): it is still a live link.
func TestRaftConn_IdlePastItsDeadlineIsLive(t *testing.T) {
	p, layer, nc := answeredConn(t, nil)
	must.NoError(t, nc.SetDeadline(time.Now().Add(-time.Second)))
	must.True(t, layer.linked(p.addr()))
	must.NoError(t, nc.SetDeadline(time.Time{}))
	must.NoError(t, roundTrip(nc, "second"))
	must.Eq(t, 0, nc.redials.Load())
}

func TestRaftLayer_NoConnectionKeptAfterClose(t *testing.T) {
	p := newEchoPeer(t, nil)
	layer := newRaftLayer(p.ln.Addr(), "", nil)
	nc, err := layer.Dial(p.addr(), 5*time.Second)
	must.NoError(t, err)
	must.NoError(t, layer.Close())
	_, err = nc.Write([]byte("x"))
	must.ErrorIs(t, err, net.ErrClosed, must.Sprintf("close left an outgoing connection open: %v", err))
	_, err = layer.Dial(p.addr(), 5*time.Second)
	must.ErrorIs(t, err, errRaftLayerClosed)
	must.False(t, layer.linked(p.addr()))
}

// A dial that ends after Close has collected the connections keeps
// nothing: Close could no longer close it.
func TestRaftLayer_DialRacingCloseKeepsNothing(t *testing.T) {
	p := newEchoPeer(t, nil)
	layer := newRaftLayer(p.ln.Addr(), "", nil)
	var dialed net.Conn
	layer.dialFn = func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		dialed = c
		layer.Close() // while this dial is under way
		return c, err
	}
	_, err := layer.Dial(p.addr(), 5*time.Second)
	must.ErrorIs(t, err, errRaftLayerClosed)
	must.False(t, layer.linked(p.addr()))
	must.NotNil(t, dialed)
	_, err = dialed.Write([]byte{structs.RPCRaft})
	must.ErrorIs(t, err, net.ErrClosed, must.Sprint("the connection dialed during Close was left open"))
}
