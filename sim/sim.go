// Package sim runs many simulated client nodes in one process against a
// real cluster of roam servers, for measuring what the servers pay at
// scale (make scale). Each node speaks the client's real RPC over its own
// yamux session (register, heartbeats, its allocations, volume claims and
// allocation updates) and answers the servers' calls to it (ClientCSI
// controller and node calls, ClientStatus.Ping) with an in-process fake
// plugin in front of one fake storage provider. Allocations are reported
// running without running anything.
//
// A node needs its own session: the servers address a call to a node by
// the session it authenticated on, and the calls carry no node ID. So N
// nodes hold N connections, spread over loopback source addresses because
// the servers bound connections per client address.
package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
)

// Config shapes a simulation.
type Config struct {
	// Servers are the RPC addresses of the servers; node i dials
	// Servers[i % len(Servers)].
	Servers []string
	// Nodes is how many nodes to simulate.
	Nodes int
	// Controllers is how many of them (the first ones) run the plugin's
	// controller service; every node runs its node service.
	Controllers int
	PluginID    string
	Datacenter  string
	Region      string
	// Token authenticates the operator calls (volume and job registration)
	// when ACLs are on; IntroToken introduces new nodes when the servers
	// require it.
	Token      string
	IntroToken string
	// NodesPerAddr nodes share one loopback source address.
	NodesPerAddr int
	// AllocsPerNode is how many allocations of the job fit on a node (its
	// reported CPU): room for replacements when nodes go away.
	AllocsPerNode int
	// ProviderLatency is how long each destructive provider call takes.
	ProviderLatency time.Duration
	// RegisterConcurrency bounds the registrations in flight at start.
	RegisterConcurrency int
	CallTimeout         time.Duration
	Logger              hclog.Logger
}

// DefaultConfig returns a working configuration for servers at addrs.
func DefaultConfig(addrs []string) Config {
	return Config{
		Servers:             addrs,
		Nodes:               50,
		Controllers:         3,
		PluginID:            "sim",
		Datacenter:          "dc1",
		Region:              "global",
		NodesPerAddr:        50,
		AllocsPerNode:       4,
		ProviderLatency:     time.Millisecond,
		RegisterConcurrency: 64,
		CallTimeout:         30 * time.Second,
		Logger:              hclog.NewNullLogger(),
	}
}

// Validate checks c without changing it.
func (c Config) Validate() error {
	switch {
	case len(c.Servers) == 0:
		return errors.New("sim: at least one server address is required")
	case c.Nodes < 1 || c.Nodes > 100_000:
		return fmt.Errorf("sim: nodes = %d, must be 1 to 100000", c.Nodes)
	case c.Controllers < 1 || c.Controllers > c.Nodes:
		return fmt.Errorf("sim: controllers = %d, must be 1 to nodes (%d)", c.Controllers, c.Nodes)
	case c.PluginID == "" || c.Datacenter == "":
		return errors.New("sim: plugin ID and datacenter are required")
	case c.NodesPerAddr < 1 || c.NodesPerAddr > 90:
		// Below the servers' default of 100 connections per address.
		return fmt.Errorf("sim: nodes per address = %d, must be 1 to 90", c.NodesPerAddr)
	case c.AllocsPerNode < 1 || c.AllocsPerNode > 1000:
		return fmt.Errorf("sim: allocs per node = %d, must be 1 to 1000", c.AllocsPerNode)
	case c.RegisterConcurrency < 1:
		return fmt.Errorf("sim: register concurrency = %d, must be positive", c.RegisterConcurrency)
	case c.CallTimeout <= 0:
		return fmt.Errorf("sim: call timeout = %s, must be positive", c.CallTimeout)
	}
	return nil
}

// Sim is a running simulation.
type Sim struct {
	cfg    Config
	logger hclog.Logger
	prov   *provider
	nodes  []*node

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	heartbeats   atomic.Int64
	heartbeatErr atomic.Int64

	// mu guards the fields below it.
	mu         sync.Mutex
	claimTimes []time.Duration
	// holders maps a volume ID to the node that holds its claim.
	holders map[string]string
}

// Start registers every node (at most RegisterConcurrency at a time) and
// starts its heartbeats and allocation watch. It returns once every node
// has registered, or with the first error.
func Start(ctx context.Context, cfg Config) (*Sim, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &Sim{
		cfg: cfg, logger: cfg.Logger.Named("sim"), prov: newProvider(cfg.ProviderLatency),
		ctx: sctx, cancel: cancel, holders: map[string]string{},
	}
	for i := range cfg.Nodes {
		s.nodes = append(s.nodes, newNode(s, i))
	}
	sem := make(chan struct{}, cfg.RegisterConcurrency)
	errs := make(chan error, cfg.Nodes)
	var reg sync.WaitGroup
	for _, n := range s.nodes {
		reg.Add(1)
		sem <- struct{}{}
		go func() {
			defer reg.Done()
			defer func() { <-sem }()
			if err := n.registerRetrying(ctx); err != nil {
				errs <- err
				return
			}
			s.wg.Add(2)
			go func() { defer s.wg.Done(); n.heartbeatLoop() }()
			go func() { defer s.wg.Done(); n.allocLoop() }()
		}()
	}
	reg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// Stop ends every node's loops and closes its session. The servers see
// the nodes go silent and mark them down when their TTLs run out.
func (s *Sim) Stop() {
	s.cancel()
	for _, n := range s.nodes {
		n.kill()
	}
	s.wg.Wait()
}

// Kill makes count nodes go silent at once, as if their machines lost
// power: no more heartbeats, sessions closed. It takes nodes that run no
// controller, from the end, and returns their IDs.
func (s *Sim) Kill(count int) []string {
	var ids []string
	for i := len(s.nodes) - 1; i >= 0 && len(ids) < count; i-- {
		n := s.nodes[i]
		if n.controller || n.dead.Load() {
			continue
		}
		n.kill()
		ids = append(ids, n.id)
	}
	return ids
}

// Counts is what the simulation has seen, to check against the servers'
// state.
type Counts struct {
	Nodes       int
	Controllers int
	Live        int
	// Registered nodes have had a Node.Register accepted.
	Registered int
	// Allocs are the allocations the live nodes run (reported running).
	Allocs int
	// Claims are the volumes whose claim a live node holds.
	Claims int
	// Heartbeats and HeartbeatErrors count Node.UpdateStatus calls.
	Heartbeats      int64
	HeartbeatErrors int64
	// Provider counts: destructive calls, the most in flight at once, and
	// how many started while another was running (must stay 0).
	Publishes   int64
	Unpublishes int64
	MaxInFlight int
	Overlaps    int64
	// ClaimP50 and ClaimP99 are over every successful CSIVolume.Claim
	// (taken) call so far, retries of one claim counted as one call.
	ClaimP50, ClaimP99 time.Duration
	ClaimCalls         int
}

// Counts returns the simulation's counts now.
func (s *Sim) Counts() Counts {
	c := Counts{Nodes: len(s.nodes), Heartbeats: s.heartbeats.Load(), HeartbeatErrors: s.heartbeatErr.Load()}
	for _, n := range s.nodes {
		if n.controller {
			c.Controllers++
		}
		if n.registered.Load() {
			c.Registered++
		}
		if n.dead.Load() {
			continue
		}
		c.Live++
		a, cl := n.holding()
		c.Allocs += a
		c.Claims += cl
	}
	s.prov.mu.Lock()
	c.Publishes, c.Unpublishes, c.MaxInFlight, c.Overlaps = s.prov.publishes, s.prov.unpublishes, s.prov.maxInFlight, s.prov.overlaps
	s.prov.mu.Unlock()
	s.mu.Lock()
	times := slices.Clone(s.claimTimes)
	s.mu.Unlock()
	c.ClaimCalls = len(times)
	c.ClaimP50, c.ClaimP99 = percentile(times, 0.50), percentile(times, 0.99)
	return c
}

// ResetClaimTimes forgets the claim latencies measured so far.
func (s *Sim) ResetClaimTimes() {
	s.mu.Lock()
	s.claimTimes = nil
	s.mu.Unlock()
}

// Holders returns, for each volume a live node holds, that node's ID.
func (s *Sim) Holders() map[string]string {
	out := map[string]string{}
	for _, n := range s.nodes {
		if n.dead.Load() {
			continue
		}
		n.mu.Lock()
		for _, a := range n.allocs {
			for _, v := range a.volumes {
				out[v] = n.id
			}
		}
		n.mu.Unlock()
	}
	return out
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := int(float64(len(d)-1) * p)
	return d[i]
}

func (s *Sim) recordClaim(d time.Duration) {
	s.mu.Lock()
	s.claimTimes = append(s.claimTimes, d)
	s.mu.Unlock()
}

// backoff waits a jittered d, or until ctx ends.
func backoff(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d/2 + rand.N(d/2+1))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func newID() string { return uuid.NewString() }
