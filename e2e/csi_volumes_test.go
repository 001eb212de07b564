//go:build e2e

package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
)

// CSI acceptance: a volume follows its allocation through a drain and a
// reschedule, and survives a restart of the client that holds it.

// randomToken returns a fresh token to write into a volume.
func randomToken(t *testing.T) string {
	t.Helper()
	b := make([]byte, 8)
	_, err := rand.Read(b)
	must.NoError(t, err)
	return "token-" + hex.EncodeToString(b)
}

// volumeFile is the path of name inside the data of the volume with
// external ID ext: every plugin process keeps volume data under the shared
// state directory.
func (cc *csiCluster) volumeFile(ext, name string) string {
	return filepath.Join(cc.StateDir, "volumes", ext, name)
}

// waitClaim polls volID until it has exactly one claim, by allocID and
// in state taken, and returns it.
func (cc *csiCluster) waitClaim(t *testing.T, volID, allocID string) *api.CSIVolumeClaim {
	t.Helper()
	var claim *api.CSIVolumeClaim
	WaitFor(t, csiSettle, func() error {
		v, err := cc.volume(volID)
		if err != nil {
			return err
		}
		if len(v.Claims) != 1 || v.Claims[0].AllocationID != allocID || v.Claims[0].State != "taken" {
			return fmt.Errorf("want one taken claim by %s: %s", shortAlloc(allocID), claimsString(v))
		}
		claim = v.Claims[0]
		return nil
	})
	return claim
}

// waitUnclaimed polls volID until no allocation claims it.
func (cc *csiCluster) waitUnclaimed(t *testing.T, volID string) {
	t.Helper()
	WaitFor(t, csiSettle, func() error {
		v, err := cc.volume(volID)
		if err != nil {
			return err
		}
		if len(v.Claims) != 0 || len(v.WriteAllocs) != 0 || len(v.ReadAllocs) != 0 {
			return fmt.Errorf("volume %s still claimed: %s", volID, claimsString(v))
		}
		return nil
	})
}

// totalCalls sums method's calls over every plugin process.
func (cc *csiCluster) totalCalls(t *testing.T, method string) int64 {
	t.Helper()
	var n int64
	for name := range cc.Plugins {
		calls, err := cc.calls(name)
		must.NoError(t, err)
		n += calls[method]
	}
	return n
}

// TestCSI_DrainWithVolume drains the node whose service allocation holds a
// single-node-writer volume, that node also hosting the lowest-ID
// controller: the replacement runs elsewhere and reads what the first
// allocation wrote, the old claim is freed, the drain completes, and every
// controller call still goes to the drained node's (healthy) controller.
func TestCSI_DrainWithVolume(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 1, Clients: 3, PublishLatency: 200 * time.Millisecond})
	ext := cc.createVolumes(t, "client-0", "vol1")
	cc.registerVolumeHTTP(t, "vol1", ext[0])
	token := randomToken(t)

	// Place the job on the node of the lowest-ID controller: the others are
	// ineligible until it runs.
	order := cc.controllerOrder()
	target := order[0]
	for _, name := range order[1:] {
		cc.SetEligible(cc.NodeIDs[name], false)
	}
	// The first allocation writes the token; a later one finds it, copies
	// it and prints it.
	script := fmt.Sprintf(`D="$ROAM_TASK_DIR/data"
if [ -f "$D/token" ]; then
  cp "$D/token" "$D/token-seen"
  echo "found $(cat "$D/token")"
else
  echo %s > "$D/token"
  echo wrote
fi
exec sleep 3600`, token)
	cc.RunJob(csiJob("holder", "service", 1, "vol1", false, "", script))
	old := cc.waitCSIAllocs(t, "holder", csiSettle, oneAlloc("running"))[0]
	must.Eq(t, cc.NodeIDs[target], old.NodeID, must.Sprintf("%s placed on %s, want %s", old, old.NodeName, target))
	cc.waitClaim(t, "vol1", old.ID)
	for _, name := range order[1:] {
		cc.SetEligible(cc.NodeIDs[name], true)
	}
	WaitFor(t, csiSettle, func() error {
		b, err := os.ReadFile(cc.volumeFile(ext[0], "token"))
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(b)) != token {
			return fmt.Errorf("token file holds %q, want %q", b, token)
		}
		return nil
	})
	before, err := cc.calls(target)
	must.NoError(t, err)
	t.Logf("draining %s (lowest-ID controller, runs %s); controller calls so far %v", target, old, before)

	start := time.Now()
	// A plain drain: the node's plugin (a system job) must outlive the
	// allocation whose volume it still has to unpublish, and go only once
	// no claim names the node.
	drain(cc.Cluster, old.NodeID, "-deadline", "60s")

	var repl *Alloc
	WaitFor(t, csiSettle, func() error {
		list, err := JobAllocs(cc.API(), "holder")
		if err != nil {
			return err
		}
		for _, a := range list {
			if a.ID != old.ID && a.ClientStatus == "failed" {
				t.Fatalf("replacement %s failed: %s\nallocations:\n%s", a, taskEvents(a), allocTable(list))
			}
		}
		r := running(list)
		if len(r) != 1 || r[0].ID == old.ID {
			return fmt.Errorf("want one running replacement of %s:\n%s", shortAlloc(old.ID), allocTable(list))
		}
		repl = r[0]
		return nil
	})
	must.NotEq(t, old.NodeID, repl.NodeID, must.Sprintf("replacement %s on the drained node", repl))
	must.Eq(t, old.ID, repl.PreviousAllocation, must.Sprintf("replacement %s does not replace %s", repl, shortAlloc(old.ID)))
	cc.waitClaim(t, "vol1", repl.ID)
	node := waitDrained(t, cc.Cluster, old.NodeID, drainSettle)
	must.False(t, node.Drain)
	t.Logf("replacement %s running on %s; drain done %s after it began", repl, repl.NodeName, time.Since(start).Round(time.Millisecond))

	// The replacement saw the token, in its log and in the volume.
	WaitFor(t, csiSettle, func() error {
		out, errOut, code := cc.RunCLI("alloc", "logs", repl.ID, "t")
		if code != 0 {
			return fmt.Errorf("alloc logs: exit %d: %s", code, errOut)
		}
		if !strings.Contains(out, "found "+token) {
			return fmt.Errorf("replacement log %q lacks the token %s", out, token)
		}
		return nil
	})
	seen, err := os.ReadFile(cc.volumeFile(ext[0], "token-seen"))
	must.NoError(t, err)
	must.Eq(t, token, strings.TrimSpace(string(seen)))

	// The detach from the drained node went to the lowest-ID controller,
	// the drained node's own, which draining does not make unhealthy; its
	// plugin stopped only after that. The attach for the replacement went
	// to the lowest-ID controller still running then: that one, or the
	// next if the plugin had already gone.
	publishes := 0
	for i, name := range order {
		calls, err := cc.calls(name)
		must.NoError(t, err)
		t.Logf("controller calls of %s (rank %d): %v", name, i, calls)
		publishes += int(calls["ControllerPublishVolume"])
		switch i {
		case 0:
			must.Eq(t, 1, calls["ControllerUnpublishVolume"], must.Sprintf("the drained node's controller %s did not detach", name))
			must.Positive(t, calls["ControllerPublishVolume"])
		case 1:
			must.Eq(t, 0, calls["ControllerUnpublishVolume"], must.Sprintf("unpublishes reached %s, not the lowest-ID controller %s", name, target))
		default:
			must.Eq(t, 0, calls["ControllerPublishVolume"]+calls["ControllerUnpublishVolume"],
				must.Sprintf("calls reached %s, past the two lowest-ID controllers", name))
		}
	}
	must.Eq(t, 2, publishes)
	plugins, err := JobAllocs(cc.API(), csiPluginJobID(csiPluginID))
	must.NoError(t, err)
	for _, a := range plugins {
		if a.NodeID == old.NodeID {
			must.Eq(t, "stop", a.DesiredStatus, must.Sprintf("plugin %s on the drained node", a))
			must.True(t, a.ClientTerminal(), must.Sprintf("plugin %s on the drained node", a))
		}
	}
	cc.mustNoOverlaps(t)
}

// TestCSI_RescheduleWithVolume fails a service allocation that wrote a
// marker into its volume: the rescheduled allocation claims the volume
// again and sees the marker, the first claim is freed, and once both
// allocations have failed no claim remains.
func TestCSI_RescheduleWithVolume(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 1, Clients: 3, PublishLatency: 200 * time.Millisecond})
	ext := cc.createVolumes(t, "client-0", "vol1")
	cc.registerVolumeHTTP(t, "vol1", ext[0])

	policy := `    reschedule {
      attempts       = 1
      interval       = "1h"
      delay          = "1s"
      delay_function = "constant"
      # a service job's default policy is unlimited, which ignores attempts
      unlimited      = false
    }
    restart {
      attempts = 0
      mode     = "fail"
    }
`
	// Each attempt lists the markers of earlier ones, leaves its own and,
	// after a pause long enough to observe its claim, fails.
	script := `D="$ROAM_TASK_DIR/data"
echo "markers before: $(cd "$D" && ls attempt-* 2>/dev/null | tr '\n' ' ')"
touch "$D/attempt-$ROAM_ALLOC_ID"
sleep 3
exit 1`
	cc.RunJob(csiJob("flaky", "service", 1, "vol1", false, policy, script))

	first := cc.waitCSIAllocs(t, "flaky", csiSettle, func(list []*Alloc) error {
		if len(list) == 0 {
			return fmt.Errorf("no allocation yet")
		}
		return nil
	})[0]
	cc.waitClaim(t, "vol1", first.ID)

	// The replacement's claim is taken while it runs, after the first
	// claim is gone.
	var second *Alloc
	WaitFor(t, csiSettle, func() error {
		list, err := JobAllocs(cc.API(), "flaky")
		if err != nil {
			return err
		}
		for _, a := range list {
			if a.PreviousAllocation == first.ID {
				second = a
			}
		}
		if second == nil {
			return fmt.Errorf("no replacement of %s yet:\n%s", shortAlloc(first.ID), allocTable(list))
		}
		v, err := cc.volume("vol1")
		if err != nil {
			return err
		}
		if len(v.Claims) != 1 || v.Claims[0].AllocationID != second.ID || v.Claims[0].State != "taken" {
			return fmt.Errorf("want one taken claim by %s: %s", shortAlloc(second.ID), claimsString(v))
		}
		return nil
	})
	t.Logf("replacement %s of %s took the volume", second, shortAlloc(first.ID))

	list := cc.waitCSIAllocs(t, "flaky", csiSettle, func(list []*Alloc) error {
		if len(list) != 2 {
			return fmt.Errorf("want 2 allocations, have %d", len(list))
		}
		for _, a := range list {
			if a.ClientStatus != "failed" {
				return fmt.Errorf("allocation %s is %s, want failed", a, a.ClientStatus)
			}
		}
		return nil
	})
	for _, a := range list {
		t.Logf("  %s: %s; reschedule events: %s", a, taskEvents(a), rescheduleEvents(a))
	}
	cc.waitUnclaimed(t, "vol1")

	// The second attempt saw the first one's marker.
	out := cc.MustCLI("alloc", "logs", second.ID, "t")
	must.StrContains(t, out, "attempt-"+first.ID, must.Sprintf("second attempt's log: %q", out))
	for _, a := range []*Alloc{first, second} {
		_, err := os.Stat(cc.volumeFile(ext[0], "attempt-"+a.ID))
		must.NoError(t, err, must.Sprintf("marker of %s", shortAlloc(a.ID)))
	}

	// No third attempt: the policy allows one reschedule.
	cc.WaitEvalsSettled("flaky", csiSettle)
	list, err := JobAllocs(cc.API(), "flaky")
	must.NoError(t, err)
	var lineage strings.Builder
	for _, a := range list {
		fmt.Fprintf(&lineage, "  %s reschedule events: %s\n", a, rescheduleEvents(a))
	}
	must.Len(t, 2, list, must.Sprintf("a second reschedule despite attempts = 1:\n%s", lineage.String()))

	must.Eq(t, 2, cc.totalCalls(t, "ControllerPublishVolume"))
	must.Eq(t, 2, cc.totalCalls(t, "ControllerUnpublishVolume"))
	cc.mustNoOverlaps(t)
}

// TestCSI_ClientRestartKeepsVolume restarts the client that runs an
// allocation with a mounted volume, after SIGTERM and then after SIGKILL,
// while its plugin keeps running: the allocation and its task survive, the
// plugin task outlives the client and the restarted client re-attaches to
// it (same allocation, same process) and fingerprints it healthy again,
// the claim is untouched and no second controller publish reaches any
// plugin.
func TestCSI_ClientRestartKeepsVolume(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 1, Clients: 2, PublishLatency: 200 * time.Millisecond})
	ext := cc.createVolumes(t, "client-0", "vol1")
	cc.registerVolumeHTTP(t, "vol1", ext[0])

	cc.RunJob(csiJob("holder", "service", 1, "vol1", false, "",
		`echo $$ > "$ROAM_TASK_DIR/data/pid"; exec sleep 3600`))
	alloc := cc.waitCSIAllocs(t, "holder", csiSettle, oneAlloc("running"))[0]
	claim := cc.waitClaim(t, "vol1", alloc.ID)
	var pid int
	WaitFor(t, csiSettle, func() error {
		b, err := os.ReadFile(cc.volumeFile(ext[0], "pid"))
		if err != nil {
			return err
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return err
		}
		if !pidAlive(pid) {
			return fmt.Errorf("task pid %d not alive", pid)
		}
		return nil
	})
	must.Eq(t, 1, cc.totalCalls(t, "ControllerPublishVolume"))
	v, err := cc.volume("vol1")
	must.NoError(t, err)
	volIndex := v.ModifyIndex

	name := cc.clientName(alloc.NodeID)
	idx := cc.clientIndex(name)
	must.NonNegative(t, idx)
	client := cc.Clients[idx]
	plugin := cc.Plugins[name]
	pluginPID := plugin.PID()
	must.Positive(t, pluginPID, must.Sprintf("no plugin process for %s", name))
	pluginAlloc := cc.pluginAlloc(t, csiPluginID, alloc.NodeID)
	t.Logf("%s runs %s, task pid %d, plugin pid %d (allocation %s), claim %+v",
		name, alloc, pid, pluginPID, shortAlloc(pluginAlloc), *claim)

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		before := nodeCSIInfo(t, cc, alloc.NodeID)
		cc.KillClient(idx, sig)
		must.True(t, plugin.Running(), must.Sprint("plugin exited with its client"))
		must.Eq(t, pluginPID, plugin.PID(), must.Sprintf("after %s the plugin process changed", sig))
		start := time.Now()
		cc.RestartClient(idx)

		// The restarted client restores the allocation and finds its
		// plugin healthy again.
		WaitFor(t, csiSettle, func() error {
			log := client.Log()
			i := strings.LastIndex(log, "==== e2e: start #")
			if i < 0 {
				return fmt.Errorf("no start marker in %s's log", name)
			}
			log = log[i:]
			if !strings.Contains(log, "restoring allocation") || !strings.Contains(log, alloc.ID) {
				return fmt.Errorf("%s has not restored %s yet", name, shortAlloc(alloc.ID))
			}
			if !strings.Contains(log, "csi plugin healthy") {
				return fmt.Errorf("%s has not found its plugin healthy yet", name)
			}
			n, err := cc.nodeInfo(alloc.NodeID)
			if err != nil {
				return err
			}
			info := n.CSINodePlugins[csiPluginID]
			if n.Status != "ready" || info == nil || !info.Healthy {
				return fmt.Errorf("node %s is %s, node plugin %+v", n.Name, n.Status, info)
			}
			if c := n.CSIControllerPlugins[csiPluginID]; c == nil || !c.Healthy {
				return fmt.Errorf("node %s controller plugin %+v", n.Name, c)
			}
			if !info.UpdateTime.After(before.UpdateTime) {
				return fmt.Errorf("node plugin of %s not fingerprinted again (update time %s)", n.Name, info.UpdateTime)
			}
			return nil
		})
		t.Logf("after %s: %s restored %s and its plugin in %s", sig, name, shortAlloc(alloc.ID), time.Since(start).Round(time.Millisecond))

		list := cc.waitCSIAllocs(t, "holder", csiSettle, oneAlloc("running"))
		must.Eq(t, alloc.ID, list[0].ID, must.Sprintf("after %s the allocation changed: %s", sig, list[0]))
		must.True(t, pidAlive(pid), must.Sprintf("after %s task pid %d is gone", sig, pid))
		b, err := os.ReadFile(cc.volumeFile(ext[0], "pid"))
		must.NoError(t, err)
		must.Eq(t, strconv.Itoa(pid), strings.TrimSpace(string(b)), must.Sprintf("after %s the task started again", sig))

		v, err := cc.volume("vol1")
		must.NoError(t, err)
		must.Len(t, 1, v.Claims, must.Sprintf("after %s: %s", sig, claimsString(v)))
		must.Eq(t, *claim, *v.Claims[0], must.Sprintf("after %s the claim changed", sig))
		if v.ModifyIndex != volIndex {
			t.Logf("after %s the volume's ModifyIndex moved from %d to %d (claim unchanged)", sig, volIndex, v.ModifyIndex)
		}
		must.Eq(t, 1, cc.totalCalls(t, "ControllerPublishVolume"), must.Sprintf("after %s a second controller publish reached a plugin", sig))
		must.Eq(t, 0, cc.totalCalls(t, "ControllerUnpublishVolume"), must.Sprintf("after %s a controller unpublish reached a plugin", sig))
		// The restarted client took its plugin task back rather than
		// starting another one.
		must.Eq(t, pluginPID, plugin.PID(), must.Sprintf("after %s the restarted client started its plugin again", sig))
		must.Eq(t, pluginAlloc, cc.pluginAlloc(t, csiPluginID, alloc.NodeID), must.Sprintf("after %s the plugin allocation changed", sig))
	}
	cc.mustNoOverlaps(t)
}

// pluginAlloc returns the ID of the one running allocation of pluginID's
// system job on nodeID; with ExternalPlugins, "" (no job).
func (cc *csiCluster) pluginAlloc(t *testing.T, pluginID, nodeID string) string {
	t.Helper()
	if p := cc.Plugins[cc.clientName(nodeID)]; p == nil || p.External() {
		return ""
	}
	list, err := JobAllocs(cc.API(), csiPluginJobID(pluginID))
	must.NoError(t, err)
	r := onNode(running(list), nodeID)
	must.Len(t, 1, r, must.Sprintf("running allocations of %s on node %.8s:\n%s", csiPluginJobID(pluginID), nodeID, allocTable(list)))
	return r[0].ID
}

// nodeInfo reads /v1/node/:id with its CSI plugin fingerprints.
func (cc *csiCluster) nodeInfo(nodeID string) (*api.Node, error) {
	var n api.Node
	err := GetJSON(cc.API(), "/v1/node/"+nodeID, &n)
	return &n, err
}

// nodeCSIInfo returns nodeID's fingerprint of the CSI node plugin.
func nodeCSIInfo(t *testing.T, cc *csiCluster, nodeID string) api.CSIInfo {
	t.Helper()
	n, err := cc.nodeInfo(nodeID)
	must.NoError(t, err)
	info := n.CSINodePlugins[csiPluginID]
	must.NotNil(t, info, must.Sprintf("node %s has no %s node plugin", n.Name, csiPluginID))
	return *info
}

// rescheduleEvents renders a's reschedule tracker.
func rescheduleEvents(a *Alloc) string {
	if a.RescheduleTracker == nil || len(a.RescheduleTracker.Events) == 0 {
		return "none"
	}
	var parts []string
	for _, e := range a.RescheduleTracker.Events {
		parts = append(parts, fmt.Sprintf("[prev=%.8s at %s delay %s]", e.PrevAllocID, time.Unix(0, e.RescheduleTime).Format("15:04:05.000"), e.Delay))
	}
	return strings.Join(parts, " ")
}
