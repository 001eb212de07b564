//go:build e2e

package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// TestCSI_WriterThenReaderOnAnotherNode writes a token into a
// single-node-writer volume from a batch job on one node, waits for the
// claim to be released, and reads the token back from a batch job on
// another node: the volume moved between nodes without losing data, and no
// plugin saw overlapping controller calls.
//
// It is the one CSI test whose plugins run outside Roam, named by socket in
// each client's config (client { csi_plugin "hostpath" { socket = ... } }),
// so that path stays covered; the others run the plugin as a system job.
func TestCSI_WriterThenReaderOnAnotherNode(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 3, Clients: 3, PublishLatency: 200 * time.Millisecond, ExternalPlugins: true})

	ext := cc.createVolumes(t, "client-0", "vol1")
	cc.registerVolumeCLI(t, "vol1", ext[0])

	tokenBytes := make([]byte, 8)
	_, err := rand.Read(tokenBytes)
	must.NoError(t, err)
	token := "token-" + hex.EncodeToString(tokenBytes)

	cc.RunJob(csiJob("writer", "batch", 1, "vol1", false, "",
		fmt.Sprintf(`echo %s > "$ROAM_TASK_DIR/data/token"`, token)))
	writer := cc.waitCSIAllocs(t, "writer", csiSettle, oneAlloc("complete"))[0]
	t.Logf("writer %s completed on %s", writer, writer.NodeName)

	// A finished writer's claim is released by the volume watcher.
	WaitFor(t, csiSettle, func() error {
		v, err := cc.volume("vol1")
		if err != nil {
			return err
		}
		if len(v.Claims) != 0 || len(v.WriteAllocs) != 0 || len(v.ReadAllocs) != 0 {
			return fmt.Errorf("volume vol1 still claimed: %s", claimsString(v))
		}
		return nil
	})

	cc.SetEligible(writer.NodeID, false)
	cc.RunJob(csiJob("reader", "batch", 1, "vol1", false, "",
		`cat "$ROAM_TASK_DIR/data/token"`))
	reader := cc.waitCSIAllocs(t, "reader", csiSettle, oneAlloc("complete"))[0]
	must.NotEq(t, writer.NodeID, reader.NodeID, must.Sprint("reader ran on the writer's node"))

	out := cc.MustCLI("alloc", "logs", reader.ID, "t")
	must.StrContains(t, out, token)

	cc.mustNoOverlaps(t)
	// Every controller publish went to the lowest-ID controller.
	order := cc.controllerOrder()
	for i, name := range order {
		calls, err := cc.calls(name)
		must.NoError(t, err)
		t.Logf("controller calls of %s (rank %d): %v", name, i, calls)
		if i == 0 {
			must.GreaterEq(t, 2, calls["ControllerPublishVolume"])
			must.GreaterEq(t, 1, calls["ControllerUnpublishVolume"])
		} else {
			must.Eq(t, 0, calls["ControllerPublishVolume"], must.Sprintf("publishes reached %s, not the lowest-ID controller %s", name, order[0]))
		}
	}
}

// TestCSI_ManyClaimsOnePlugin places 50 allocations, each with its own
// per_alloc volume, at once: every claim settles as taken, every publish
// reaches the one lowest-ID controller, and none overlaps another.
func TestCSI_ManyClaimsOnePlugin(t *testing.T) {
	const n = 50
	cc := startCSICluster(t, csiOpts{
		Servers: 3, Clients: 3,
		PublishLatency:    200 * time.Millisecond,
		MaxVolumesPerNode: 2 * n,
	})

	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("vol[%d]", i)
	}
	ext := cc.createVolumes(t, "client-0", names...)
	for i, name := range names {
		cc.registerVolumeHTTP(t, name, ext[i])
	}

	start := time.Now()
	cc.RunJob(csiJob("many", "service", n, "vol", true, "", sleepScript))
	allocs := cc.waitCSIAllocs(t, "many", 2*csiSettle, func(list []*Alloc) error {
		for _, a := range list {
			if a.ClientStatus == "failed" {
				return errFatal(fmt.Errorf("allocation %s failed: %s", a, taskEvents(a)))
			}
		}
		if r := running(list); len(r) != n || len(list) != n {
			return fmt.Errorf("%d of %d allocations running (%d in all)", len(r), n, len(list))
		}
		return nil
	})
	t.Logf("%d allocations running after %s", n, time.Since(start).Round(time.Millisecond))

	byName := make(map[string]*Alloc, n)
	for _, a := range allocs {
		byName[a.Name] = a
	}
	for i, vol := range names {
		a := byName[fmt.Sprintf("many.g[%d]", i)]
		must.NotNil(t, a, must.Sprintf("no allocation many.g[%d]:\n%s", i, allocTable(allocs)))
		v, err := cc.volume(vol)
		must.NoError(t, err)
		must.Len(t, 1, v.Claims, must.Sprintf("volume %s: %s", vol, claimsString(v)))
		c := v.Claims[0]
		must.Eq(t, "taken", c.State, must.Sprintf("volume %s: %s", vol, claimsString(v)))
		must.Eq(t, a.ID, c.AllocationID, must.Sprintf("volume %s claimed by another allocation than %s", vol, a))
		must.Eq(t, a.NodeID, c.NodeID, must.Sprintf("volume %s claimed for another node than %s", vol, a))
	}

	cc.mustNoOverlaps(t)
	order := cc.controllerOrder()
	for i, name := range order {
		calls, err := cc.calls(name)
		must.NoError(t, err)
		t.Logf("controller calls of %s (rank %d): %v", name, i, calls)
		want := int64(0)
		if i == 0 {
			want = n
		}
		must.Eq(t, want, calls["ControllerPublishVolume"], must.Sprintf("ControllerPublishVolume calls on %s (lowest-ID controller is %s)", name, order[0]))
	}
}

// TestCSI_KillClientHoldingClaim kills (-9) the client running a service
// allocation with a single-node-writer volume, together with its plugin:
// once the node is down the old claim is freed with a controller unpublish
// from a surviving controller, and a replacement on another node takes the
// volume. At no point do two allocations hold the volume.
func TestCSI_KillClientHoldingClaim(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 3, Clients: 3, PublishLatency: 200 * time.Millisecond})

	ext := cc.createVolumes(t, "client-0", "vol1")
	cc.registerVolumeHTTP(t, "vol1", ext[0])

	cc.RunJob(csiJob("holder", "service", 1, "vol1", false, "", sleepScript))
	old := cc.waitCSIAllocs(t, "holder", csiSettle, oneAlloc("running"))[0]
	WaitFor(t, csiSettle, func() error {
		v, err := cc.volume("vol1")
		if err != nil {
			return err
		}
		if len(v.Claims) != 1 || v.Claims[0].AllocationID != old.ID || v.Claims[0].State != "taken" {
			return fmt.Errorf("want one taken claim by %s: %s", old, claimsString(v))
		}
		return nil
	})

	// The operator's view of the live claim: one row naming the alloc, its
	// node, the mode and the state, short IDs by default and full with
	// -verbose.
	out := cc.MustCLI("volume", "status", "vol1")
	must.StrContains(t, out, "Claims")
	must.True(t, claimRow(out, old.ID[:8], old.NodeID[:8], "write", "taken"), must.Sprintf("volume status:\n%s", out))
	out = cc.MustCLI("volume", "status", "-verbose", "vol1")
	must.True(t, claimRow(out, old.ID, old.NodeID, "write", "taken"), must.Sprintf("volume status -verbose:\n%s", out))

	victim := cc.clientName(old.NodeID)
	must.NotEq(t, "", victim)
	var survivors []string
	for name := range cc.NodeIDs {
		if name != victim {
			survivors = append(survivors, name)
		}
	}
	order := cc.controllerOrder(survivors...)
	before, err := cc.calls(order[0])
	must.NoError(t, err)
	t.Logf("killing %s (node %.8s, holds %s); controllers by rank: all %v, survivors %v",
		victim, old.NodeID, shortAlloc(old.ID), cc.controllerOrder(), order)

	killed := time.Now()
	cc.KillClient(cc.clientIndex(victim), syscall.SIGKILL)
	must.NoError(t, cc.Plugins[victim].Signal(syscall.SIGKILL))
	_, err = cc.Plugins[victim].Wait(killTimeout)
	must.NoError(t, err)

	// The node's TTL (min 2s, failover 4s) plus grace (2s), the watcher's
	// round and a 200ms unpublish: well within this bound.
	const freeBound = 30 * time.Second
	var freedAfter time.Duration
	WaitFor(t, freeBound, func() error {
		v, err := cc.volume("vol1")
		if err != nil {
			return err
		}
		writers := 0
		for _, c := range v.Claims {
			if c.Mode == "write" || c.Mode == "" {
				writers++
			}
			if c.AllocationID == old.ID {
				return fmt.Errorf("claim of %s not freed yet: %s", shortAlloc(old.ID), claimsString(v))
			}
		}
		if writers > 1 {
			t.Errorf("volume vol1 has %d write claims at once: %s", writers, claimsString(v))
		}
		freedAfter = time.Since(killed)
		return nil
	})
	t.Logf("claim of %s freed %s after the kill", shortAlloc(old.ID), freedAfter.Round(time.Millisecond))

	WaitFor(t, freeBound, func() error {
		after, err := cc.calls(order[0])
		if err != nil {
			return err
		}
		if after["ControllerUnpublishVolume"] <= before["ControllerUnpublishVolume"] {
			return fmt.Errorf("no new ControllerUnpublishVolume on %s (lowest surviving controller): before %v, now %v", order[0], before, after)
		}
		return nil
	})

	var repl *Alloc
	WaitFor(t, csiSettle, func() error {
		list, err := JobAllocs(cc.API(), "holder")
		if err != nil {
			return err
		}
		// The first placement after the node is lost must get the volume:
		// the scheduler counts the lost allocation's claim as free, so the
		// claim must wait for the watcher to free it rather than fail the
		// allocation (Nomad #8609, a failure mode DESIGN.md rules out).
		for _, a := range list {
			if a.ID != old.ID && a.ClientStatus == "failed" {
				t.Fatalf("replacement %s failed %s after the kill: %s\nallocations:\n%s",
					a, time.Since(killed).Round(time.Millisecond), taskEvents(a), allocTable(list))
			}
		}
		r := running(list)
		if len(r) != 1 || r[0].ID == old.ID {
			return fmt.Errorf("want one running replacement of %s:\n%s", shortAlloc(old.ID), allocTable(list))
		}
		repl = r[0]
		v, err := cc.volume("vol1")
		if err != nil {
			return err
		}
		if len(v.Claims) != 1 || v.Claims[0].AllocationID != repl.ID || v.Claims[0].State != "taken" {
			return fmt.Errorf("want one taken claim by %s: %s", repl, claimsString(v))
		}
		return nil
	})
	must.NotEq(t, old.NodeID, repl.NodeID, must.Sprint("replacement on the dead node"))
	must.Eq(t, old.ID, repl.PreviousAllocation, must.Sprintf("replacement %s does not replace %s directly", repl, shortAlloc(old.ID)))
	t.Logf("replacement %s running on %s %s after the kill", repl, repl.NodeName, time.Since(killed).Round(time.Millisecond))
	if list, err := JobAllocs(cc.API(), "holder"); err == nil {
		for _, a := range list {
			t.Logf("  %s: %s", a, taskEvents(a))
		}
	}

	for _, name := range survivors {
		n, err := cc.overlaps(name)
		must.NoError(t, err)
		must.Eq(t, 0, n, must.Sprintf("plugin of %s counted overlapping controller calls:\n%s", name, cc.Plugins[name].LogTail(40)))
	}
	// The killed plugin's records stay on disk; they must be clean too.
	n, err := cc.overlaps(victim)
	must.NoError(t, err)
	must.Eq(t, 0, n)
}

// claimRow reports whether the claims table printed by `roam volume status`
// has a row with exactly these columns.
func claimRow(out string, cols ...string) bool {
	_, table, ok := strings.Cut(out, "\nClaims\n")
	if !ok {
		return false
	}
	for _, line := range strings.Split(table, "\n") {
		if slices.Equal(strings.Fields(line), cols) {
			return true
		}
	}
	return false
}
