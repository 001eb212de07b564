//go:build e2e

package e2e

import (
	"fmt"
	"net/url"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
	"github.com/roamhq/roam/plugins/csi/hostpath"
)

// TestCSI_ControllerConcurrency runs one job of 8 allocations, each
// claiming its own volume, on a plugin left at the default (one controller
// call at a time) and then on a plugin with controller_concurrency = 4, in
// one cluster: 4 clients, 2 s per publish, at most 2 volumes per node. The
// wide plugin's job must hold every claim in under half the time the
// default's took; neither provider may see two calls on one volume or two
// publish/unpublish calls for one node at once; the default plugin sees no
// overlap of any kind, as before. Then the wide job stops, and the leader
// is killed with -9 while its unpublishes are in flight: every claim is
// still released, and still no two calls meet on a volume or a node.
func TestCSI_ControllerConcurrency(t *testing.T) {
	const wide = "hostpath-wide"
	cc := startCSICluster(t, csiOpts{
		Servers: 3, Clients: 4, ExternalPlugins: true,
		PublishLatency: 2 * time.Second, MaxVolumesPerNode: 2,
		ExtraPluginIDs:        []string{wide},
		ControllerConcurrency: map[string]int{wide: 4},
	})

	// The servers take the plugin's value, and show it.
	WaitFor(t, csiSettle, func() error {
		for id, want := range map[string]int{csiPluginID: 1, wide: 4} {
			var p api.CSIPlugin
			if err := GetJSON(cc.API(), "/v1/plugin/csi/"+url.PathEscape(id), &p); err != nil {
				return err
			}
			if p.ControllerConcurrency != want {
				return fmt.Errorf("plugin %s: ControllerConcurrency %d, want %d", id, p.ControllerConcurrency, want)
			}
		}
		return nil
	})
	out := cc.MustCLI("plugin", "status", wide)
	must.StrContains(t, out, "Controller Concurrency = 4")

	serial := cc.claimAll(t, csiPluginID, cc.StateDir, "serial", "sa")
	concurrent := cc.claimAll(t, wide, cc.Extra[wide].StateDir, "wide", "wa")
	ratio := concurrent.Seconds() / serial.Seconds()
	t.Logf("8 claims held: default %s, controller_concurrency = 4 %s (ratio %.2f)", serial.Round(time.Millisecond), concurrent.Round(time.Millisecond), ratio)
	must.Less(t, 0.5, ratio, must.Sprintf("controller_concurrency = 4 took %s against %s at the default", concurrent, serial))

	// The leader killed with the wide plugin's unpublishes in flight.
	cc.MustCLI("job", "stop", "-detach", "wide")
	WaitFor(t, csiSettle, func() error {
		calls, err := providerInFlight(cc.Extra[wide].StateDir)
		if err != nil {
			return err
		}
		n := 0
		for _, c := range calls {
			if c.Method == "ControllerUnpublishVolume" {
				n++
			}
		}
		if n < 2 {
			return fmt.Errorf("%d unpublishes in flight at the wide provider, want 2 or more", n)
		}
		return nil
	})
	leader := cc.Leader()
	cc.KillServer(leader, syscall.SIGKILL)
	killedAt := time.Now()
	cc.RestartServer(leader)
	for i := range 8 {
		cc.waitUnclaimed(t, fmt.Sprintf("wa[%d]", i))
	}
	t.Logf("leader %s killed with unpublishes in flight; every claim released %s later",
		cc.Servers[leader].Name, time.Since(killedAt).Round(time.Millisecond))

	// The providers' own record of every call.
	def := callOverlaps(t, cc.StateDir, cc.Plugins)
	wid := callOverlaps(t, cc.Extra[wide].StateDir, cc.Extra[wide].Plugins)
	t.Logf("default plugin: %s; controller_concurrency = 4: %s", def, wid)
	must.Eq(t, 0, def.sameVolume)
	must.Eq(t, 0, def.sameNode)
	must.Eq(t, 0, def.any, must.Sprint("the default plugin saw two controller calls at once"))
	cc.mustNoOverlaps(t)
	must.Eq(t, 0, wid.sameVolume, must.Sprint("two controller calls on one volume at once"))
	must.Eq(t, 0, wid.sameNode, must.Sprint("two publish/unpublish calls for one node at once"))
	// The control: the wide plugin did run calls side by side, so the
	// checks above could have failed.
	must.Positive(t, wid.any, must.Sprint("controller_concurrency = 4 never ran two calls at once"))
	must.GreaterEq(t, 8, wid.publishes)
	must.GreaterEq(t, 8, def.publishes)
}

// claimAll creates and registers 8 volumes source[0..7] of pluginID, runs
// a service job of 8 allocations each claiming its own, and returns how
// long it took from the job's registration until every allocation ran and
// held its claim.
func (cc *csiCluster) claimAll(t *testing.T, pluginID, stateDir, jobID, source string) time.Duration {
	t.Helper()
	const n = 8
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s[%d]", source, i)
	}
	sock := cc.Sockets["client-0"]
	if set := cc.Extra[pluginID]; set != nil {
		sock = set.Sockets["client-0"]
	}
	ext := createVolumesAt(t, sock, names...)
	for i, name := range names {
		cc.registerVolumeFor(t, pluginID, name, ext[i])
	}
	start := time.Now()
	cc.RunJob(csiJob(jobID, "service", n, source, true, "", "sleep 3600"))
	cc.waitCSIAllocs(t, jobID, 2*time.Minute, func(list []*Alloc) error {
		running := 0
		for _, a := range list {
			if a.ClientStatus == "failed" {
				return errFatal(fmt.Errorf("allocation %s failed: %s", a, taskEvents(a)))
			}
			if a.ClientStatus == "running" {
				running++
			}
		}
		if running != n {
			return fmt.Errorf("%d of %d allocations running", running, n)
		}
		for _, name := range names {
			v, err := cc.volume(name)
			if err != nil {
				return err
			}
			if len(v.Claims) != 1 || v.Claims[0].State != "taken" {
				return fmt.Errorf("volume %s: %s", name, claimsString(v))
			}
		}
		return nil
	})
	return time.Since(start)
}

// callOverlapCounts are pairs of controller publish/unpublish calls that ran at
// the same time at one provider.
type callOverlapCounts struct {
	any, sameVolume, sameNode int
	publishes                 int
}

func (o callOverlapCounts) String() string {
	return fmt.Sprintf("%d publishes; overlapping pairs: %d in all, %d on one volume, %d for one node",
		o.publishes, o.any, o.sameVolume, o.sameNode)
}

// callOverlaps reads the call log of every plugin process of a set (one
// provider: they share stateDir) and counts the pairs of controller
// publish and unpublish calls whose times overlap.
func callOverlaps(t *testing.T, stateDir string, procs map[string]*csiPluginProc) callOverlapCounts {
	t.Helper()
	var calls []hostpath.CallRecord
	for name := range procs {
		recs, err := hostpath.ReadCallLog(stateDir, name)
		must.NoError(t, err)
		for _, r := range recs {
			must.False(t, r.Truncated, must.Sprintf("the call log of %s is truncated", name))
			if r.Method == "ControllerPublishVolume" || r.Method == "ControllerUnpublishVolume" {
				calls = append(calls, r)
			}
		}
	}
	sort.Slice(calls, func(i, j int) bool { return calls[i].StartUnixNano < calls[j].StartUnixNano })
	var o callOverlapCounts
	for i, a := range calls {
		if a.Method == "ControllerPublishVolume" && a.Error == "" {
			o.publishes++
		}
		for _, b := range calls[i+1:] {
			if b.StartUnixNano >= a.EndUnixNano {
				break
			}
			o.any++
			if a.VolumeID == b.VolumeID {
				o.sameVolume++
			}
			if a.NodeID == b.NodeID {
				o.sameNode++
			}
		}
	}
	return o
}
