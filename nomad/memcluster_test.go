package nomad

import (
	"context"
	"fmt"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/internal/memnet"
)

// memCluster is a unit-test cluster whose servers talk over an in-memory
// network: RPC, forwarding and joins over internal/memnet, Raft over
// raft.InmemTransport. Nothing binds a port, and a test can cut any link,
// one way or both, and heal it.
//
// Each server still keeps its Raft log in its own t.TempDir (TestConfig);
// only the network is in memory.
type memCluster struct {
	t       testing.TB
	net     *memnet.Network
	servers []*Server
	// rafts holds each server's Raft transport by its address.
	rafts map[string]*raft.InmemTransport
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
	c := &memCluster{t: t, net: memnet.New(), rafts: make(map[string]*raft.InmemTransport)}
	addrs := make([]string, n)
	for i := range addrs {
		// Each server has its own IP, so per-IP limits and logs tell
		// them apart as they would on a real network.
		addrs[i] = fmt.Sprintf("127.77.0.%d:4647", i+1)
		_, c.rafts[addrs[i]] = raft.NewInmemTransport(raft.ServerAddress(addrs[i]))
	}
	for _, a := range addrs {
		for _, b := range addrs {
			if a != b {
				c.rafts[a].Connect(raft.ServerAddress(b), c.rafts[b])
			}
		}
	}
	for i, addr := range addrs {
		ln, err := c.net.Listen(addr)
		must.NoError(t, err)
		cfg := TestConfig(t)
		cfg.NodeName = fmt.Sprintf("%s-%c", cfg.NodeName, 'a'+i)
		cfg.Listener = ln
		cfg.Dial = c.net.Dialer(addr)
		cfg.RaftTransport = c.rafts[addr]
		cfg.BootstrapExpect = n
		cfg.RetryJoin = addrs
		if fn != nil {
			fn(cfg)
		}
		s, err := NewServer(cfg)
		must.NoError(t, err)
		t.Cleanup(func() { c.shutdown(s) })
		c.servers = append(c.servers, s)
	}
	return c
}

// shutdown stops s and then unplugs it: a message to a stopped
// raft.InmemTransport would otherwise wait out the transport's timeout
// where a TCP peer gets a refused connection at once, and every later
// shutdown (a leader handing off, say) would pay for it.
func (c *memCluster) shutdown(s *Server) {
	_ = s.Shutdown(context.Background())
	for _, o := range c.servers {
		if o != s {
			c.rafts[o.Addr()].Disconnect(raft.ServerAddress(s.Addr()))
		}
	}
}

// Cut stops traffic from one server to another, one way: from's RPC dials
// and Raft messages to to fail, while to's still reach from and are
// answered.
func (c *memCluster) Cut(from, to *Server) {
	c.net.Cut(from.Addr(), to.Addr())
	c.rafts[from.Addr()].Disconnect(raft.ServerAddress(to.Addr()))
}

// Heal restores the link from one server to another.
func (c *memCluster) Heal(from, to *Server) {
	c.net.Heal(from.Addr(), to.Addr())
	c.rafts[from.Addr()].Connect(raft.ServerAddress(to.Addr()), c.rafts[to.Addr()])
}

// Isolate cuts s off from every other server, both ways.
func (c *memCluster) Isolate(s *Server) {
	for _, o := range c.servers {
		if o != s {
			c.Cut(s, o)
			c.Cut(o, s)
		}
	}
}

// HealAll restores every link.
func (c *memCluster) HealAll() {
	for _, a := range c.servers {
		for _, b := range c.servers {
			if a != b {
				c.Heal(a, b)
			}
		}
	}
}

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
