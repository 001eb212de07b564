package netutil

import (
	"net"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

func TestDialer_LeavesFromLoopbackSource(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- ""
			return
		}
		got <- c.RemoteAddr().(*net.TCPAddr).IP.String()
		c.Close()
	}()

	conn, err := Dialer("127.0.0.7", time.Second).Dial("tcp", ln.Addr().String())
	must.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	must.Eq(t, "127.0.0.7", <-got)
}

func TestDialer_IgnoresOtherSources(t *testing.T) {
	for _, src := range []string{"", "0.0.0.0", "::", "10.1.2.3", "not-an-ip"} {
		must.Nil(t, Dialer(src, time.Second).LocalAddr, must.Sprintf("source %q", src))
	}
}
