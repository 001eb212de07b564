package client

import (
	"fmt"
	"testing"

	"github.com/roamhq/roam/nomad"
	"github.com/roamhq/roam/testutil"
)

// testServer starts one server with nomad.TestConfig, adjusted by fn, for
// clients to register with, and stops it when the test ends. It
// bootstraps alone, with testutil.LoneServerTimers; see
// testutil.WaitForLeader.
func testServer(t testing.TB, fn func(*nomad.Config)) *nomad.Server {
	t.Helper()
	return testutil.Start(t, func() (*nomad.Server, error) {
		c := nomad.TestConfig(t)
		testutil.LoneServerTimers(c.RaftConfig)
		if fn != nil {
			fn(c)
		}
		return nomad.NewServer(c)
	})
}

// testCluster starts n servers on loopback TCP ports chosen by the kernel
// that find each other through retry_join and bootstrap together, and
// returns them once they agree on a leader.
func testCluster(t testing.TB, n int) []*nomad.Server {
	t.Helper()
	listeners, addrs := testutil.TCPListeners(t, n)
	servers := testutil.StartCluster(t, n, func(i int) (*nomad.Server, error) {
		c := nomad.TestConfig(t)
		c.NodeName = fmt.Sprintf("%s-%d", c.NodeName, i)
		c.Listener = listeners[i]
		c.BootstrapExpect = n
		c.RetryJoin = addrs
		return nomad.NewServer(c)
	})
	testutil.WaitForLeader(t, servers...)
	return servers
}
