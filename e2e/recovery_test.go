//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// pidScript records the task's pid in its volume, then becomes the
// long-running process under that same pid.
const pidScript = `echo $$ > "$ROAM_TASK_DIR/data/pid"; exec sleep 3600`

// volumeSnapshot is what a volume looks like for comparing before and
// after a restore.
func (cc *csiCluster) volumeClaims(t *testing.T, ids ...string) map[string]string {
	t.Helper()
	out := make(map[string]string, len(ids))
	for _, id := range ids {
		v, err := cc.volume(id)
		must.NoError(t, err)
		var parts []string
		for _, c := range v.Claims {
			parts = append(parts, fmt.Sprintf("%s/%s/%s/%s", c.AllocationID, c.NodeID, c.Mode, c.State))
		}
		sort.Strings(parts)
		out[id] = v.ExternalID + " " + strings.Join(parts, ",")
	}
	return out
}

// controllerCounts counts, per volume external ID, the successful
// controller publish and unpublish calls the plugins have seen. Node
// publishes are left out: a client that restarts redoes its node stage
// and publish for the volumes its running tasks hold (Remount; both are
// idempotent at the node), restore or no restore.
func (cc *csiCluster) controllerCounts(t *testing.T, exts []string) map[string]map[string]int {
	t.Helper()
	out := make(map[string]map[string]int, len(exts))
	for _, ext := range exts {
		calls, err := cc.volumeCalls(ext)
		must.NoError(t, err)
		m := make(map[string]int)
		for _, c := range calls {
			if c.Error == "" && strings.HasPrefix(c.Method, "Controller") {
				m[c.Method]++
			}
		}
		out[ext] = m
	}
	return out
}

// TestRecovery_SnapshotRestoreOnFreshServers is issue 19's first
// acceptance test: on a 3-server cluster with a job running and its
// volumes claimed, save a snapshot; stop every agent, delete the servers'
// data dirs, start three fresh servers and restore. Jobs, volumes and
// claims read back as before; the clients reattach to their tasks without
// restarting them; no claim that stayed is published a second time; no
// plugin saw overlapping controller calls.
//
// The clients are stopped before the servers and started after the
// restore (their tasks keep running meanwhile): a client that reaches a
// fresh, empty cluster is told it has no allocations and stops them.
func TestRecovery_SnapshotRestoreOnFreshServers(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 3, Clients: 3, PublishLatency: 100 * time.Millisecond, ExternalPlugins: true})

	names := []string{"vol[0]", "vol[1]"}
	exts := cc.createVolumes(t, "client-0", names...)
	for i, name := range names {
		cc.registerVolumeHTTP(t, name, exts[i])
	}
	cc.RunJob(csiJob("keep", "service", 2, "vol", true, "", pidScript))
	allocs := cc.waitCSIAllocs(t, "keep", csiSettle, func(list []*Alloc) error {
		if r := running(list); len(r) != 2 || len(list) != 2 {
			return fmt.Errorf("%d of 2 allocations running (%d in all)", len(r), len(list))
		}
		return nil
	})
	// Every claim taken, and every task's pid written.
	pids := make(map[string]string)
	WaitFor(t, csiSettle, func() error {
		for i, name := range names {
			v, err := cc.volume(name)
			if err != nil {
				return err
			}
			if len(v.Claims) != 1 || v.Claims[0].State != "taken" {
				return fmt.Errorf("volume %s: %s", name, claimsString(v))
			}
			b, err := os.ReadFile(filepath.Join(cc.StateDir, "volumes", exts[i], "pid"))
			if err != nil {
				return err
			}
			pids[name] = strings.TrimSpace(string(b))
		}
		return nil
	})
	cc.WaitEvalsSettled("keep", csiSettle)

	beforeClaims := cc.volumeClaims(t, names...)
	beforeJob, err := GetJob(cc.API(), "keep")
	must.NoError(t, err)
	beforeAllocs := make(map[string]*Alloc, len(allocs))
	for _, a := range allocs {
		beforeAllocs[a.ID] = a
	}
	beforePublishes := cc.controllerCounts(t, exts)
	t.Logf("before: claims %v, publishes %v, pids %v", beforeClaims, beforePublishes, pids)

	// Saved through a follower, which forwards to the leader.
	leader := cc.Leader()
	follower := (leader + 1) % len(cc.Servers)
	snap := filepath.Join(cc.Dir, "backup.snap")
	out, errOut, code := RunCLIAt(t, cc.ServerHTTP(follower), "operator", "snapshot", "save", snap)
	must.EqOp(t, 0, code, must.Sprintf("save: %s%s", out, errOut))
	out, errOut, code = RunRoam(t, cliTimeout, "operator", "snapshot", "inspect", snap)
	must.EqOp(t, 0, code, must.Sprintf("inspect: %s%s", out, errOut))
	t.Logf("inspect:\n%s", out)
	must.StrContains(t, out, "csi_volumes")

	// The worst day: every server's disk is lost.
	for j := range cc.Clients {
		must.EqOp(t, 0, cc.KillClient(j, syscall.SIGTERM))
	}
	for i := range cc.Servers {
		cc.KillServer(i, syscall.SIGTERM)
	}
	for _, s := range cc.Servers {
		must.NoError(t, os.RemoveAll(s.DataDir))
	}
	for name, pid := range pids {
		n, err := strconv.Atoi(pid)
		must.NoError(t, err)
		must.True(t, pidAlive(n), must.Sprintf("task of %s (pid %d) died with its client", name, n))
	}

	start := time.Now()
	for i := range cc.Servers {
		cc.RestartServer(i)
	}
	cc.WaitForLeader(leaderTimeout)
	var empty []map[string]any
	must.NoError(t, GetJSON(cc.API(), "/v1/jobs", &empty))
	must.SliceEmpty(t, empty, must.Sprint("fresh servers already know jobs"))

	out, errOut, code = RunCLIAt(t, cc.ServerHTTP(0), "operator", "snapshot", "restore", snap)
	must.EqOp(t, 0, code, must.Sprintf("restore: %s%s", out, errOut))
	t.Logf("restore: %s (%s after the fresh servers started)", strings.TrimSpace(out), time.Since(start).Round(time.Millisecond))

	// Every server reads the restored state back, before any client is up.
	for i := range cc.Servers {
		WaitFor(t, csiSettle, func() error {
			var v struct{ ExternalID string }
			return GetJSON(cc.ServerHTTP(i), "/v1/volume/csi/vol%5B0%5D?stale", &v)
		})
	}
	must.Eq(t, beforeClaims, cc.volumeClaims(t, names...))
	afterJob, err := GetJob(cc.API(), "keep")
	must.NoError(t, err)
	must.Eq(t, beforeJob, afterJob)

	// Started together: the restored nodes are down to the servers until
	// their clients heartbeat, and a node down past the failover TTL
	// loses its claims.
	for _, c := range cc.Clients {
		must.NoError(t, c.Start())
	}
	for _, c := range cc.Clients {
		must.NoError(t, c.WaitHTTP(startTimeout))
	}
	// The clients reattach: the same allocations run, their tasks never
	// restarted, under the pids they had.
	cc.waitCSIAllocs(t, "keep", csiSettle, func(list []*Alloc) error {
		if len(list) != 2 {
			return fmt.Errorf("%d allocations, want the 2 restored:\n%s", len(list), allocTable(list))
		}
		for _, a := range list {
			b := beforeAllocs[a.ID]
			if b == nil {
				return errFatal(fmt.Errorf("allocation %s is not one of the restored ones", a))
			}
			if a.ClientStatus != "running" {
				return fmt.Errorf("allocation %s is %s", a, a.ClientStatus)
			}
			ts, bs := a.TaskStates["t"], b.TaskStates["t"]
			if ts == nil || bs == nil || ts.Restarts != 0 || !ts.StartedAt.Equal(bs.StartedAt) {
				return errFatal(fmt.Errorf("task of %s restarted: %+v, before %+v", a, ts, bs))
			}
		}
		return nil
	})
	for i, name := range names {
		b, err := os.ReadFile(filepath.Join(cc.StateDir, "volumes", exts[i], "pid"))
		must.NoError(t, err)
		must.EqOp(t, pids[name], strings.TrimSpace(string(b)), must.Sprintf("task of %s started again", name))
		n, _ := strconv.Atoi(pids[name])
		must.True(t, pidAlive(n))
	}
	// Clients back, plugins healthy again: the claims stayed as they were
	// and nothing published them a second time.
	WaitFor(t, csiSettle, func() error {
		var p struct{ ControllersHealthy, NodesHealthy int }
		if err := GetJSON(cc.API(), "/v1/plugin/csi/"+csiPluginID, &p); err != nil {
			return err
		}
		if p.ControllersHealthy != 3 || p.NodesHealthy != 3 {
			return fmt.Errorf("plugin: %d controllers, %d nodes healthy", p.ControllersHealthy, p.NodesHealthy)
		}
		return nil
	})
	cc.WaitEvalsSettled("keep", csiSettle)
	must.Eq(t, beforeClaims, cc.volumeClaims(t, names...))
	must.Eq(t, beforePublishes, cc.controllerCounts(t, exts))
	cc.mustNoOverlaps(t)
}
