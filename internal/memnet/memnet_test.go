package memnet

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// echo accepts connections on l and echoes what it reads until l closes.
func echo(t *testing.T, l net.Listener) {
	t.Helper()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
}

func roundTrip(c net.Conn, msg string) (string, error) {
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return "", err
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

func TestNetwork_DialCarriesAddresses(t *testing.T) {
	n := New()
	l, err := n.Listen("10.0.0.2:4647")
	must.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
	}()

	c, err := n.Dialer("10.0.0.1:4647")(context.Background(), "10.0.0.2:4647")
	must.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	s := <-accepted
	t.Cleanup(func() { s.Close() })
	must.Eq(t, "10.0.0.1:4647", s.RemoteAddr().String())
	must.Eq(t, "10.0.0.2:4647", c.RemoteAddr().String())
	must.Eq(t, "tcp", s.RemoteAddr().Network())
}

func TestNetwork_RefusesUnknownAndDuplicate(t *testing.T) {
	n := New()
	_, err := n.Dialer("a:1")(context.Background(), "b:1")
	must.ErrorIs(t, err, ErrRefused)

	l, err := n.Listen("b:1")
	must.NoError(t, err)
	_, err = n.Listen("b:1")
	must.ErrorContains(t, err, "address in use")
	_, err = n.Listen("no-port")
	must.Error(t, err)

	must.NoError(t, l.Close())
	_, err = n.Dialer("a:1")(context.Background(), "b:1")
	must.ErrorIs(t, err, ErrRefused)
	_, err = l.Accept()
	must.ErrorIs(t, err, ErrClosed)
}

// A cut is one way: the cut side cannot dial and loses its connections,
// the other side keeps dialing and being answered.
func TestNetwork_CutOneWayThenHeal(t *testing.T) {
	n := New()
	la, err := n.Listen("a:1")
	must.NoError(t, err)
	lb, err := n.Listen("b:1")
	must.NoError(t, err)
	t.Cleanup(func() { la.Close(); lb.Close() })
	echo(t, la)
	echo(t, lb)
	dialA, dialB := n.Dialer("a:1"), n.Dialer("b:1")
	ctx := context.Background()

	ab, err := dialA(ctx, "b:1")
	must.NoError(t, err)
	got, err := roundTrip(ab, "hello")
	must.NoError(t, err)
	must.Eq(t, "hello", got)

	n.Cut("a:1", "b:1")
	_, err = roundTrip(ab, "again")
	must.Error(t, err, must.Sprint("a connection a opened to b survives the cut"))
	_, err = dialA(ctx, "b:1")
	must.ErrorIs(t, err, ErrRefused)

	ba, err := dialB(ctx, "a:1")
	must.NoError(t, err, must.Sprint("b cannot reach a over the uncut direction"))
	got, err = roundTrip(ba, "back")
	must.NoError(t, err)
	must.Eq(t, "back", got)
	ba.Close()

	n.Heal("a:1", "b:1")
	ab, err = dialA(ctx, "b:1")
	must.NoError(t, err)
	got, err = roundTrip(ab, "healed")
	must.NoError(t, err)
	must.Eq(t, "healed", got)
	ab.Close()
}

func TestNetwork_DialHonoursContext(t *testing.T) {
	n := New()
	l, err := n.Listen("b:1") // never accepts
	must.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = n.Dialer("a:1")(ctx, "b:1")
	must.True(t, errors.Is(err, context.Canceled), must.Sprintf("err = %v", err))
}
