package testutil

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/nomad"
)

// Server starts one server with nomad.TestConfig, adjusted by fn, and
// shuts it down when the test ends. With the default BootstrapExpect of 1
// it leads itself once elected; see WaitForLeader.
func Server(t testing.TB, fn func(*nomad.Config)) *nomad.Server {
	t.Helper()
	c := nomad.TestConfig(t)
	if fn != nil {
		fn(c)
	}
	s, err := nomad.NewServer(c)
	must.NoError(t, err)
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// Cluster starts n servers on loopback TCP ports chosen by the kernel,
// each on its own data dir, that find each other through retry_join and
// bootstrap together; fn, if set, adjusts every server's config last. It
// returns once they agree on a leader.
func Cluster(t testing.TB, n int, fn func(*nomad.Config)) []*nomad.Server {
	t.Helper()
	listeners := make([]net.Listener, n)
	addrs := make([]string, n)
	for i := range listeners {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		must.NoError(t, err)
		listeners[i] = ln
		addrs[i] = ln.Addr().String()
	}
	servers := make([]*nomad.Server, n)
	for i := range servers {
		servers[i] = Server(t, func(c *nomad.Config) {
			c.NodeName = fmt.Sprintf("%s-%d", c.NodeName, i)
			c.Listener = listeners[i]
			c.BootstrapExpect = n
			c.RetryJoin = addrs
			if fn != nil {
				fn(c)
			}
		})
	}
	WaitForLeader(t, servers...)
	return servers
}

// WaitForLeader waits until exactly one of servers leads and every one of
// them agrees on it, and returns the leader.
func WaitForLeader(t testing.TB, servers ...*nomad.Server) *nomad.Server {
	t.Helper()
	var leader *nomad.Server
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			leader = nil
			for _, s := range servers {
				if s.IsLeader() {
					if leader != nil {
						return fmt.Errorf("two leaders: %s and %s", leader.ID(), s.ID())
					}
					leader = s
				}
			}
			if leader == nil {
				return fmt.Errorf("no leader among %d servers", len(servers))
			}
			for _, s := range servers {
				if _, id := s.Leader(); id != leader.ID() {
					return fmt.Errorf("server %s sees leader %q, want %s", s.ID(), id, leader.ID())
				}
			}
			return nil
		}),
		wait.Timeout(10*time.Second),
		wait.Gap(10*time.Millisecond),
	))
	return leader
}

// Followers returns the servers that do not lead now.
func Followers(servers []*nomad.Server) []*nomad.Server {
	var out []*nomad.Server
	for _, s := range servers {
		if !s.IsLeader() {
			out = append(out, s)
		}
	}
	return out
}
