//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// The leadership suite: leader changes, graceful (SIGTERM: the leader
// drains its in-flight controller calls and hands over) and not (kill -9),
// while volumes are being claimed and released, on three servers with
// their data on disk, three clients and the built-in hostpath plugin.

// leadPublishLatency is long enough that a test can see a controller
// publish in flight and stop the leader before it returns.
const leadPublishLatency = 2 * time.Second

// startPublishing registers volume vol1, runs service job "pub" whose one
// allocation claims it, and returns once the claim is reserved
// (publishing) and a ControllerPublishVolume has reached a plugin but not
// finished: no plugin has logged the attach yet.
func startPublishing(t *testing.T, cc *csiCluster) {
	t.Helper()
	ext := cc.createVolumes(t, "client-0", "vol1")
	cc.registerVolumeHTTP(t, "vol1", ext[0])
	must.Eq(t, 0, cc.totalCalls(t, "ControllerPublishVolume"))

	cc.RunJob(csiJob("pub", "service", 1, "vol1", false, "", sleepScript))
	missed := ""
	err := poll(csiSettle, func() error {
		// Calls first: a publish counted before the volume still shows
		// publishing was in flight when the volume was read.
		n := cc.totalCalls(t, "ControllerPublishVolume")
		v, err := cc.volume("vol1")
		if err != nil {
			return err
		}
		if len(v.Claims) == 1 && v.Claims[0].State == "taken" {
			missed = claimsString(v)
			return nil
		}
		if n == 0 || len(v.Claims) != 1 || v.Claims[0].State != "publishing" {
			return fmt.Errorf("want a publishing claim and a publish at a plugin: %d publishes, %s", n, claimsString(v))
		}
		return nil
	})
	must.NoError(t, err)
	if missed != "" {
		t.Fatalf("the publish finished before it was seen in flight (%s): the scenario was not reached", missed)
	}
	for name, p := range cc.Plugins {
		if lines := logLines(p, "attached volume"); len(lines) > 0 {
			t.Fatalf("plugin of %s already attached the volume, the scenario was not reached: %s", name, lines[0])
		}
	}
}

// TestLeadership_SigtermDuringPublish stops the leader with SIGTERM while
// a controller publish is in flight: the leader lets the call finish and
// hands over, the claim ends taken with its allocation running, the
// plugin saw one publish and no overlap.
func TestLeadership_SigtermDuringPublish(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 3, Clients: 3, PublishLatency: leadPublishLatency})
	old := cc.Leader()
	before := cc.dutyCounts()

	startPublishing(t, cc)
	stopped := time.Now()
	code := cc.KillServer(old, syscall.SIGTERM)
	t.Logf("%s (leader) exited with code %d %s after SIGTERM; its handoff:\n  %s", cc.Servers[old].Name, code,
		time.Since(stopped).Round(time.Millisecond),
		strings.Join(logLines(cc.Servers[old], "handoff", "in-flight controller calls", "leadership handed over"), "\n  "))
	must.Eq(t, 0, code, must.Sprintf("%s exited with code %d after SIGTERM", cc.Servers[old].Name, code))

	leader, gap := cc.waitNewLeader(t, old, before)
	t.Logf("new leader %s, leaderless gap %s", cc.Servers[leader].Name, gap)

	alloc := cc.waitCSIAllocs(t, "pub", csiSettle, oneAlloc("running"))[0]
	cc.waitClaim(t, "vol1", alloc.ID)
	vols := []volRef{{ID: "vol1", ExtID: mustVolumeExt(t, cc, "vol1"), StateDir: cc.StateDir}}
	WaitFor(t, csiSettle, func() error {
		return cc.claimsSettled(vols, []string{"pub"}, func(*Alloc) string { return "vol1" })
	})

	cc.mustNoOverlaps(t)
	// The departing leader drained the publish and checkpointed the claim
	// before handing over, so the next leader had nothing to redo.
	must.Eq(t, 1, cc.totalCalls(t, "ControllerPublishVolume"), must.Sprint("ControllerPublishVolume calls over all plugins"))
	must.Eq(t, 0, cc.totalCalls(t, "ControllerUnpublishVolume"), must.Sprint("ControllerUnpublishVolume calls over all plugins"))
}

// TestLeadership_OperatorTransferDuringPublish asks the leader to hand over
// with `roam operator raft transfer-leadership` while a controller publish
// is in flight. The command returns only once the leader has drained the
// publish and another server leads; the old leader keeps running as a
// follower, the claim ends taken with its allocation running, the plugins
// saw one publish and no overlap.
func TestLeadership_OperatorTransferDuringPublish(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 3, Clients: 3, PublishLatency: leadPublishLatency})
	old := cc.Leader()
	before := cc.dutyCounts()
	oldBefore, err := promMetrics(cc.Servers[old].HTTPAddr())
	must.NoError(t, err)

	startPublishing(t, cc)
	asked := time.Now()
	out, errOut, code := RunCLIAt(t, cc.Servers[old].HTTPAddr(), "operator", "raft", "transfer-leadership")
	took := time.Since(asked)
	// What the old leader's metrics and the plugins held when the command
	// returned: the handoff's figures are set before its reply is sent,
	// and the plugins write their logs straight to the files.
	oldAfter, err := promMetrics(cc.Servers[old].HTTPAddr())
	must.NoError(t, err)
	var attached []string
	for _, p := range cc.Plugins {
		attached = append(attached, logLines(p, "attached volume")...)
	}
	pubsAtReturn := cc.totalCalls(t, "ControllerPublishVolume")
	t.Logf("transfer-leadership on %s exited %d after %s\nstdout: %s\nstderr: %s\nits handoff:\n  %s",
		cc.Servers[old].Name, code, took.Round(time.Millisecond), strings.TrimSpace(out), strings.TrimSpace(errOut),
		strings.Join(logLines(cc.Servers[old], "handoff", "in-flight controller calls", "leadership handed over"), "\n  "))
	must.Eq(t, 0, code, must.Sprintf("transfer-leadership exited %d: %s%s", code, out, errOut))

	// The command returned after the publish had finished and been drained.
	must.Eq(t, oldBefore[metricHandoffDone]+1, oldAfter[metricHandoffDone],
		must.Sprint("handoffs the old leader had completed when the command returned"))
	must.Eq(t, 1, oldAfter[metricDrainedCalls], must.Sprint("calls drained by the old leader"))
	must.Len(t, 1, attached, must.Sprint("plugin attach lines when the command returned"))
	must.Eq(t, 1, pubsAtReturn, must.Sprint("ControllerPublishVolume calls when the command returned"))

	// The old leader already knows its successor, which the command named.
	l, err := StatusLeader(cc.Servers[old].HTTPAddr())
	must.NoError(t, err)
	next := cc.serverByRPC(l)
	must.NotEq(t, -1, next, must.Sprintf("old leader names leader %q, not a server of this cluster", l))
	must.NotEq(t, old, next, must.Sprint("old leader still names itself leader after the command returned"))
	must.StrContains(t, out, cc.Servers[next].RPCAddr())

	leader, gap := cc.waitNewLeader(t, old, before)
	t.Logf("new leader %s, leaderless gap %s", cc.Servers[leader].Name, gap)
	must.Eq(t, next, leader, must.Sprintf("servers agree on %s, the old leader named %s", cc.Servers[leader].Name, cc.Servers[next].Name))

	alloc := cc.waitCSIAllocs(t, "pub", csiSettle, oneAlloc("running"))[0]
	cc.waitClaim(t, "vol1", alloc.ID)
	vols := []volRef{{ID: "vol1", ExtID: mustVolumeExt(t, cc, "vol1"), StateDir: cc.StateDir}}
	WaitFor(t, csiSettle, func() error {
		return cc.claimsSettled(vols, []string{"pub"}, func(*Alloc) string { return "vol1" })
	})

	// The old leader stayed up, a voting follower of the new leader, and
	// never took its duties up again.
	must.True(t, cc.Servers[old].Running(), must.Sprintf("%s exited: %s", cc.Servers[old].Name, cc.Servers[old].ExitState()))
	must.NoError(t, checkRaft(cc.Cluster, cc.Servers[old].HTTPAddr(), leader, old))
	l, err = StatusLeader(cc.Servers[old].HTTPAddr())
	must.NoError(t, err)
	must.Eq(t, cc.Servers[leader].RPCAddr(), l, must.Sprintf("leader as %s sees it", cc.Servers[old].Name))
	must.Eq(t, before[old], cc.dutyCounts()[old], must.Sprintf("%s started its leader duties again", cc.Servers[old].Name))

	cc.mustNoOverlaps(t)
	// Drained and checkpointed before the transfer: the new leader had
	// nothing to redo.
	must.Eq(t, 1, cc.totalCalls(t, "ControllerPublishVolume"), must.Sprint("ControllerPublishVolume calls over all plugins"))
	must.Eq(t, 0, cc.totalCalls(t, "ControllerUnpublishVolume"), must.Sprint("ControllerUnpublishVolume calls over all plugins"))
}

// TestLeadership_OperatorTransferUnknownPeer asks the leader to hand over
// to a Raft ID no server has: the command fails naming the ID, and the
// leader neither starts a handoff nor stops leading.
func TestLeadership_OperatorTransferUnknownPeer(t *testing.T) {
	c := StartCluster(t, Opts{Servers: 3})
	old := c.leaderOnDuty(t)
	before := c.dutyCounts()

	out, errOut, code := RunCLIAt(t, c.Servers[old].HTTPAddr(), "operator", "raft", "transfer-leadership", "-peer-id", "no-such-id")
	t.Logf("transfer-leadership -peer-id no-such-id exited %d\nstdout: %s\nstderr: %s", code, strings.TrimSpace(out), strings.TrimSpace(errOut))
	must.NotEq(t, 0, code, must.Sprint("transfer-leadership to an unknown peer exited 0"))
	must.StrContains(t, errOut, "no-such-id")

	leader, err := c.LeaderNow()
	must.NoError(t, err)
	must.Eq(t, old, leader, must.Sprintf("leader after the refused transfer is %s, was %s", c.Servers[leader].Name, c.Servers[old].Name))
	m, err := promMetrics(c.Servers[old].HTTPAddr())
	must.NoError(t, err)
	must.Eq(t, 0, m["roam_leader_handoff_started"], must.Sprint("handoffs the refused transfer started"))
	must.Eq(t, before, c.dutyCounts(), must.Sprint("leader duty starts per server"))
}

// TestLeadership_KillLeaderDuringPublish kills (-9) the leader while a
// controller publish is in flight: a new leader takes over, the claim
// ends taken (resumed from its publishing checkpoint) with its allocation
// running, no plugin saw overlapping calls, and once settled every claim
// has its allocation and every attachment its claim.
func TestLeadership_KillLeaderDuringPublish(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 3, Clients: 3, PublishLatency: leadPublishLatency})
	old := cc.Leader()
	before := cc.dutyCounts()

	startPublishing(t, cc)
	cc.KillServer(old, syscall.SIGKILL)
	killed := time.Now()

	leader, gap := cc.waitNewLeader(t, old, before)
	t.Logf("new leader %s %s after the kill, leaderless gap %s", cc.Servers[leader].Name,
		time.Since(killed).Round(time.Millisecond), gap)

	alloc := cc.waitCSIAllocs(t, "pub", csiSettle, oneAlloc("running"))[0]
	cc.waitClaim(t, "vol1", alloc.ID)
	vols := []volRef{{ID: "vol1", ExtID: mustVolumeExt(t, cc, "vol1"), StateDir: cc.StateDir}}
	WaitFor(t, csiSettle, func() error {
		return cc.claimsSettled(vols, []string{"pub"}, func(*Alloc) string { return "vol1" })
	})
	cc.mustNoOverlaps(t)
	// The new leader resumes the claim from publishing and publishes again
	// (idempotent for the same node); the client's lane runs it after the
	// first one ends.
	pubs := cc.totalCalls(t, "ControllerPublishVolume")
	t.Logf("claim taken by %s %s after the kill; %d ControllerPublishVolume, %d ControllerUnpublishVolume calls",
		alloc, time.Since(killed).Round(time.Millisecond), pubs, cc.totalCalls(t, "ControllerUnpublishVolume"))
	must.Between(t, 1, pubs, 2, must.Sprint("ControllerPublishVolume calls over all plugins"))

	// The killed server comes back and rejoins; the claim is unchanged.
	cc.RestartServer(old)
	cc.waitRejoined(t, old)
	cc.waitClaim(t, "vol1", alloc.ID)
	must.NoError(t, cc.claimsSettled(vols, []string{"pub"}, func(*Alloc) string { return "vol1" }))
}

// mustVolumeExt returns the external ID of volume id.
func mustVolumeExt(t *testing.T, cc *csiCluster, id string) string {
	t.Helper()
	v, err := cc.volume(id)
	must.NoError(t, err)
	must.NotEq(t, "", v.ExternalID)
	return v.ExternalID
}

// TestLeadership_ClientKilledDuringLeaderChange kills (-9) the client
// whose allocation holds a volume, with its plugin, and at once stops the
// leader with SIGTERM. The new leader arms the node's heartbeat timer with
// the failover TTL, so the dead node's claim is freed (with a controller
// unpublish) within failover_heartbeat_ttl + heartbeat_grace plus slack,
// and a replacement on another node takes the volume.
func TestLeadership_ClientKilledDuringLeaderChange(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 3, Clients: 3, PublishLatency: leadPublishLatency})
	ext := cc.createVolumes(t, "client-0", "vol1")
	cc.registerVolumeHTTP(t, "vol1", ext[0])
	cc.RunJob(csiJob("holder", "service", 1, "vol1", false, "", sleepScript))
	orig := cc.waitCSIAllocs(t, "holder", csiSettle, oneAlloc("running"))[0]
	cc.waitClaim(t, "vol1", orig.ID)

	victim := cc.clientName(orig.NodeID)
	must.NotEq(t, "", victim)
	oldLeader := cc.Leader()
	before := cc.dutyCounts()
	unpubBefore := cc.totalCalls(t, "ControllerUnpublishVolume")

	killed := time.Now()
	cc.KillClient(cc.clientIndex(victim), syscall.SIGKILL)
	must.NoError(t, cc.Plugins[victim].Signal(syscall.SIGKILL))
	_, err := cc.Plugins[victim].Wait(killTimeout)
	must.NoError(t, err)
	code := cc.KillServer(oldLeader, syscall.SIGTERM)
	must.Eq(t, 0, code, must.Sprintf("%s exited with code %d after SIGTERM", cc.Servers[oldLeader].Name, code))
	leader, gap := cc.waitNewLeader(t, oldLeader, before)
	t.Logf("killed %s (holds %s); %s handed leadership to %s %s after the kill, leaderless gap %s",
		victim, shortAlloc(orig.ID), cc.Servers[oldLeader].Name, cc.Servers[leader].Name,
		time.Since(killed).Round(time.Millisecond), gap)

	// The bound: the new leader gives every node failover_heartbeat_ttl +
	// heartbeat_grace; the slack covers the handoff, the volume watcher's
	// round and one controller unpublish at the plugin's latency.
	ttl, grace := timerValue(t, "failover_heartbeat_ttl"), timerValue(t, "heartbeat_grace")
	slack := 8*time.Second + leadPublishLatency
	bound := ttl + grace + slack
	var freed time.Duration
	WaitFor(t, bound+csiSettle, func() error {
		v, err := cc.volume("vol1")
		if err != nil {
			return err
		}
		for _, c := range v.Claims {
			if c.AllocationID == orig.ID {
				return fmt.Errorf("claim of %s not freed yet: %s", shortAlloc(orig.ID), claimsString(v))
			}
		}
		freed = time.Since(killed)
		return nil
	})
	for _, s := range cc.Servers {
		for _, l := range logLines(s, "marked down") {
			t.Logf("%s: %s", s.Name, l)
		}
	}
	t.Logf("claim of %s freed %s after the kill (bound %s = failover ttl %s + grace %s + slack %s)",
		shortAlloc(orig.ID), freed.Round(time.Millisecond), bound, ttl, grace, slack)
	must.Less(t, bound, freed, must.Sprintf("claim of the dead node freed %s after the kill", freed))
	must.Greater(t, unpubBefore, cc.totalCalls(t, "ControllerUnpublishVolume"),
		must.Sprint("no ControllerUnpublishVolume reached a plugin for the dead node's claim"))

	repl := cc.waitCSIAllocs(t, "holder", csiSettle, func(list []*Alloc) error {
		r := running(list)
		if len(r) != 1 || r[0].ID == orig.ID {
			return fmt.Errorf("want one running replacement of %s", shortAlloc(orig.ID))
		}
		return nil
	})
	var next *Alloc
	for _, a := range running(repl) {
		next = a
	}
	must.NotEq(t, orig.NodeID, next.NodeID, must.Sprintf("replacement %s on the dead node", next))
	cc.waitClaim(t, "vol1", next.ID)
	t.Logf("replacement %s running with the volume %s after the kill", next, time.Since(killed).Round(time.Millisecond))
	for name := range cc.Plugins {
		n, err := cc.overlaps(name)
		must.NoError(t, err)
		must.Eq(t, 0, n, must.Sprintf("plugin of %s counted overlapping controller calls", name))
	}
}

// rollingHandoffs is how many times TestLeadership_RollingRestarts stops
// the leader.
const rollingHandoffs = 20

// rollingPublishLatency is the plugins' publish latency in
// TestLeadership_RollingRestarts: 500ms keeps a claim-and-release cycle of
// three volumes at a few seconds, so the workload keeps claims in flight
// through every handoff and the test stays within a few minutes.
const rollingPublishLatency = 500 * time.Millisecond

// churn is one plugin's workload: service jobs of three allocations, each
// with its own per_alloc volume, run, checked and stopped in turn.
type churn struct {
	pluginID string
	source   string // the volumes are source[0], source[1], source[2]
	dir      string // job files

	mu     sync.Mutex
	jobs   []string
	cycles int // jobs run, checked and stopped with their claims freed
	seen   int // allocations seen running with their claim taken
}

const churnCount = 3

var allocIndex = regexp.MustCompile(`\[(\d+)\]$`)

// volFor is the volume allocation a asks for.
func (ch *churn) volFor(a *Alloc) string {
	m := allocIndex.FindStringSubmatch(a.Name)
	if m == nil {
		return ""
	}
	return ch.source + "[" + m[1] + "]"
}

func (ch *churn) jobList() []string {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return append([]string(nil), ch.jobs...)
}

// cli runs the CLI against a running server until it exits 0 or timeout
// passes: servers come and go under the workload.
func cli(abort context.Context, t *testing.T, cc *csiCluster, timeout time.Duration, args ...string) error {
	return pollCtx(abort, timeout, func() error {
		i := cc.LiveServer()
		if i < 0 {
			return fmt.Errorf("no server running")
		}
		out, errOut, code := RunCLIAt(t, cc.Servers[i].HTTPAddr(), args...)
		if code != 0 {
			return fmt.Errorf("roam %s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
		}
		return nil
	})
}

// pollCtx is poll that gives up at once when abort ends or cond returns
// an errFatal error.
func pollCtx(abort context.Context, timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		var f fatalErr
		switch {
		case err == nil:
			return nil
		case errors.As(err, &f):
			return err
		case abort.Err() != nil:
			return fmt.Errorf("%w (last error: %w)", abort.Err(), err)
		case time.Now().After(deadline):
			return err
		}
		select {
		case <-abort.Done():
		case <-time.After(pollGap):
		}
	}
}

// run runs jobs until ctx ends, leaving the last one running, or until
// abort ends it at once. Every allocation that reaches running must hold
// its claim, taken, on its node.
func (ch *churn) run(ctx, abort context.Context, t *testing.T, cc *csiCluster) error {
	for iter := 0; ; iter++ {
		job := fmt.Sprintf("churn-%s-%d", ch.source, iter)
		path := filepath.Join(ch.dir, job+".hcl")
		if err := os.WriteFile(path, []byte(csiJob(job, "service", churnCount, ch.source, true, "", sleepScript)), 0o644); err != nil {
			return err
		}
		ch.mu.Lock()
		ch.jobs = append(ch.jobs, job)
		ch.mu.Unlock()
		if err := cli(abort, t, cc, csiSettle, "job", "run", "-detach", path); err != nil {
			return err
		}
		var allocs []*Alloc
		err := pollCtx(abort, csiSettle, func() error {
			list, err := JobAllocs(cc.API(), job)
			if err != nil {
				return err
			}
			for _, a := range list {
				if a.ClientStatus == "failed" || a.ClientStatus == "lost" {
					return errFatal(fmt.Errorf("%s: %s", a, taskEvents(a)))
				}
			}
			if r := running(list); len(r) != churnCount || len(list) != churnCount {
				return fmt.Errorf("%s: %d of %d allocations running:\n%s", job, len(r), churnCount, allocTable(list))
			}
			allocs = list
			return nil
		})
		if err != nil {
			return err
		}
		for _, a := range allocs {
			var v *volumeClaims
			if err := pollCtx(abort, 10*time.Second, func() error {
				var err error
				v, err = readClaims(cc, ch.volFor(a))
				return err
			}); err != nil {
				return err
			}
			c := v.byAlloc[a.ID]
			if c == nil || c.State != "taken" || c.NodeID != a.NodeID {
				return fmt.Errorf("acknowledged claim lost: %s runs, but volume %s has %s", a, ch.volFor(a), v.desc)
			}
		}
		ch.mu.Lock()
		ch.seen += len(allocs)
		ch.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		if err := cli(abort, t, cc, csiSettle, "job", "stop", "-detach", job); err != nil {
			return err
		}
		err = pollCtx(abort, csiSettle, func() error {
			list, err := JobAllocs(cc.API(), job)
			if err != nil {
				return err
			}
			for _, a := range list {
				if !a.ClientTerminal() {
					return fmt.Errorf("%s not stopped yet", a)
				}
			}
			for i := 0; i < churnCount; i++ {
				v, err := readClaims(cc, fmt.Sprintf("%s[%d]", ch.source, i))
				if err != nil {
					return err
				}
				if len(v.byAlloc) > 0 {
					return fmt.Errorf("volume %s[%d] still claimed: %s", ch.source, i, v.desc)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("stopping %s: %w", job, err)
		}
		ch.mu.Lock()
		ch.cycles++
		ch.mu.Unlock()
	}
}

// volumeClaims is a volume's claims by allocation ID.
type volumeClaims struct {
	byAlloc map[string]*struct{ State, NodeID string }
	desc    string
}

func readClaims(cc *csiCluster, id string) (*volumeClaims, error) {
	v, err := cc.volume(id)
	if err != nil {
		return nil, err
	}
	out := &volumeClaims{byAlloc: make(map[string]*struct{ State, NodeID string }), desc: claimsString(v)}
	for _, c := range v.Claims {
		out.byAlloc[c.AllocationID] = &struct{ State, NodeID string }{c.State, c.NodeID}
	}
	return out, nil
}

// watchClaims samples, until ctx ends, every allocation of the churns and
// their volumes, and reports each allocation that was running (and so had
// its claim acknowledged) before a volume read, still meant to run after
// it, and yet had no taken claim in it.
func watchClaims(ctx context.Context, cc *csiCluster, churns []*churn) (samples int, lost []string) {
	tick := time.NewTicker(pollGap)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return samples, lost
		case <-tick.C:
		}
		for _, ch := range churns {
			jobs := ch.jobList()
			first := make(map[string]*Alloc)
			ok := true
			for _, j := range jobs {
				list, err := JobAllocs(cc.API(), j)
				if err != nil {
					ok = false
					break
				}
				for _, a := range running(list) {
					first[a.ID] = a
				}
			}
			if !ok || len(first) == 0 {
				continue
			}
			vols := make(map[string]*volumeClaims)
			for i := 0; i < churnCount && ok; i++ {
				id := fmt.Sprintf("%s[%d]", ch.source, i)
				v, err := readClaims(cc, id)
				if err != nil {
					ok = false
					break
				}
				vols[id] = v
			}
			if !ok {
				continue
			}
			for _, j := range jobs {
				list, err := JobAllocs(cc.API(), j)
				if err != nil {
					ok = false
					break
				}
				for _, a := range list {
					if first[a.ID] == nil || a.DesiredStatus != "run" || a.ClientTerminal() {
						continue
					}
					v := vols[ch.volFor(a)]
					if c := v.byAlloc[a.ID]; c == nil || c.State != "taken" {
						lost = append(lost, fmt.Sprintf("%s %s: running and meant to run, but volume %s has %s",
							time.Now().Format("15:04:05.000"), a, ch.volFor(a), v.desc))
					}
				}
			}
			if ok {
				samples++
			}
		}
	}
}

// TestLeadership_RollingRestarts keeps two plugins' volumes being claimed
// and released while the leader is stopped with SIGTERM and restarted,
// 20 times, waiting each time for the stopped server to rejoin and a
// leader with its duties started. No acknowledged claim is lost, no plugin
// sees overlapping calls, and at the end every allocation's claims match
// its status and every attachment its claim.
func TestLeadership_RollingRestarts(t *testing.T) {
	const second = "hostpath2"
	cc := startCSICluster(t, csiOpts{
		Servers: 3, Clients: 3,
		PublishLatency: rollingPublishLatency,
		ExtraPluginIDs: []string{second},
	})
	dir := t.TempDir()
	churns := []*churn{
		{pluginID: csiPluginID, source: "va", dir: dir},
		{pluginID: second, source: "vb", dir: dir},
	}
	var vols []volRef
	for _, ch := range churns {
		names := make([]string, churnCount)
		for i := range names {
			names[i] = fmt.Sprintf("%s[%d]", ch.source, i)
		}
		sock, stateDir := cc.Sockets["client-0"], cc.StateDir
		if set := cc.Extra[ch.pluginID]; set != nil {
			sock, stateDir = set.Sockets["client-0"], set.StateDir
		}
		ext := createVolumesAt(t, sock, names...)
		for i, name := range names {
			cc.registerVolumeFor(t, ch.pluginID, name, ext[i])
			vols = append(vols, volRef{ID: name, ExtID: ext[i], StateDir: stateDir})
		}
	}

	// stop asks the workloads to finish (leaving their last jobs running);
	// abort, when the test ends early, makes them return at once.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	abort, abortNow := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make([]error, len(churns))
	for i, ch := range churns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = ch.run(ctx, abort, t, cc)
			if errs[i] != nil {
				stop()
			}
		}()
	}
	var (
		samples int
		lost    []string
	)
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		samples, lost = watchClaims(watchCtx, cc, churns)
	}()
	// Whatever happens, the goroutines end before the cluster stops.
	t.Cleanup(func() { abortNow(); stopWatch(); wg.Wait(); <-watchDone })

	// Let the first jobs start claiming before the first handoff.
	WaitFor(t, csiSettle, func() error {
		for _, ch := range churns {
			ch.mu.Lock()
			seen := ch.seen
			ch.mu.Unlock()
			if seen == 0 {
				return fmt.Errorf("no allocation of %s running yet", ch.source)
			}
		}
		return nil
	})

	// controllerCalls counts the publishes and unpublishes that reached
	// either plugin: each round waits for some, so that every handoff
	// happens while volumes are being claimed and released.
	controllerCalls := func() int64 {
		var n int64
		for _, ch := range churns {
			set := cc.Extra[ch.pluginID]
			n += cc.pluginCalls(t, set, "ControllerPublishVolume") + cc.pluginCalls(t, set, "ControllerUnpublishVolume")
		}
		return n
	}
	const callsPerRound = 4

	// Servers are stopped with SIGTERM and restarted in turn, 0, 1, 2, 0,
	// ..., as in a rolling upgrade, until the leader has been stopped
	// rollingHandoffs times. Before stopping the leader, each round waits
	// for controller calls to reach the plugins, so every handoff happens
	// while volumes are being claimed and released.
	start := time.Now()
	restarts := make(map[string]int)
	var gaps []string
	calls := controllerCalls()
	drained := 0
	for turn := 0; len(gaps) < rollingHandoffs && ctx.Err() == nil; turn++ {
		i := turn % len(cc.Servers)
		leader := cc.Leader()
		roundStart := time.Now()
		if i != leader {
			code := cc.KillServer(i, syscall.SIGTERM)
			must.Eq(t, 0, code, must.Sprintf("turn %d: follower %s exited with code %d after SIGTERM", turn, cc.Servers[i].Name, code))
			restarts[cc.Servers[i].Name]++
			cc.RestartServer(i)
			cc.waitRejoined(t, i)
			continue
		}
		WaitFor(t, csiSettle, func() error {
			if ctx.Err() != nil {
				return nil // a workload failed; reported below
			}
			if n := controllerCalls(); n < calls+callsPerRound {
				return fmt.Errorf("handoff %d: %d controller calls since the last handoff, want %d", len(gaps)+1, n-calls, callsPerRound)
			}
			return nil
		})
		calls = controllerCalls()
		before := cc.dutyCounts()
		code := cc.KillServer(i, syscall.SIGTERM)
		must.Eq(t, 0, code, must.Sprintf("handoff %d: leader %s exited with code %d after SIGTERM", len(gaps)+1, cc.Servers[i].Name, code))
		restarts[cc.Servers[i].Name]++
		m, err := exitMetrics(cc.Servers[i])
		must.NoError(t, err)
		must.Eq(t, 1, m[metricHandoffDone], must.Sprintf("handoff %d: handoffs %s completed before it exited", len(gaps)+1, cc.Servers[i].Name))
		drained += int(m[metricDrainedCalls])
		next, gap := cc.waitNewLeader(t, i, before)
		gaps = append(gaps, gap)
		cc.RestartServer(i)
		cc.waitRejoined(t, i)
		t.Logf("handoff %d: %s -> %s (gap %s), %s rejoined, %s", len(gaps), cc.Servers[i].Name, cc.Servers[next].Name,
			gap, cc.Servers[i].Name, time.Since(roundStart).Round(time.Millisecond))
	}
	handoffsTook := time.Since(start)
	stop()
	wg.Wait()
	stopWatch()
	<-watchDone
	for i, err := range errs {
		must.NoError(t, err, must.Sprintf("workload of %s", churns[i].pluginID))
	}
	must.Eq(t, rollingHandoffs, len(gaps), must.Sprint("handoffs done"))

	t.Logf("%d handoffs in %s, server restarts %v, gaps %v; %d controller calls drained by departing leaders",
		len(gaps), handoffsTook.Round(time.Millisecond), restarts, gaps, drained)
	for _, ch := range churns {
		t.Logf("plugin %s: %d jobs, %d claim cycles done, %d allocations seen running with their claims; %d publishes, %d unpublishes",
			ch.pluginID, len(ch.jobs), ch.cycles, ch.seen,
			cc.pluginCalls(t, cc.Extra[ch.pluginID], "ControllerPublishVolume"),
			cc.pluginCalls(t, cc.Extra[ch.pluginID], "ControllerUnpublishVolume"))
		// The workload kept claiming and releasing through the handoffs.
		must.GreaterEq(t, 3, ch.cycles, must.Sprintf("claim cycles of %s during %d handoffs", ch.pluginID, rollingHandoffs))
	}
	t.Logf("%d samples of running allocations and their claims", samples)
	must.SliceEmpty(t, lost, must.Sprint("running allocations whose acknowledged claim was missing"))

	cc.mustNoOverlaps(t)
	cc.mustNoOverlapsIn(t, cc.Extra[second])

	var jobs []string
	for _, ch := range churns {
		jobs = append(jobs, ch.jobs...)
	}
	volFor := func(a *Alloc) string {
		for _, ch := range churns {
			if strings.HasPrefix(a.JobID, "churn-"+ch.source+"-") {
				return ch.volFor(a)
			}
		}
		return ""
	}
	WaitFor(t, csiSettle, func() error { return cc.claimsSettled(vols, jobs, volFor) })
	// The last job of each plugin is still running, with its claims.
	for _, ch := range churns {
		last := ch.jobs[len(ch.jobs)-1]
		list, err := JobAllocs(cc.API(), last)
		must.NoError(t, err)
		must.Len(t, churnCount, running(list), must.Sprintf("allocations of %s:\n%s", last, allocTable(list)))
	}
}
