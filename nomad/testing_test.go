package nomad

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// testServer starts one server with TestConfig, adjusted by fn.
func testServer(t testing.TB, fn func(*Config)) *Server {
	t.Helper()
	c := TestConfig(t)
	if fn != nil {
		fn(c)
	}
	s, err := NewServer(c)
	must.NoError(t, err)
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// testCluster starts n servers on their own data dirs that find each other
// through retry_join and bootstrap together.
func testCluster(t *testing.T, n int) []*Server {
	t.Helper()
	return testClusterWith(t, n, nil)
}

// testClusterWith is testCluster with fn applied to every server's config.
func testClusterWith(t *testing.T, n int, fn func(*Config)) []*Server {
	t.Helper()
	servers := startTCPCluster(t, n, fn)
	waitForLeader(t, servers...)
	return servers
}

// startTCPCluster is testClusterWith without the wait for a leader.
func startTCPCluster(t testing.TB, n int, fn func(*Config)) []*Server {
	t.Helper()
	listeners := make([]net.Listener, n)
	addrs := make([]string, n)
	for i := range listeners {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		must.NoError(t, err)
		listeners[i] = ln
		addrs[i] = ln.Addr().String()
	}
	servers := make([]*Server, n)
	for i := range servers {
		servers[i] = testServer(t, func(c *Config) {
			c.NodeName = c.NodeName + "-" + string(rune('a'+i))
			c.Listener = listeners[i]
			c.BootstrapExpect = n
			c.RetryJoin = addrs
			if fn != nil {
				fn(c)
			}
		})
	}
	return servers
}

// waitForLeader waits until exactly one of servers leads and every one of
// them agrees on it, and returns the leader.
func waitForLeader(t testing.TB, servers ...*Server) *Server {
	t.Helper()
	var leader *Server
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			leader = nil
			for _, s := range servers {
				if s.IsLeader() {
					if leader != nil {
						return errorf("two leaders: %s and %s", leader.ID(), s.ID())
					}
					leader = s
				}
			}
			if leader == nil {
				return errorf("no leader among %d servers", len(servers))
			}
			for _, s := range servers {
				if _, id := s.Leader(); id != leader.ID() {
					return errorf("server %s sees leader %q, want %s", s.ID(), id, leader.ID())
				}
			}
			return nil
		}),
		wait.Timeout(10*time.Second),
		wait.Gap(10*time.Millisecond),
	))
	return leader
}

// followers returns the servers that are not leader.
func followers(servers []*Server) []*Server {
	var out []*Server
	for _, s := range servers {
		if !s.IsLeader() {
			out = append(out, s)
		}
	}
	return out
}
