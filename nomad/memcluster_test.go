package nomad

import (
	"context"
	"fmt"
	"testing"

	"github.com/roamhq/roam/testutil"
)

// memCluster is a unit-test cluster whose servers talk over an in-memory
// network (testutil.MemNetwork): RPC, forwarding and joins over
// internal/memnet, Raft over raft.InmemTransport. Nothing binds a port,
// and a test can cut any link, one way or both, and heal it.
//
// Each server still keeps its Raft log in its own t.TempDir (TestConfig);
// only the network is in memory.
type memCluster struct {
	t       testing.TB
	mem     *testutil.MemNetwork
	servers []*Server
}

// testMemCluster starts n servers on an in-memory network that find each
// other through retry_join and bootstrap together, and waits for a leader.
func testMemCluster(t testing.TB, n int) *memCluster {
	t.Helper()
	return testMemClusterWith(t, n, nil)
}

// testMemClusterWith is testMemCluster with fn applied to every server's
// config last.
func testMemClusterWith(t testing.TB, n int, fn func(*Config)) *memCluster {
	t.Helper()
	c := startMemCluster(t, n, fn)
	waitForLeader(t, c.servers...)
	return c
}

// startMemCluster is testMemClusterWith without the wait for a leader.
func startMemCluster(t testing.TB, n int, fn func(*Config)) *memCluster {
	t.Helper()
	c := &memCluster{t: t, mem: testutil.NewMemNetwork(n)}
	addrs := c.mem.Addrs()
	c.servers = testutil.StartMemServers(t, c.mem, func(i int, addr string) (*Server, error) {
		cfg := TestConfig(t)
		cfg.NodeName = fmt.Sprintf("%s-%c", cfg.NodeName, 'a'+i)
		cfg.Listener = c.mem.Listen(t, addr)
		cfg.Dial = c.mem.Dialer(addr)
		cfg.RaftTransport = c.mem.RaftTransport(addr)
		cfg.BootstrapExpect = n
		cfg.RetryJoin = addrs
		if fn != nil {
			fn(cfg)
		}
		return NewServer(cfg)
	})
	return c
}

// shutdown stops s and then unplugs it from the network (see
// testutil.MemNetwork.Unplug).
func (c *memCluster) shutdown(s *Server) {
	_ = s.Shutdown(context.Background())
	c.mem.Unplug(s.Addr())
}

// Cut stops traffic from one server to another, one way: from's RPC dials
// and Raft messages to to fail, while to's still reach from and are
// answered.
func (c *memCluster) Cut(from, to *Server) { c.mem.Cut(from.Addr(), to.Addr()) }

// Heal restores the link from one server to another.
func (c *memCluster) Heal(from, to *Server) { c.mem.Heal(from.Addr(), to.Addr()) }

// Isolate cuts s off from every other server, both ways.
func (c *memCluster) Isolate(s *Server) { c.mem.Isolate(s.Addr()) }

// HealAll restores every link.
func (c *memCluster) HealAll() { c.mem.HealAll() }

// others returns the servers other than s.
func (c *memCluster) others(s *Server) []*Server {
	var out []*Server
	for _, o := range c.servers {
		if o != s {
			out = append(out, o)
		}
	}
	return out
}
