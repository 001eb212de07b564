//go:build e2e

package e2e

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// raftPeers is /v1/operator/raft/configuration as the suites read it.
type raftPeers struct {
	Servers []struct {
		ID, Node, Address string
		Leader, Voter     bool
		Healthy           bool
		LastContact       time.Duration
	}
}

// TestRecovery_DeadServerRemovedAndReplaced is issue 19's dead-server
// acceptance test: kill -9 one of three servers and keep it down. The
// leader removes it once dead_server_cleanup_after has passed (and not
// before), the cluster stays writable throughout, and a new server joins
// as a voter.
func TestRecovery_DeadServerRemovedAndReplaced(t *testing.T) {
	const cleanupAfter = 6 * time.Second
	c := StartCluster(t, Opts{Servers: 3, ServerConfigExtra: fmt.Sprintf(`server {
  dead_server_cleanup_after = %q
}
`, cleanupAfter)})
	leader := c.Leader()
	victim := (leader + 1) % 3
	var victimID string
	var peers raftPeers
	must.NoError(t, GetJSON(c.ServerHTTP(leader), "/v1/operator/raft/configuration", &peers))
	for _, p := range peers.Servers {
		if p.Node == c.Servers[victim].Name {
			victimID = p.ID
		}
	}
	must.NotEq(t, "", victimID)

	c.KillServer(victim, syscall.SIGKILL)
	killed := time.Now()
	c.RunJob(serviceJob("while-dead", 1, "", sleepScript))

	// list-peers shows the dead server unhealthy, with its last contact.
	WaitFor(t, 10*time.Second, func() error {
		out, errOut, code := RunCLIAt(t, c.ServerHTTP(leader), "operator", "raft", "list-peers")
		if code != 0 {
			return fmt.Errorf("list-peers: %s", errOut)
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, victimID) && strings.Contains(l, "unhealthy") {
				t.Logf("list-peers:\n%s", out)
				return nil
			}
		}
		return fmt.Errorf("dead server not shown unhealthy:\n%s", out)
	})

	var removedAt time.Time
	WaitFor(t, 4*cleanupAfter, func() error {
		var p raftPeers
		if err := GetJSON(c.ServerHTTP(leader), "/v1/operator/raft/configuration", &p); err != nil {
			return err
		}
		for _, s := range p.Servers {
			if s.ID == victimID {
				return fmt.Errorf("dead server %s still a peer (%s after kill -9)", victimID, time.Since(killed).Round(time.Second))
			}
		}
		removedAt = time.Now()
		return nil
	})
	gone := removedAt.Sub(killed)
	t.Logf("removed %s after kill -9 (dead_server_cleanup_after = %s, ratio %.2f)", gone.Round(time.Millisecond), cleanupAfter, float64(gone)/float64(cleanupAfter))
	// The clock starts at the last answer the leader had, which is at most
	// one probe (retry_interval, 500ms) before the kill.
	must.Greater(t, cleanupAfter-time.Second, gone, must.Sprint("removed before dead_server_cleanup_after"))
	lines := logLines(c.Servers[leader], "removing dead server from the raft configuration")
	must.Len(t, 1, lines)
	must.StrContains(t, lines[0], victimID)

	// Writable with the two left.
	c.RunJob(serviceJob("after-removal", 1, "", sleepScript))
	_, err := GetJob(c.API(), "after-removal")
	must.NoError(t, err)
	prom, err := httpClient.Get(c.ServerHTTP(leader) + "/v1/metrics?format=prometheus")
	must.NoError(t, err)
	body, err := io.ReadAll(prom.Body)
	prom.Body.Close()
	must.NoError(t, err)
	var counter string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "roam_autopilot_dead_server_removed") {
			counter = l
		}
	}
	must.Eq(t, "roam_autopilot_dead_server_removed 1", counter, must.Sprint("the removal was not counted"))

	// A replacement joins as a voter.
	ports := FreePorts(t, 2)
	repl := NewAgent(t, "server-3", filepath.Join(c.Dir, "server-3"), ports[0], ports[1])
	t.Cleanup(func() { stopAndReport(t, []*Agent{repl}) })
	var live []string
	for i, s := range c.Servers {
		if i != victim {
			live = append(live, s.RPCAddr())
		}
	}
	hcl := fmt.Sprintf(`name      = "server-3"
data_dir  = %q
bind_addr = "127.0.0.1"
ports {
  http = %d
  rpc  = %d
}
server {
  enabled          = true
  bootstrap_expect = 3
%s
  server_join {
    retry_join     = %s
    retry_interval = "500ms"
  }
}
`, repl.DataDir, ports[0], ports[1], serverTimers, hclList(live))
	cfg := filepath.Join(repl.Dir, "agent.hcl")
	must.NoError(t, os.WriteFile(cfg, []byte(hcl), 0o644))
	repl.Args = []string{"agent", "-config", cfg}
	must.NoError(t, repl.Start())
	must.NoError(t, repl.WaitHTTP(startTimeout))
	WaitFor(t, 30*time.Second, func() error {
		var p raftPeers
		if err := GetJSON(c.ServerHTTP(leader), "/v1/operator/raft/configuration", &p); err != nil {
			return err
		}
		voters, healthy := 0, 0
		for _, s := range p.Servers {
			if s.Voter {
				voters++
			}
			if s.Healthy {
				healthy++
			}
			if s.Node == "server-3" && !s.Voter {
				return fmt.Errorf("server-3 is not a voter")
			}
		}
		if voters != 3 || healthy != 3 {
			return fmt.Errorf("%d voters, %d healthy: %+v", voters, healthy, p.Servers)
		}
		return nil
	})
	// The new voter serves what the cluster wrote.
	WaitFor(t, 10*time.Second, func() error {
		var j JobInfo
		return GetJSON(repl.HTTPAddr(), "/v1/job/after-removal?stale", &j)
	})
}
