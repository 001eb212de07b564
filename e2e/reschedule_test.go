//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// failNow fails the task at once; restarts are off so every failure is
// the allocation's.
const failNow = "exit 3"

const noRestart = `restart {
  attempts = 0
  mode     = "fail"
}`

// clockSlack allows for rounding between the clocks the servers and
// clients read; all run on this machine.
const clockSlack = 50 * time.Millisecond

// generations follows a job's allocations from the first through
// PreviousAllocation links and returns them in lineage order. It fails the
// test unless the allocations form one chain.
func generations(t *testing.T, list []*Alloc) []*Alloc {
	t.Helper()
	byPrev := map[string]*Alloc{}
	var first *Alloc
	for _, a := range list {
		if a.PreviousAllocation == "" {
			must.Nil(t, first, must.Sprintf("two first generations:\n%s", allocTable(list)))
			first = a
			continue
		}
		must.MapNotContainsKey(t, byPrev, a.PreviousAllocation, must.Sprintf("two replacements of %s:\n%s", a.PreviousAllocation, allocTable(list)))
		byPrev[a.PreviousAllocation] = a
	}
	must.NotNil(t, first, must.Sprintf("no first generation:\n%s", allocTable(list)))
	chain := []*Alloc{first}
	for next := byPrev[first.ID]; next != nil; next = byPrev[next.ID] {
		chain = append(chain, next)
	}
	must.Len(t, len(list), chain, must.Sprintf("allocations do not form one chain:\n%s", allocTable(list)))
	return chain
}

// exitCode returns the exit code of task t's last Terminated event, -1 if
// none.
func exitCode(a *Alloc) int {
	ts := a.TaskStates["t"]
	if ts == nil {
		return -1
	}
	code := -1
	for _, e := range ts.Events {
		if e.Type == "Terminated" {
			code = e.ExitCode
		}
	}
	return code
}

// TestReschedule_Policies runs two failing jobs side by side: one whose
// reschedule policy allows two attempts, which must end with three failed
// allocations and a dead job; and one with unlimited attempts and a
// constant 1s delay, which must keep replacing, each replacement created
// no earlier than its predecessor's failure plus the delay.
func TestReschedule_Policies(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, Opts{Servers: 1, Clients: 3})
	c.ReportServerEvents(150)
	c.NodeIDs()

	c.RunJob(serviceJob("limited", 1, noRestart+`
reschedule {
  attempts       = 2
  interval       = "1h"
  delay          = "1s"
  delay_function = "constant"
  unlimited      = false
}`, failNow))
	const delay = time.Second
	c.RunJob(serviceJob("unlimited", 1, noRestart+`
reschedule {
  delay          = "1s"
  delay_function = "constant"
  unlimited      = true
}`, failNow))

	// Unlimited: at least four generations, all failing, each created after
	// its predecessor failed plus the delay.
	list := c.WaitJobAllocs("unlimited", settle, func(list []*Alloc) error {
		failed := 0
		for _, a := range list {
			if a.ClientStatus == "failed" {
				failed++
			}
		}
		if len(list) < 4 || failed < 3 {
			return fmt.Errorf("%d allocations, %d failed; want at least 4 and 3", len(list), failed)
		}
		return nil
	})
	c.MustCLI("job", "stop", "unlimited")
	chain := generations(t, list)
	for i, a := range chain {
		if i == 0 {
			continue
		}
		prev := chain[i-1]
		must.Eq(t, "failed", prev.ClientStatus, must.Sprintf("generation %d: %s", i-1, prev))
		must.Eq(t, 3, exitCode(prev), must.Sprintf("generation %d: %s", i-1, prev))
		failedAt := prev.TaskStates["t"].FinishedAt
		earliest := failedAt.Add(delay - clockSlack)
		t.Logf("generation %d: %s failed %s; generation %d: %s created %s (+%s)", i-1, shortAlloc(prev.ID),
			failedAt.Format(time.RFC3339Nano), i, shortAlloc(a.ID), a.Created().Format(time.RFC3339Nano), a.Created().Sub(failedAt))
		must.False(t, a.Created().Before(earliest), must.Sprintf(
			"generation %d created at %s, less than %s after generation %d failed at %s",
			i, a.Created().Format(time.RFC3339Nano), delay, i-1, failedAt.Format(time.RFC3339Nano)))
		must.NotNil(t, a.RescheduleTracker)
		must.Len(t, i, a.RescheduleTracker.Events, must.Sprintf("reschedule events of generation %d", i))
	}

	// Limited: exactly 1 + attempts allocations, all failed, and no more
	// once every evaluation has finished.
	c.WaitJobAllocs("limited", settle, func(list []*Alloc) error {
		failed := 0
		for _, a := range list {
			if a.ClientStatus == "failed" {
				failed++
			}
		}
		if failed < 3 {
			return fmt.Errorf("%d of %d allocations failed; want 3", failed, len(list))
		}
		return nil
	})
	c.WaitEvalsSettled("limited", settle)
	list, err := JobAllocs(c.API(), "limited")
	must.NoError(t, err)
	must.Len(t, 3, list, must.Sprintf("allocations of limited:\n%s", allocTable(list)))
	chain = generations(t, list)
	for i, a := range chain {
		must.Eq(t, "failed", a.ClientStatus, must.Sprintf("generation %d: %s", i, a))
		must.Eq(t, 3, exitCode(a), must.Sprintf("generation %d: %s", i, a))
	}
	must.Eq(t, "", chain[2].NextAllocation)
	must.Eq(t, "", chain[2].FollowupEvalID, must.Sprintf("the last attempt has a follow-up eval: %s", chain[2]))
	job, err := GetJob(c.API(), "limited")
	must.NoError(t, err)
	must.Eq(t, "dead", job.Status)
	out := c.MustCLI("job", "status", "limited")
	must.StrContains(t, out, "dead", must.Sprintf("roam job status limited:\n%s", out))
	// Still three after a fresh look at the evaluations.
	c.WaitEvalsSettled("limited", settle)
	list, err = JobAllocs(c.API(), "limited")
	must.NoError(t, err)
	must.Len(t, 3, list, must.Sprintf("allocations of limited:\n%s", allocTable(list)))
}

// TestReschedule_LostClient kills a client with SIGKILL: its allocations
// must be marked lost and replaced on other nodes within the heartbeat TTL
// plus grace, plus scheduling slack.
func TestReschedule_LostClient(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, Opts{Servers: 1, Clients: 3})
	c.ReportServerEvents(150)
	ids := c.NodeIDs()
	c.RunJob(serviceJob("web", 3, "", sleepScript))
	orig := c.WaitJobAllocs("web", settle, allRunning(3))

	victim := orig[0].NodeID
	var vi int = -1
	for i, ag := range c.Clients {
		if ids[ag.Name] == victim {
			vi = i
		}
	}
	must.NonNegative(t, vi)
	lost := onNode(orig, victim)
	t.Logf("killing %s with %d allocations", c.Clients[vi].Name, len(lost))

	// Heartbeat TTL at most 2.5s (2s min_heartbeat_ttl plus jitter), grace
	// 2s; the rest is slack for scheduling and the replacement's start.
	const bound = 2500*time.Millisecond + 2*time.Second + 15*time.Second
	killed := time.Now()
	c.KillClient(vi, syscall.SIGKILL)
	lostIDs := map[string]bool{}
	for _, a := range lost {
		lostIDs[a.ID] = true
	}
	final := c.WaitJobAllocs("web", bound, func(list []*Alloc) error {
		for _, a := range list {
			if lostIDs[a.ID] && a.ClientStatus != "lost" {
				return fmt.Errorf("%s not lost yet", a)
			}
		}
		replaced := 0
		for _, a := range running(list) {
			if lostIDs[a.PreviousAllocation] {
				replaced++
			}
		}
		if replaced != len(lost) || len(running(list)) != 3 {
			return fmt.Errorf("%d of %d lost allocations replaced and running", replaced, len(lost))
		}
		return nil
	})
	t.Logf("lost allocations replaced %s after kill -9", time.Since(killed))
	for _, a := range running(final) {
		must.NotEq(t, victim, a.NodeID, must.Sprintf("running on the dead node: %s", a))
	}
	n, err := NodeInfo(c.API(), victim)
	must.NoError(t, err)
	must.Eq(t, "down", n.Status)
}

// TestReschedule_ClientRestartKeepsTasks kills a client with SIGKILL and
// starts it again on the same data dir: the task, which counts its starts
// in a file, must still be the same process, started once, in the same
// allocation. Heartbeat grace is raised so the node is not marked down
// while the client is away: this checks re-attachment, not loss.
func TestReschedule_ClientRestartKeepsTasks(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, Opts{Servers: 1, Clients: 3, ServerConfigExtra: `server {
  heartbeat_grace = "60s"
}
`})
	c.ReportServerEvents(150)
	ids := c.NodeIDs()
	dir := t.TempDir()
	script := fmt.Sprintf(`d=%s; n=$(cat $d/count 2>/dev/null || echo 0); echo $((n+1)) > $d/count.tmp && mv $d/count.tmp $d/count; echo $$ > $d/pid.tmp && mv $d/pid.tmp $d/pid; exec sleep 3600`, dir)
	c.RunJob(serviceJob("keep", 1, "", script))
	orig := c.WaitJobAllocs("keep", settle, allRunning(1))
	alloc := orig[0]

	readInt := func(name string) (int, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(strings.TrimSpace(string(b)))
	}
	var pid int
	WaitFor(t, settle, func() error {
		var err error
		pid, err = readInt("pid")
		return err
	})
	// Belt and braces: the task's process is killed even if the cluster's
	// sweep misses it.
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	n, err := readInt("count")
	must.NoError(t, err)
	must.Eq(t, 1, n)
	must.True(t, pidAlive(pid))

	vi := -1
	for i, ag := range c.Clients {
		if ids[ag.Name] == alloc.NodeID {
			vi = i
		}
	}
	must.NonNegative(t, vi)
	c.KillClient(vi, syscall.SIGKILL)
	must.True(t, pidAlive(pid), must.Sprint("the task died with its client"))
	c.RestartClient(vi)

	// The client comes back, reports the node ready, and the allocation is
	// running again on its report, with no second start.
	WaitFor(t, settle, func() error {
		nodes, err := Nodes(c.API(), false)
		if err != nil {
			return err
		}
		for _, nd := range nodes {
			if nd.ID == alloc.NodeID && nd.Status != "ready" {
				return fmt.Errorf("node %s is %s", nd.Name, nd.Status)
			}
		}
		return nil
	})
	// The restarted client restores the allocation from its state DB and
	// re-attaches to the task; the servers still see the one allocation
	// running.
	WaitFor(t, settle, func() error {
		log := c.Clients[vi].Log()
		_, after, ok := strings.Cut(log, "==== e2e: start #2")
		if !ok {
			return fmt.Errorf("no second start in the log")
		}
		if strings.Contains(after, "could not re-attach") {
			return fmt.Errorf("client could not re-attach:\n%s", after)
		}
		if !strings.Contains(after, "restoring allocation") || !strings.Contains(after, alloc.ID) {
			return fmt.Errorf("restarted client has not restored allocation %s yet", alloc.ID)
		}
		return nil
	})
	c.WaitJobAllocs("keep", settle, func(list []*Alloc) error {
		if len(list) != 1 {
			return fmt.Errorf("%d allocations, want 1", len(list))
		}
		a := list[0]
		if a.ID != alloc.ID || a.ClientStatus != "running" {
			return fmt.Errorf("allocation %s, want %s running", a, shortAlloc(alloc.ID))
		}
		return nil
	})
	n, err = readInt("count")
	must.NoError(t, err)
	must.Eq(t, 1, n, must.Sprint("the task was started again"))
	again, err := readInt("pid")
	must.NoError(t, err)
	must.Eq(t, pid, again)
	must.True(t, pidAlive(pid), must.Sprint("the original task is gone"))
}
