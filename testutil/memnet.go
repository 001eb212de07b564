package testutil

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/internal/memnet"
)

// MemNetwork is an in-memory network for a unit-test cluster: RPC,
// forwarding and joins over internal/memnet, Raft over
// raft.InmemTransport. Nothing binds a port, and a test can cut any link,
// one way or both, and heal it. Servers are named by their address.
type MemNetwork struct {
	net   *memnet.Network
	addrs []string
	// rafts holds each server's Raft transport by its address.
	rafts map[string]*raft.InmemTransport
}

// NewMemNetwork makes a network of n servers, every link up. Each server
// has its own IP (127.77.0.1, .2, …), so per-IP limits and logs tell them
// apart as they would on a real network.
func NewMemNetwork(n int) *MemNetwork {
	m := &MemNetwork{net: memnet.New(), rafts: make(map[string]*raft.InmemTransport)}
	for i := range n {
		addr := fmt.Sprintf("127.77.0.%d:4647", i+1)
		m.addrs = append(m.addrs, addr)
		_, m.rafts[addr] = raft.NewInmemTransport(raft.ServerAddress(addr))
	}
	for _, a := range m.addrs {
		for _, b := range m.addrs {
			if a != b {
				m.rafts[a].Connect(raft.ServerAddress(b), m.rafts[b])
			}
		}
	}
	return m
}

// Addrs returns every server's address, in order.
func (m *MemNetwork) Addrs() []string { return append([]string(nil), m.addrs...) }

// Listen returns the listener for the server at addr.
func (m *MemNetwork) Listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	ln, err := m.net.Listen(addr)
	must.NoError(t, err)
	return ln
}

// Dialer returns the dial function for the server at addr.
func (m *MemNetwork) Dialer(addr string) func(ctx context.Context, to string) (net.Conn, error) {
	return m.net.Dialer(addr)
}

// RaftTransport returns the Raft transport of the server at addr.
func (m *MemNetwork) RaftTransport(addr string) *raft.InmemTransport { return m.rafts[addr] }

// Unplug disconnects every other server's Raft transport from addr, for a
// server that has stopped: a message to a stopped raft.InmemTransport
// would otherwise wait out the transport's timeout where a TCP peer gets a
// refused connection at once, and every later shutdown (a leader handing
// off, say) would pay for it.
func (m *MemNetwork) Unplug(addr string) {
	for _, o := range m.addrs {
		if o != addr {
			m.rafts[o].Disconnect(raft.ServerAddress(addr))
		}
	}
}

// Cut stops traffic from one server to another, one way: from's RPC dials
// and Raft messages to to fail, while to's still reach from and are
// answered.
func (m *MemNetwork) Cut(from, to string) {
	m.net.Cut(from, to)
	m.rafts[from].Disconnect(raft.ServerAddress(to))
}

// Heal restores the link from one server to another.
func (m *MemNetwork) Heal(from, to string) {
	m.net.Heal(from, to)
	m.rafts[from].Connect(raft.ServerAddress(to), m.rafts[to])
}

// Isolate cuts addr off from every other server, both ways.
func (m *MemNetwork) Isolate(addr string) {
	for _, o := range m.addrs {
		if o != addr {
			m.Cut(addr, o)
			m.Cut(o, addr)
		}
	}
}

// HealAll restores every link.
func (m *MemNetwork) HealAll() {
	for _, a := range m.addrs {
		for _, b := range m.addrs {
			if a != b {
				m.Heal(a, b)
			}
		}
	}
}

// StartMemServers starts a server at each of m's addresses with start(i,
// addr), which must put it on m (Listen, Dialer, RaftTransport), and
// returns them without waiting for a leader. When the test ends each is
// shut down and then unplugged.
func StartMemServers[S Stopper](t testing.TB, m *MemNetwork, start func(i int, addr string) (S, error)) []S {
	t.Helper()
	out := make([]S, len(m.addrs))
	for i, addr := range m.addrs {
		s, err := start(i, addr)
		must.NoError(t, err)
		t.Cleanup(func() {
			_ = s.Shutdown(context.Background())
			m.Unplug(addr)
		})
		out[i] = s
	}
	return out
}
