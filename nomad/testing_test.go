package nomad

import (
	"testing"

	"github.com/roamhq/roam/testutil"
)

// The server's tests build servers from their config here and leave
// starting, stopping, waiting for a leader and the in-memory network to
// testutil, which takes the constructor so that it need not import this
// package.

// testServer starts one server with TestConfig, adjusted by fn, and stops
// it when the test ends. A server left to bootstrap alone gets
// testutil.LoneServerTimers unless fn chose its own Raft timers.
func testServer(t testing.TB, fn func(*Config)) *Server {
	t.Helper()
	return testutil.Start(t, func() (*Server, error) {
		c := TestConfig(t)
		if fn != nil {
			fn(c)
		}
		if c.BootstrapExpect == 1 && len(c.RetryJoin) == 0 && hasTestRaftTimers(c) {
			testutil.LoneServerTimers(c.RaftConfig)
		}
		return NewServer(c)
	})
}

// hasTestRaftTimers reports whether c's Raft timers are still TestConfig's.
func hasTestRaftTimers(c *Config) bool {
	if c.RaftConfig == nil {
		return false
	}
	want := testRaftConfig()
	return c.RaftConfig.HeartbeatTimeout == want.HeartbeatTimeout &&
		c.RaftConfig.ElectionTimeout == want.ElectionTimeout &&
		c.RaftConfig.LeaderLeaseTimeout == want.LeaderLeaseTimeout
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

// startTCPCluster is testClusterWith without the wait for a leader: n
// servers on loopback TCP ports chosen by the kernel.
func startTCPCluster(t testing.TB, n int, fn func(*Config)) []*Server {
	t.Helper()
	listeners, addrs := testutil.TCPListeners(t, n)
	return testutil.StartCluster(t, n, func(i int) (*Server, error) {
		c := TestConfig(t)
		c.NodeName = c.NodeName + "-" + string(rune('a'+i))
		c.Listener = listeners[i]
		c.BootstrapExpect = n
		c.RetryJoin = addrs
		if fn != nil {
			fn(c)
		}
		return NewServer(c)
	})
}

// waitForLeader waits until exactly one of servers leads and every one of
// them agrees on it, and returns the leader.
func waitForLeader(t testing.TB, servers ...*Server) *Server {
	t.Helper()
	return testutil.WaitForLeader(t, servers...)
}

// followers returns the servers that are not leader.
func followers(servers []*Server) []*Server { return testutil.Followers(servers) }
