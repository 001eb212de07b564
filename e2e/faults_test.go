//go:build e2e

package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// The fault harness itself: a leader cut off from both followers is
// replaced by one of them, the cut heals into one leader again, a paused
// leader is replaced too, and the nftables table is gone after the test.
func TestFaults_CutPauseHeal(t *testing.T) {
	var table string
	t.Run("cluster", func(t *testing.T) {
		c := StartCluster(t, Opts{Servers: 3, OwnAddrs: true})
		nf := newNetFaults(t)
		table = nf.table
		for _, s := range c.Servers {
			must.StrHasPrefix(t, "127.", s.IP)
			must.NotEq(t, "127.0.0.1", s.IP)
		}

		old := c.Leader()
		var rest []*Agent
		for i, s := range c.Servers {
			if i != old {
				rest = append(rest, s)
			}
		}
		cutAt := time.Now()
		nf.Cut([]*Agent{c.Servers[old]}, rest)
		must.Eq(t, 4, nf.Cuts())
		// The two followers elect one of themselves; the old leader, cut
		// off, cannot be theirs.
		newLeader := waitLeaderAmong(t, c, rest)
		t.Logf("cut %s off: %s took over after %s", c.Servers[old].Name, newLeader, time.Since(cutAt).Round(time.Millisecond))

		nf.Heal()
		must.Eq(t, 0, nf.Cuts())
		c.WaitForLeader(leaderTimeout)

		// Pause the leader: the others elect a new one; on resume all
		// three agree again.
		cur := c.Leader()
		must.NoError(t, c.Servers[cur].Pause())
		var others []*Agent
		for i, s := range c.Servers {
			if i != cur {
				others = append(others, s)
			}
		}
		pausedAt := time.Now()
		newLeader = waitLeaderAmong(t, c, others)
		t.Logf("paused %s: %s took over after %s", c.Servers[cur].Name, newLeader, time.Since(pausedAt).Round(time.Millisecond))
		must.NoError(t, c.Servers[cur].Resume())
		c.WaitForLeader(leaderTimeout)
	})
	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	must.NoError(t, err)
	must.StrNotContains(t, string(out), table, must.Sprint("the test's nftables table outlived it"))
}

// waitLeaderAmong waits until every agent in group names the same leader,
// one of group, and returns its name.
func waitLeaderAmong(t *testing.T, c *Cluster, group []*Agent) string {
	t.Helper()
	var name string
	WaitFor(t, leaderTimeout, func() error {
		leader := ""
		for _, a := range group {
			l, err := StatusLeader(a.HTTPAddr())
			if err != nil {
				return fmt.Errorf("%s: %w", a.Name, err)
			}
			if l == "" || (leader != "" && l != leader) {
				return fmt.Errorf("%s names leader %q, others %q", a.Name, l, leader)
			}
			leader = l
		}
		for _, a := range group {
			if a.RPCAddr() == leader {
				name = a.Name
				return nil
			}
		}
		return fmt.Errorf("leader %s is not one of %s", leader, names(group))
	})
	return name
}

func names(agents []*Agent) string {
	var out []string
	for _, a := range agents {
		out = append(out, a.Name)
	}
	return strings.Join(out, ",")
}
