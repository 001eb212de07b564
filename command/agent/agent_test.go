package agent

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/nomad"
	"github.com/roamhq/roam/testutil"
)

// newTestServers starts n server-only agents on 127.0.0.1 with
// kernel-chosen ports; every agent after the first joins through the
// first one's RPC address, and they bootstrap once all n know each other.
// It waits until exactly one of them leads and returns the agents and the
// leader's index.
func newTestServers(t *testing.T, n int) ([]*Agent, int) {
	t.Helper()
	return newTestServersWith(t, n, nil)
}

// newTestServersWith is newTestServers with mutate(i, c) applied to each
// agent's configuration.
func newTestServersWith(t *testing.T, n int, mutate func(int, *Config)) ([]*Agent, int) {
	t.Helper()
	agents := make([]*Agent, n)
	var join []string
	for i := range agents {
		agents[i] = newTestAgent(t, func(c *Config) {
			c.Name = fmt.Sprintf("%s-%d", c.Name, i)
			c.Client.Enabled = false
			c.Server.BootstrapExpect = n
			c.Server.ServerJoin = &ServerJoin{RetryJoin: join, RetryInterval: "50ms"}
			if mutate != nil {
				mutate(i, c)
			}
		})
		if i == 0 {
			join = []string{agents[0].Server().Addr()}
		}
	}
	servers := make([]*nomad.Server, n)
	for i, a := range agents {
		servers[i] = a.Server()
	}
	lead := testutil.WaitForLeader(t, servers...)
	leader := slices.Index(servers, lead)
	return agents, leader
}

// TestAgent_ShutdownHandsLeadershipOver shuts down, as a program embedding
// the agent would, the agent whose server leads a three-server cluster.
// Shutdown hands leadership over before it returns: by then another
// agent's server already leads, without waiting out an election.
func TestAgent_ShutdownHandsLeadershipOver(t *testing.T) {
	agents, old := newTestServers(t, 3)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	must.NoError(t, agents[old].Shutdown(ctx))

	// No wait here: an agent that merely stopped would leave the other two
	// without a leader for at least an election timeout.
	var leaders []int
	for i, a := range agents {
		if i != old && a.Server().IsLeader() {
			leaders = append(leaders, i)
		}
	}
	must.Len(t, 1, leaders, must.Sprintf("leaders among the other agents when agent %d's Shutdown returned", old))
	must.False(t, agents[old].Server().IsLeader())

	// The remaining follower comes to follow the new leader.
	next := agents[leaders[0]].Server()
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			for i, a := range agents {
				if i == old {
					continue
				}
				if _, id := a.Server().Leader(); id != next.ID() {
					return fmt.Errorf("agent %d sees leader %q, want %s", i, id, next.ID())
				}
			}
			return nil
		}),
		wait.Timeout(10*time.Second),
		wait.Gap(10*time.Millisecond),
	))
}
