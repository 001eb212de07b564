package nomad

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

func TestDeadServersToRemove(t *testing.T) {
	up := func(id string) peerHealth { return peerHealth{ID: raft.ServerID(id), Healthy: true} }
	down := func(id string, gone time.Duration) peerHealth {
		return peerHealth{ID: raft.ServerID(id), Unreachable: gone}
	}
	const after = time.Minute
	cases := []struct {
		name      string
		peers     []peerHealth
		minVoters int
		want      string
	}{
		{"all healthy", []peerHealth{up("a"), up("b"), up("c")}, 2, ""},
		{"down but not long enough", []peerHealth{up("a"), up("b"), down("c", 30*time.Second)}, 2, ""},
		{"down past the limit", []peerHealth{up("a"), up("b"), down("c", 2*time.Minute)}, 2, "c"},
		{"longest first", []peerHealth{up("a"), up("b"), up("c"), down("d", 2*time.Minute), down("e", 3*time.Minute)}, 3, "e"},
		{"two left of two", []peerHealth{up("a"), down("b", time.Hour)}, 2, ""},
		// bootstrap_expect = 5, already down to 3: removing one would leave
		// fewer than a majority of the expected five.
		{"would go below the minimum", []peerHealth{up("a"), up("b"), down("c", time.Hour)}, 3, ""},
		{"no healthy majority", []peerHealth{up("a"), down("b", time.Hour), down("c", time.Hour)}, 1, ""},
		{"five with two dead keeps a majority", []peerHealth{up("a"), up("b"), up("c"), down("d", time.Hour), down("e", time.Hour)}, 3, "d"},
		{"turned off", []peerHealth{up("a"), up("b"), down("c", time.Hour)}, 2, "off"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			limit := after
			want := tc.want
			if want == "off" {
				limit, want = 0, ""
			}
			id, ok := deadServersToRemove(tc.peers, limit, tc.minVoters)
			must.Eq(t, want != "", ok)
			must.Eq(t, want, string(id))
		})
	}
}

func TestAutopilot_DeadServerRemovedAndReplaced(t *testing.T) {
	t.Parallel()
	servers := testMemClusterWith(t, 3, func(c *Config) { c.DeadServerCleanupAfter = 2 * time.Second }).servers
	leader := waitForLeader(t, servers...)
	dead := followers(servers)[0]
	deadID := raft.ServerID(dead.ID())
	must.NoError(t, dead.Shutdown(context.Background()))
	// The leader last saw it before its shutdown began, and the bound
	// runs from then: the shutdown itself may take longer than the
	// leader's interval between two sightings.
	lastSeen, ok := leader.members.lastSeen(string(deadID))
	must.True(t, ok)

	var live []*Server
	for _, s := range servers {
		if s != dead {
			live = append(live, s)
		}
	}
	// list-peers on the leader shows the dead one unhealthy.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		var resp structs.RaftConfigurationResponse
		if err := leader.RPC("Operator.RaftGetConfiguration", &structs.GenericRequest{}, &resp); err != nil {
			return err
		}
		for _, rs := range resp.Servers {
			if rs.ID == string(deadID) && !rs.Healthy && rs.LastContact > 0 {
				return nil
			}
		}
		return fmt.Errorf("dead server not reported unhealthy: %+v", resp.Servers)
	}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))

	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		cfg, _, err := leader.raftConfiguration()
		if err != nil {
			return err
		}
		for _, s := range cfg.Servers {
			if s.ID == deadID {
				return fmt.Errorf("dead server still in the configuration")
			}
		}
		return nil
	}), wait.Timeout(20*time.Second), wait.Gap(50*time.Millisecond)))
	gone := time.Since(lastSeen)
	must.Greater(t, 2*time.Second, gone, must.Sprint("removed before dead_server_cleanup_after"))

	// Writable with two voters.
	registerNode(t, live[0], testNode("after-removal"))
	// Never below a majority of bootstrap_expect: stopping a second
	// server leaves the last one unable to remove anyone.
	cfg, _, err := leader.raftConfiguration()
	must.NoError(t, err)
	must.Len(t, 2, cfg.Servers)
}
