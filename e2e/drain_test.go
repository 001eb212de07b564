//go:build e2e

package e2e

import (
	"fmt"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// drainSettle bounds the wait for a drain with a long deadline to finish
// on its own: migrations, not the deadline, must end it.
const drainSettle = 45 * time.Second

// waitDrained polls nodeID until its drain is over (no drain strategy)
// and it is ineligible, and returns it.
func waitDrained(t *testing.T, c *Cluster, nodeID string, timeout time.Duration) *Node {
	t.Helper()
	var node *Node
	WaitFor(t, timeout, func() error {
		n, err := NodeInfo(c.API(), nodeID)
		if err != nil {
			return err
		}
		if n.Draining() {
			return fmt.Errorf("node %s still draining (DrainStrategy %s)", n.Name, n.DrainStrategy)
		}
		if n.SchedulingEligibility != "ineligible" {
			return fmt.Errorf("node %s drained but %s", n.Name, n.SchedulingEligibility)
		}
		node = n
		return nil
	})
	return node
}

// drain runs `roam node drain -enable -yes` with extra flags.
func drain(c *Cluster, nodeID string, flags ...string) {
	c.t.Helper()
	args := append([]string{"node", "drain", "-enable", "-yes"}, flags...)
	c.MustCLI(append(args, nodeID)...)
}

// allRunning is a WaitJobAllocs condition: exactly n live allocations, all
// running.
func allRunning(n int) func([]*Alloc) error {
	return func(list []*Alloc) error {
		l, r := live(list), running(list)
		if len(l) != n || len(r) != n {
			return fmt.Errorf("want %d running allocations, have %d live, %d running", n, len(l), len(r))
		}
		return nil
	}
}

// checkMigrated checks that every allocation in moved was replaced by a
// running allocation on another node that names it as its predecessor.
func checkMigrated(t *testing.T, all []*Alloc, moved []*Alloc) {
	t.Helper()
	byPrev := map[string]*Alloc{}
	for _, a := range all {
		if a.PreviousAllocation != "" {
			byPrev[a.PreviousAllocation] = a
		}
	}
	for _, old := range moved {
		next := byPrev[old.ID]
		must.NotNil(t, next, must.Sprintf("no replacement for %s:\n%s", old, allocTable(all)))
		must.NotEq(t, old.NodeID, next.NodeID, must.Sprintf("replacement %s of %s on the same node", next, old))
		must.Eq(t, "running", next.ClientStatus, must.Sprintf("replacement %s", next))
	}
}

// TestDrain_MigratesAndIgnoreSystem drains one node with a long deadline
// and no -ignore-system: its service allocations move elsewhere, its system
// allocation stops, and the node ends ineligible with no drain. Then it
// drains a second node with -ignore-system: service allocations move, the
// system allocation stays running there.
func TestDrain_MigratesAndIgnoreSystem(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, Opts{Servers: 1, Clients: 3})
	c.ReportServerEvents(150)
	ids := c.NodeIDs()

	c.RunJob(systemJob("sys"))
	c.WaitJobAllocs("sys", settle, allRunning(3))
	c.RunJob(serviceJob("web", 3, "", sleepScript))
	web := c.WaitJobAllocs("web", settle, allRunning(3))

	// (a) Drain the node with the most web allocations.
	count := map[string]int{}
	for _, a := range web {
		count[a.NodeID]++
	}
	var a string
	for _, id := range ids {
		if a == "" || count[id] > count[a] {
			a = id
		}
	}
	movedA := onNode(live(web), a)
	must.Positive(t, len(movedA))
	t.Logf("draining %s with %d web allocations", a, len(movedA))
	drain(c, a, "-deadline", "60s")
	node := waitDrained(t, c, a, drainSettle)
	must.False(t, node.Drain)
	must.Eq(t, "ineligible", node.SchedulingEligibility)

	web = c.WaitJobAllocs("web", settle, allRunning(3))
	must.SliceEmpty(t, onNode(live(web), a), must.Sprintf("web allocations left on the drained node:\n%s", allocTable(web)))
	checkMigrated(t, web, movedA)
	for _, old := range movedA {
		for _, now := range web {
			if now.ID == old.ID {
				must.NotEq(t, "alloc stopped: node drain reached its deadline", now.DesiredDescription,
					must.Sprintf("%s was stopped by the deadline, not migrated", now))
			}
		}
	}
	// Without -ignore-system the system allocation on the node stops too.
	onA, err := NodeAllocs(c.API(), a)
	must.NoError(t, err)
	must.SliceEmpty(t, live(onA), must.Sprintf("live allocations on the drained node:\n%s", allocTable(onA)))

	// (b) Drain a node that holds web allocations with -ignore-system.
	var b string
	for _, al := range live(web) {
		if al.NodeID != a {
			b = al.NodeID
			break
		}
	}
	must.NotEq(t, "", b)
	movedB := onNode(live(web), b)
	sys, err := JobAllocs(c.API(), "sys")
	must.NoError(t, err)
	sysB := onNode(live(sys), b)
	must.Len(t, 1, sysB, must.Sprintf("system allocations:\n%s", allocTable(sys)))
	t.Logf("draining %s with -ignore-system: %d web allocations, system alloc %s", b, len(movedB), sysB[0])
	drain(c, b, "-deadline", "60s", "-ignore-system")
	waitDrained(t, c, b, drainSettle)

	web = c.WaitJobAllocs("web", settle, allRunning(3))
	must.SliceEmpty(t, onNode(live(web), b), must.Sprintf("web allocations left on %s:\n%s", b, allocTable(web)))
	checkMigrated(t, web, movedB)
	sys, err = JobAllocs(c.API(), "sys")
	must.NoError(t, err)
	var kept *Alloc
	for _, al := range sys {
		if al.ID == sysB[0].ID {
			kept = al
		}
	}
	must.NotNil(t, kept)
	must.Eq(t, "run", kept.DesiredStatus, must.Sprintf("system alloc on an -ignore-system drained node: %s", kept))
	must.Eq(t, "running", kept.ClientStatus, must.Sprintf("system alloc on an -ignore-system drained node: %s", kept))
	must.False(t, kept.Migrating(), must.Sprintf("system alloc marked for migration: %s", kept))
	must.Len(t, 1, onNode(live(sys), b), must.Sprintf("system allocations:\n%s", allocTable(sys)))
}

// TestDrain_MaxParallelThenReenable puts three allocations of a group with
// migrate { max_parallel = 1 } on one node and drains it. Then it makes the
// drained node eligible again and checks new work lands there.
//
// The max_parallel check: a migration is in flight from the moment its
// replacement is created (CreateTime, set by the leader) until the
// replacement's task has started (TaskStates["t"].StartedAt, set by the
// client before it reports the allocation running, which is what the
// scheduler waits for). With max_parallel = 1 these intervals must not
// overlap: sorted by CreateTime, each replacement is created no earlier
// than the previous one started. Both clocks are this machine's. While the
// drain runs, the test also polls and checks that it never sees two
// replacements pending at once.
func TestDrain_MaxParallelThenReenable(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, Opts{Servers: 1, Clients: 3})
	c.ReportServerEvents(150)
	ids := c.NodeIDs()
	a, b, cc := ids["client-0"], ids["client-1"], ids["client-2"]

	// All three allocations on client-0.
	c.SetEligible(b, false)
	c.SetEligible(cc, false)
	c.RunJob(serviceJob("web", 3, migrateOne, sleepScript))
	orig := c.WaitJobAllocs("web", settle, allRunning(3))
	must.Len(t, 3, onNode(orig, a), must.Sprintf("allocations:\n%s", allocTable(orig)))
	c.SetEligible(b, true)
	c.SetEligible(cc, true)

	origIDs := map[string]bool{}
	for _, o := range orig {
		origIDs[o.ID] = true
	}
	drain(c, a, "-deadline", "60s")
	maxPending := 0
	WaitFor(t, drainSettle, func() error {
		list, err := JobAllocs(c.API(), "web")
		if err != nil {
			return err
		}
		pending := 0
		for _, al := range list {
			if origIDs[al.PreviousAllocation] && al.Live() && al.ClientStatus == "pending" {
				pending++
			}
		}
		maxPending = max(maxPending, pending)
		n, err := NodeInfo(c.API(), a)
		if err != nil {
			return err
		}
		if n.Draining() || len(running(list)) != 3 || len(onNode(live(list), a)) != 0 {
			return fmt.Errorf("drain not done: draining=%t\n%s", n.Draining(), allocTable(list))
		}
		return nil
	})
	must.LessEq(t, 1, maxPending, must.Sprint("replacements seen pending at once"))
	waitDrained(t, c, a, settle)

	all, err := JobAllocs(c.API(), "web")
	must.NoError(t, err)
	checkMigrated(t, all, orig)
	var repl []*Alloc
	for _, al := range all {
		if origIDs[al.PreviousAllocation] {
			repl = append(repl, al)
		}
	}
	must.Len(t, 3, repl, must.Sprintf("allocations:\n%s", allocTable(all)))
	sort.Slice(repl, func(i, j int) bool { return repl[i].CreateTime < repl[j].CreateTime })
	for i, r := range repl {
		ts := r.TaskStates["t"]
		must.NotNil(t, ts, must.Sprintf("no task state for %s", r))
		must.False(t, ts.StartedAt.IsZero(), must.Sprintf("%s never started", r))
		t.Logf("replacement %d: %s created %s started %s", i, shortAlloc(r.ID),
			r.Created().Format(time.RFC3339Nano), ts.StartedAt.Format(time.RFC3339Nano))
		if i == 0 {
			continue
		}
		prevStart := repl[i-1].TaskStates["t"].StartedAt
		must.False(t, r.Created().Before(prevStart), must.Sprintf(
			"max_parallel 1: replacement %s created at %s, before replacement %s started at %s",
			shortAlloc(r.ID), r.Created().Format(time.RFC3339Nano), shortAlloc(repl[i-1].ID), prevStart.Format(time.RFC3339Nano)))
	}

	// (e) The drained node, made eligible again, takes new work: with the
	// other two ineligible, a new job can only land there.
	c.SetEligible(a, true)
	c.SetEligible(b, false)
	c.SetEligible(cc, false)
	after := c.WaitJobAllocs("web", settle, allRunning(3)) // the old job is undisturbed
	must.SliceEmpty(t, onNode(live(after), a))
	c.RunJob(serviceJob("after", 1, "", sleepScript))
	got := c.WaitJobAllocs("after", settle, allRunning(1))
	must.Eq(t, a, running(got)[0].NodeID, must.Sprintf("allocations of after:\n%s", allocTable(got)))
}

// TestDrain_DeadlineForcesRest drains a node whose three allocations
// (max_parallel 1) cannot all migrate before a 3s deadline: the only
// eligible nodes are frozen (SIGSTOP), so the first replacement stays
// pending and holds the one migration slot. The deadline must stop the
// rest, and the drain must complete. Heartbeat grace is raised so that the
// frozen clients are not marked down meanwhile.
func TestDrain_DeadlineForcesRest(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, Opts{Servers: 1, Clients: 3, ServerConfigExtra: `server {
  heartbeat_grace = "60s"
}
`})
	c.ReportServerEvents(150)
	ids := c.NodeIDs()
	a, b, cc := ids["client-0"], ids["client-1"], ids["client-2"]
	c.SetEligible(b, false)
	c.SetEligible(cc, false)
	c.RunJob(serviceJob("web", 3, migrateOne, sleepScript))
	orig := c.WaitJobAllocs("web", settle, allRunning(3))
	must.Len(t, 3, onNode(orig, a))
	c.SetEligible(b, true)
	c.SetEligible(cc, true)

	frozen := []*Agent{c.Clients[1], c.Clients[2]}
	thaw := func() {
		for _, ag := range frozen {
			_ = ag.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw) // runs before the cluster's own cleanup stops them
	for _, ag := range frozen {
		must.NoError(t, ag.Signal(syscall.SIGSTOP))
	}

	const deadline = 3 * time.Second
	start := time.Now()
	drain(c, a, "-deadline", deadline.String())

	// Every allocation on the node is stopped by the deadline plus slack,
	// and the drain completes.
	const slack = 20 * time.Second
	WaitFor(t, deadline+slack, func() error {
		onA, err := NodeAllocs(c.API(), a)
		if err != nil {
			return err
		}
		for _, al := range onA {
			if !al.ClientTerminal() {
				return fmt.Errorf("%s not stopped yet", al)
			}
		}
		n, err := NodeInfo(c.API(), a)
		if err != nil {
			return err
		}
		if n.Draining() {
			return fmt.Errorf("node %s still draining", n.Name)
		}
		return nil
	})
	t.Logf("drain with a %s deadline done after %s", deadline, time.Since(start))
	waitDrained(t, c, a, settle)

	// One allocation migrated (its replacement is stuck pending on a frozen
	// node); the others were stopped by the deadline, not before it.
	all, err := JobAllocs(c.API(), "web")
	must.NoError(t, err)
	forced := 0
	for _, o := range orig {
		var now *Alloc
		for _, al := range all {
			if al.ID == o.ID {
				now = al
			}
		}
		must.NotNil(t, now)
		if now.DesiredDescription != "alloc stopped: node drain reached its deadline" {
			continue
		}
		forced++
		ts := now.TaskStates["t"]
		must.NotNil(t, ts)
		must.False(t, ts.FinishedAt.Before(start.Add(deadline)), must.Sprintf(
			"%s forced to stop at %s, before the deadline %s", now, ts.FinishedAt.Format(time.RFC3339Nano),
			start.Add(deadline).Format(time.RFC3339Nano)))
	}
	must.Eq(t, 2, forced, must.Sprintf("allocations stopped by the deadline:\n%s", allocTable(all)))

	// Once thawed, the replacements run on the other nodes.
	thaw()
	final := c.WaitJobAllocs("web", settle, allRunning(3))
	must.SliceEmpty(t, onNode(live(final), a))
}
