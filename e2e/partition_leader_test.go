//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// Scenarios 1 and 2 of issue 14: the leader is cut off from both
// followers, or frozen for 5 s, while a controller publish it sent is in
// flight. The followers elect a new leader, which resumes the claim; the
// old leader's call is still running on a client. Afterwards: the claim is
// taken by its running allocation, every attach at the provider has its
// claim, and the provider never saw two destructive calls at once (the new
// leader's calls stay on the node the old one called: the fence in Raft).

// Scenarios 1 and 2 run with the partition timers (a lost node's claims
// are freed after 10 s, not the suites' usual 6 s): with 6 s, a client
// whose heartbeats went through the cut-off leader needed longer than that
// to reach the new one (its request hold timeout alone is 5 s), so the new
// leader declared every node down, released the claim being published,
// failed the allocation, and its replacements waited out reschedule
// delays and the volume watcher's backoff: 33–44 s to settle on a loaded
// machine, past the 60 s bound on CI. That is the node-loss path, which
// scenario 3 covers; these scenarios are about the fence across a leader
// change.

// leaderFaultFor is how long the leader stays cut off in scenario 1.
const leaderFaultFor = 15 * time.Second

// checkAfterLeaderFault waits for the claim of job "pub" on vol1 to settle
// and runs the checker over it and the churn, logging its counts.
func checkAfterLeaderFault(t *testing.T, cc *csiCluster, ch *claimChurn, scenario string, healAt time.Time) {
	t.Helper()
	// A fault may fail the first allocation (its publish cut short) and
	// have it replaced: what matters is one running allocation holding
	// the claim, and the checker below.
	var alloc *Alloc
	cc.waitCSIAllocs(t, "pub", csiSettle, func(list []*Alloc) error {
		alloc = nil
		for _, a := range list {
			if a.DesiredStatus == "run" && a.ClientStatus == "running" {
				if alloc != nil {
					return errFatal(fmt.Errorf("two running allocations: %s and %s", alloc, a))
				}
				alloc = a
			}
		}
		if alloc == nil {
			return fmt.Errorf("no running allocation")
		}
		return nil
	})
	cc.waitClaim(t, "vol1", alloc.ID)
	vols := []volRef{{ID: "vol1", ExtID: mustVolumeExt(t, cc, "vol1"), StateDir: cc.StateDir}}
	var settle time.Duration
	WaitFor(t, csiSettle, func() error {
		if err := cc.claimsSettled(vols, []string{"pub"}, func(*Alloc) string { return "vol1" }); err != nil {
			return err
		}
		settle = time.Since(healAt)
		return nil
	})
	prov, err := providerOverlaps(cc.StateDir)
	must.NoError(t, err)
	list, err := JobAllocs(cc.API(), "pub")
	must.NoError(t, err)
	for _, a := range list {
		t.Logf("%s: %s", a, taskEvents(a))
	}
	t.Logf("%s invariants: provider overlaps=%d per-process overlaps=%s unsettled claims=0 (settled %s after the heal); "+
		"%d allocations of pub; %d ControllerPublishVolume, %d ControllerUnpublishVolume calls",
		scenario, prov, overlapCounts(cc), settle.Round(time.Millisecond), len(list),
		cc.totalCalls(t, "ControllerPublishVolume"), cc.totalCalls(t, "ControllerUnpublishVolume"))
	cc.mustNoOverlaps(t)
	ch.check(t, scenario+" (with churn)", healAt, vols, []string{"pub"}, func(*Alloc) string { return "vol1" })
}

// startLeaderFaultChurn creates the churn volumes (volume creation is a
// destructive call, so before the publish the scenario watches) and returns
// the churn, to be started once that publish is in flight.
func startLeaderFaultChurn(t *testing.T, cc *csiCluster) *claimChurn {
	t.Helper()
	ch := newClaimChurnOn(t, cc, churnWorkers, churnPluginID)
	t.Cleanup(ch.halt)
	return ch
}

func TestPartition_LeaderCutOffDuringPublish(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 3, Clients: 3, PublishLatency: leadPublishLatency, OwnAddrs: true,
		ServerConfigExtra: partitionServerTimers, ExtraPluginIDs: []string{churnPluginID}})
	nf := newNetFaults(t)
	old := cc.Leader()
	var followers []*Agent
	for i, s := range cc.Servers {
		if i != old {
			followers = append(followers, s)
		}
	}

	ch := startLeaderFaultChurn(t, cc)
	startPublishing(t, cc)
	ch.start(time.Now().UnixNano())
	cutAt := time.Now()
	nf.Cut([]*Agent{cc.Servers[old]}, followers)
	newLeader := waitLeaderAmong(t, cc.Cluster, followers)
	t.Logf("cut leader %s off from %s; %s leads %s after the cut", cc.Servers[old].Name, names(followers),
		newLeader, time.Since(cutAt).Round(time.Millisecond))

	WaitFor(t, leaderFaultFor+time.Second, func() error {
		if d := time.Since(cutAt); d < leaderFaultFor {
			return fmt.Errorf("cut held for %s of %s", d.Round(time.Second), leaderFaultFor)
		}
		return nil
	})
	nf.Heal()
	healAt := time.Now()
	cc.WaitForLeader(leaderTimeout)
	checkAfterLeaderFault(t, cc, ch, "scenario 1", healAt)
}

func TestPartition_LeaderPausedDuringPublish(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 3, Clients: 3, PublishLatency: leadPublishLatency, OwnAddrs: true,
		ServerConfigExtra: partitionServerTimers, ExtraPluginIDs: []string{churnPluginID}})
	old := cc.Leader()

	ch := startLeaderFaultChurn(t, cc)
	startPublishing(t, cc)
	ch.start(time.Now().UnixNano())
	must.NoError(t, cc.Servers[old].Pause())
	pausedAt := time.Now()
	const pauseFor = 5 * time.Second
	WaitFor(t, pauseFor+time.Second, func() error {
		if d := time.Since(pausedAt); d < pauseFor {
			return fmt.Errorf("paused for %s of %s", d.Round(100*time.Millisecond), pauseFor)
		}
		return nil
	})
	must.NoError(t, cc.Servers[old].Resume())
	resumedAt := time.Now()
	leader := cc.WaitForLeader(leaderTimeout)
	t.Logf("paused leader %s for %s; %s leads after the resume", cc.Servers[old].Name, pauseFor, cc.Servers[leader].Name)
	checkAfterLeaderFault(t, cc, ch, "scenario 2", resumedAt)
}

// Scenario 4: one server in a minority, with the clients' sessions on it.
// The clients must fail over to the majority (a server that cannot reach
// a leader is as good as gone), keep heartbeating (no node goes down), and
// claims keep cycling through the majority: a job holding vol1 is stopped
// and another one claims it while the cut lasts.
func TestPartition_ServerMinorityWithClients(t *testing.T) {
	// The partition timers: a client slow to fail over may be declared
	// down, and must then have stopped its claim holders first.
	cc := startCSICluster(t, csiOpts{Servers: 3, Clients: 3, PublishLatency: 200 * time.Millisecond, OwnAddrs: true,
		StopOnClientAfter: partitionStopAfter, ServerConfigExtra: partitionServerTimers, ExtraPluginIDs: []string{churnPluginID}})
	nf := newNetFaults(t)
	ext := cc.createVolumes(t, "client-0", "vol1")[0]
	cc.registerVolumeHTTP(t, "vol1", ext)
	ch := newClaimChurnOn(t, cc, churnWorkers, churnPluginID)
	t.Cleanup(ch.halt)
	cc.RunJob(csiJob("a", "service", 1, "vol1", false, "", sleepScript))
	first := cc.waitCSIAllocs(t, "a", csiSettle, oneAlloc("running"))[0]
	cc.waitClaim(t, "vol1", first.ID)
	ch.start(time.Now().UnixNano())

	// Clients dial the servers in config order: their sessions are on
	// server-0, which goes into the minority.
	minority, majority := cc.Servers[0], cc.Servers[1:]
	cutAt := time.Now()
	nf.Cut([]*Agent{minority}, majority)
	leader := waitLeaderAmong(t, cc.Cluster, majority)
	t.Logf("cut %s into a minority; %s leads the majority %s after the cut", minority.Name, leader, time.Since(cutAt).Round(time.Millisecond))

	api := majority[0].HTTPAddr()
	path := t.TempDir() + "/b.hcl"
	must.NoError(t, writeFile(path, csiJob("b", "service", 1, "vol1", false, "", sleepScript)))
	mustCLIAt(t, api, "job", "stop", "-detach", "a")
	mustCLIAt(t, api, "job", "run", "-detach", path)
	var second *Alloc
	WaitFor(t, csiSettle, func() error {
		list, err := JobAllocs(api, "b")
		if err != nil {
			return err
		}
		// A client that lost its session with the minority server for
		// longer than its stop window stops b's allocation, and the
		// servers replace it: one running allocation is what counts.
		second = nil
		for _, a := range list {
			if a.DesiredStatus == "run" && a.ClientStatus == "running" {
				second = a
			}
		}
		if second == nil {
			return fmt.Errorf("job b has no running allocation:\n%s", allocTable(list))
		}
		var v struct {
			Claims []struct{ AllocationID, State string }
		}
		if err := GetJSON(api, "/v1/volume/csi/vol1", &v); err != nil {
			return err
		}
		if len(v.Claims) != 1 || v.Claims[0].AllocationID != second.ID || v.Claims[0].State != "taken" {
			return fmt.Errorf("vol1 claims %+v, want one taken by %s", v.Claims, second)
		}
		return nil
	})
	cycled := time.Since(cutAt)
	t.Logf("claim moved from %s to %s through the majority %s after the cut", first, second, cycled.Round(time.Millisecond))
	// Availability, not safety: a client whose session sat on the
	// minority server may have been declared down before it failed over.
	nodes, err := Nodes(api, false)
	must.NoError(t, err)
	var down []string
	for _, n := range nodes {
		if n.Status != "ready" {
			down = append(down, n.Name+"="+n.Status)
		}
	}

	nf.Heal()
	healAt := time.Now()
	cc.WaitForLeader(leaderTimeout)
	vols := []volRef{{ID: "vol1", ExtID: ext, StateDir: cc.StateDir}}
	var settle time.Duration
	WaitFor(t, csiSettle, func() error {
		if err := cc.claimsSettled(vols, []string{"a", "b"}, func(*Alloc) string { return "vol1" }); err != nil {
			return err
		}
		settle = time.Since(healAt)
		return nil
	})
	prov, err := providerOverlaps(cc.StateDir)
	must.NoError(t, err)
	listB, err := JobAllocs(cc.API(), "b")
	must.NoError(t, err)
	t.Logf("scenario 4 invariants: provider overlaps=%d per-process overlaps=%s claims cycled=1 unsettled=0 (settled %s after the heal); "+
		"nodes not ready during the cut: %v; allocations of b: %d", prov, overlapCounts(cc), settle.Round(time.Millisecond), down, len(listB))
	cc.mustNoOverlaps(t)
	ch.check(t, "scenario 4 (with churn)", healAt, vols, []string{"a", "b"}, func(*Alloc) string { return "vol1" })
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o644) }

// mustCLIAt runs the CLI against addr and fails the test unless it exits 0.
func mustCLIAt(t *testing.T, addr string, args ...string) string {
	t.Helper()
	out, errOut, code := RunCLIAt(t, addr, args...)
	if code != 0 {
		t.Fatalf("e2e: roam %s at %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), addr, code, out, errOut)
	}
	return out
}
