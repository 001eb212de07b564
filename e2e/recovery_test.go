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
// Here the clients are stopped before the servers and started after the
// restore (their tasks keep running meanwhile);
// TestRecovery_ClientsMeetEmptyServers has them meet the empty servers.
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
	cc.stopAllAndWipeServers(t)
	for name, pid := range pids {
		n, err := strconv.Atoi(pid)
		must.NoError(t, err)
		must.True(t, pidAlive(n), must.Sprintf("task of %s (pid %d) died with its client", name, n))
	}
	cc.freshServersRestore(t, snap)

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

	cc.startClientsTogether(t)
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

// stopAllAndWipeServers stops every client (their tasks keep running) and
// every server, and deletes the servers' data dirs.
func (cc *csiCluster) stopAllAndWipeServers(t *testing.T) {
	t.Helper()
	for j := range cc.Clients {
		cc.KillClient(j, syscall.SIGTERM)
	}
	for i := range cc.Servers {
		cc.KillServer(i, syscall.SIGTERM)
	}
	for _, s := range cc.Servers {
		must.NoError(t, os.RemoveAll(s.DataDir))
	}
}

// freshServersRestore starts the servers on their empty data dirs, checks
// they know nothing, and restores snap through server 0.
func (cc *csiCluster) freshServersRestore(t *testing.T, snap string) {
	t.Helper()
	start := time.Now()
	for i := range cc.Servers {
		cc.RestartServer(i)
	}
	cc.WaitForLeader(leaderTimeout)
	var empty []map[string]any
	must.NoError(t, GetJSON(cc.API(), "/v1/jobs", &empty))
	must.SliceEmpty(t, empty, must.Sprint("fresh servers already know jobs"))

	out, errOut, code := RunCLIAt(t, cc.ServerHTTP(0), "operator", "snapshot", "restore", snap)
	must.EqOp(t, 0, code, must.Sprintf("restore: %s%s", out, errOut))
	t.Logf("restore: %s (%s after the fresh servers started)", strings.TrimSpace(out), time.Since(start).Round(time.Millisecond))
}

// startClientsTogether starts every client at once and waits for their
// APIs: the restored nodes are down to the servers until their clients
// heartbeat, and a node down past the failover TTL loses its claims.
func (cc *csiCluster) startClientsTogether(t *testing.T) {
	t.Helper()
	for _, c := range cc.Clients {
		must.NoError(t, c.Start())
	}
	for _, c := range cc.Clients {
		must.NoError(t, c.WaitHTTP(startTimeout))
	}
}

// TestRecovery_RestoredClaimOfStoppedAllocReleasedOnce is issue 19's
// second acceptance test: restore onto a cluster where one allocation
// stopped after the snapshot was taken. The restored state says it runs
// and holds its claim; its client reports it finished, and the claim is
// released through the lane exactly once, while the other allocation's
// claim stays without a second publish.
func TestRecovery_RestoredClaimOfStoppedAllocReleasedOnce(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 3, Clients: 3, PublishLatency: 100 * time.Millisecond, ExternalPlugins: true})

	names := []string{"vol[0]", "vol[1]"}
	exts := cc.createVolumes(t, "client-0", names...)
	for i, name := range names {
		cc.registerVolumeHTTP(t, name, exts[i])
	}
	// Each task runs until a file named done appears in its volume.
	cc.RunJob(csiJob("work", "batch", 2, "vol", true, "",
		`echo $$ > "$ROAM_TASK_DIR/data/pid"; while [ ! -e "$ROAM_TASK_DIR/data/done" ]; do sleep 0.2; done`))
	allocs := cc.waitCSIAllocs(t, "work", csiSettle, func(list []*Alloc) error {
		if r := running(list); len(r) != 2 || len(list) != 2 {
			return fmt.Errorf("%d of 2 allocations running (%d in all)", len(r), len(list))
		}
		return nil
	})
	byVolume := make(map[string]*Alloc)
	for _, a := range allocs {
		byVolume[strings.Replace(a.Name, "work.g", "vol", 1)] = a
	}
	WaitFor(t, csiSettle, func() error {
		for i, name := range names {
			v, err := cc.volume(name)
			if err != nil {
				return err
			}
			if len(v.Claims) != 1 || v.Claims[0].State != "taken" {
				return fmt.Errorf("volume %s: %s", name, claimsString(v))
			}
			if _, err := os.Stat(filepath.Join(cc.StateDir, "volumes", exts[i], "pid")); err != nil {
				return err
			}
		}
		return nil
	})
	cc.WaitEvalsSettled("work", csiSettle)

	snap := filepath.Join(cc.Dir, "backup.snap")
	out, errOut, code := RunCLIAt(t, cc.ServerHTTP(cc.Leader()), "operator", "snapshot", "save", snap)
	must.EqOp(t, 0, code, must.Sprintf("save: %s%s", out, errOut))

	// After the snapshot, vol[1]'s allocation finishes and its claim is
	// released as usual.
	stopped := byVolume["vol[1]"]
	must.NotNil(t, stopped)
	must.NoError(t, os.WriteFile(filepath.Join(cc.StateDir, "volumes", exts[1], "done"), nil, 0o644))
	WaitFor(t, csiSettle, func() error {
		v, err := cc.volume("vol[1]")
		if err != nil {
			return err
		}
		if len(v.Claims) != 0 {
			return fmt.Errorf("vol[1] still claimed: %s", claimsString(v))
		}
		return nil
	})
	before := cc.controllerCounts(t, exts)
	t.Logf("before the disaster: %v", before)
	must.EqOp(t, 1, before[exts[1]]["ControllerUnpublishVolume"])

	cc.stopAllAndWipeServers(t)
	cc.freshServersRestore(t, snap)
	// The restored state has the finished allocation running and
	// claiming vol[1].
	restored := cc.volumeClaims(t, "vol[1]")
	must.StrContains(t, restored["vol[1]"], stopped.ID, must.Sprint("the snapshot lost vol[1]'s claim"))

	cc.startClientsTogether(t)
	WaitFor(t, csiSettle, func() error {
		a, err := cc.allocByID(stopped.ID)
		if err != nil {
			return err
		}
		if a.ClientStatus != "complete" {
			return fmt.Errorf("allocation %s is %s, want complete as its client knows it", a, a.ClientStatus)
		}
		v, err := cc.volume("vol[1]")
		if err != nil {
			return err
		}
		if len(v.Claims) != 0 {
			return fmt.Errorf("vol[1] still claimed: %s", claimsString(v))
		}
		return nil
	})
	cc.WaitEvalsSettled("work", csiSettle)

	// The other allocation runs on, its claim kept and not published
	// again; the finished one's restored claim was released once.
	a, err := cc.allocByID(byVolume["vol[0]"].ID)
	must.NoError(t, err)
	must.EqOp(t, "running", a.ClientStatus)
	kept := cc.volumeClaims(t, "vol[0]")
	must.StrContains(t, kept["vol[0]"], a.ID)
	must.StrContains(t, kept["vol[0]"], "/taken")
	after := cc.controllerCounts(t, exts)
	t.Logf("after the restore: %v", after)
	must.Eq(t, before[exts[0]], after[exts[0]])
	must.EqOp(t, before[exts[1]]["ControllerPublishVolume"], after[exts[1]]["ControllerPublishVolume"])
	must.EqOp(t, 2, after[exts[1]]["ControllerUnpublishVolume"], must.Sprint("the restored claim was not released exactly once"))
	list, err := JobAllocs(cc.API(), "work")
	must.NoError(t, err)
	must.Len(t, 2, list, must.Sprintf("the finished allocation was replaced or re-run:\n%s", allocTable(list)))
	cc.mustNoOverlaps(t)
}

// TestRecovery_ClientsMeetEmptyServers is the restore done in the wrong
// order: the clients restart against the fresh, empty servers before the
// snapshot is restored. They are answered with no allocations by servers
// of another cluster, hold their allocations (no task stopped), and carry
// on once the snapshot brings their cluster back. (A client that stays up
// meets the empty servers the same way once its blocking query, still
// waiting for an index of the old cluster, returns.)
func TestRecovery_ClientsMeetEmptyServers(t *testing.T) {
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
	beforeCalls := cc.controllerCounts(t, exts)
	beforeAllocs := make(map[string]*Alloc, len(allocs))
	for _, a := range allocs {
		beforeAllocs[a.ID] = a
	}

	snap := filepath.Join(cc.Dir, "backup.snap")
	out, errOut, code := RunCLIAt(t, cc.ServerHTTP(cc.Leader()), "operator", "snapshot", "save", snap)
	must.EqOp(t, 0, code, must.Sprintf("save: %s%s", out, errOut))

	for i := range cc.Servers {
		cc.KillServer(i, syscall.SIGTERM)
	}
	for _, s := range cc.Servers {
		must.NoError(t, os.RemoveAll(s.DataDir))
	}
	for i := range cc.Servers {
		cc.RestartServer(i)
	}
	cc.WaitForLeader(leaderTimeout)
	for j := range cc.Clients {
		cc.KillClient(j, syscall.SIGTERM)
		cc.RestartClient(j)
	}
	// Every client reaches the empty servers, registers, and is answered
	// with no allocations by another cluster.
	WaitFor(t, csiSettle, func() error {
		var nodes []map[string]any
		if err := GetJSON(cc.API(), "/v1/nodes", &nodes); err != nil {
			return err
		}
		if len(nodes) != len(cc.Clients) {
			return fmt.Errorf("%d of %d clients registered with the fresh servers", len(nodes), len(cc.Clients))
		}
		return nil
	})
	// Until a client holds its allocations, or a task died.
	holding := 0
	WaitFor(t, csiSettle, func() error {
		holding = 0
		for _, c := range cc.Clients {
			if len(logLines(c, "servers answer for another cluster")) > 0 {
				holding++
			}
		}
		for _, pid := range pids {
			if n, _ := strconv.Atoi(pid); !pidAlive(n) {
				return nil
			}
		}
		if holding == 0 {
			return fmt.Errorf("no client is holding its allocations yet")
		}
		return nil
	})
	for name, pid := range pids {
		n, err := strconv.Atoi(pid)
		must.NoError(t, err)
		must.True(t, pidAlive(n), must.Sprintf("task of %s (pid %d) stopped when its client met the empty servers", name, n))
	}
	t.Logf("%d clients holding their allocations against the fresh servers", holding)

	out, errOut, code = RunCLIAt(t, cc.ServerHTTP(1), "operator", "snapshot", "restore", snap)
	must.EqOp(t, 0, code, must.Sprintf("restore: %s%s", out, errOut))
	t.Logf("restore: %s", strings.TrimSpace(out))

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
	for _, c := range cc.Clients {
		if len(logLines(c, "servers answer for another cluster")) > 0 {
			WaitFor(t, csiSettle, func() error {
				if len(logLines(c, "servers answer for this node's cluster again")) == 0 {
					return fmt.Errorf("%s has not resumed", c.Name)
				}
				return nil
			})
		}
	}
	for i, name := range names {
		b, err := os.ReadFile(filepath.Join(cc.StateDir, "volumes", exts[i], "pid"))
		must.NoError(t, err)
		must.EqOp(t, pids[name], strings.TrimSpace(string(b)), must.Sprintf("task of %s started again", name))
	}
	cc.WaitEvalsSettled("keep", csiSettle)
	must.Eq(t, beforeClaims, cc.volumeClaims(t, names...))
	must.Eq(t, beforeCalls, cc.controllerCounts(t, exts))
	cc.mustNoOverlaps(t)
}
