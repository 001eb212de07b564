//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// faultHangControllerUnpublish is hostpath.FaultHangControllerUnpublish.
const faultHangControllerUnpublish = "fault-hang-controller-unpublish"

// A CSI controller plugin killed with -9 in the middle of a publish, and
// again in the middle of an unpublish, on two clients whose plugins are
// both controllers: as a plugin task (its client restarts it) and as a
// static plugin started outside Roam (its supervisor, here the test,
// starts it again). Each call hangs at the provider until the kill, so
// the kill lands mid-call. The claim must still end taken by the running
// allocation, then released once the job stops; the plugin that answers
// is the restarted one or the other client's; the provider never has two
// destructive calls in flight at once; and claim churn on two more volumes
// through both kills ends with no acknowledged claim lost and no two
// writers on a volume.
func TestFaults_PluginKilledMidCall(t *testing.T) {
	for _, mode := range []string{"task", "static"} {
		t.Run(mode, func(t *testing.T) {
			opts := csiOpts{Servers: 1, Clients: 2, PublishLatency: 200 * time.Millisecond, ExternalPlugins: mode == "static"}
			if mode == "task" {
				opts.PluginGroupExtra = pluginRestartAlways
			}
			cc := startCSICluster(t, opts)
			// Claim churn on two more volumes of the same plugin runs
			// through both kills, for the three counts.
			ch := newClaimChurn(t, cc, 2)
			t.Cleanup(ch.halt)
			ch.start(time.Now().UnixNano() % 1e6)
			exts := cc.createVolumes(t, "client-0", "kv")
			cc.registerVolumeHTTP(t, "kv", exts[0])
			vols := []volRef{{ID: "kv", ExtID: exts[0], StateDir: cc.StateDir}}
			volFor := func(*Alloc) string { return "kv" }

			// Mid-publish: the first controller in the leader's order hangs.
			first := cc.controllerOrder()[0]
			cc.RunJob(csiJob("kv", "service", 1, "kv", false, "", sleepScript))
			on := cc.killMidCall(t, faultHangControllerPublish+"-"+first, "ControllerPublishVolume")
			must.EqOp(t, first, on)
			alloc := cc.waitCSIAllocs(t, "kv", csiSettle, oneAlloc("running"))[0]
			cc.waitClaim(t, "kv", alloc.ID)
			WaitFor(t, csiSettle, func() error { return cc.claimsSettled(vols, []string{"kv"}, volFor) })
			cc.mustNoOverlaps(t)
			ch.waitCycled(mode+": after the kill mid-publish", 2)
			pubs := cc.totalCalls(t, "ControllerPublishVolume")
			t.Logf("%s: publish killed on %s; claim taken by %s; %d ControllerPublishVolume calls answered at the plugins",
				mode, on, alloc.ID[:8], pubs)
			must.Positive(t, pubs)

			// Mid-unpublish, on whichever controller the leader calls.
			cc.MustCLI("job", "stop", "-detach", "kv")
			on = cc.killMidCall(t, faultHangControllerUnpublish, "ControllerUnpublishVolume")
			cc.waitUnclaimed(t, "kv")
			WaitFor(t, csiSettle, func() error { return cc.claimsSettled(vols, []string{"kv"}, volFor) })
			cc.mustNoOverlaps(t)
			t.Logf("%s: unpublish killed on %s; claim released; %d ControllerUnpublishVolume calls answered",
				mode, on, cc.totalCalls(t, "ControllerUnpublishVolume"))

			ch.waitCycled(mode+": after the kill mid-unpublish", 2)
			rep := ch.check(t, "plugin killed ("+mode+")", time.Now(), vols, []string{"kv"}, volFor)
			must.Positive(t, rep.Cycles, must.Sprint("the churn cycled no claim: its zero counts would prove nothing"))
		})
	}
}

// killMidCall switches on the hang fault file fault (in the plugins'
// state dir), waits until method hangs in flight at the provider, kills
// that instance's plugin with -9, switches the fault off, and waits until
// the plugin runs again (restarted by its client, or started here for a
// static plugin). It returns the client whose plugin it killed.
func (cc *csiCluster) killMidCall(t *testing.T, fault, method string) string {
	t.Helper()
	path := filepath.Join(cc.StateDir, fault)
	must.NoError(t, os.WriteFile(path, []byte("forever\n"), 0o644))
	t.Cleanup(func() { _ = os.Remove(path) })
	var on string
	WaitFor(t, csiSettle, func() error {
		calls, err := providerInFlight(cc.StateDir)
		if err != nil {
			return err
		}
		for _, c := range calls {
			if c.Method == method {
				on = c.NodeID
				return nil
			}
		}
		return fmt.Errorf("want a %s in flight at the provider: %+v", method, calls)
	})
	p := cc.Plugins[on]
	must.NotNil(t, p, must.Sprintf("no plugin instance of %s", on))
	pid := p.PID()
	must.Positive(t, pid)
	must.NoError(t, p.Signal(syscall.SIGKILL))
	if _, err := p.Wait(killTimeout); err != nil {
		t.Fatalf("%s: %v", p.Name(), err)
	}
	must.NoError(t, os.Remove(path))
	if p.External() {
		must.NoError(t, p.agent.Start())
	}
	WaitFor(t, csiSettle, func() error {
		if n := p.PID(); n == 0 || n == pid {
			return fmt.Errorf("%s not running again after kill -9 of pid %d", p.Name(), pid)
		}
		return nil
	})
	return on
}
