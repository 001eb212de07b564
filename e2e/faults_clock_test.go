//go:build e2e

package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"golang.org/x/sys/unix"

	"github.com/roamhq/roam/internal/lincheck"
)

// clockStep is how far the clock-step test steps the machine's wall
// clock, forward and then back, as in the issue.
const clockStep = time.Hour

// clockPhase is how long each phase of the clock-step test holds.
const clockPhase = 15 * time.Second

// The machine's wall clock steps an hour forward, then to an hour behind,
// then back to the true time, under claim churn and the linearizability
// workload. Every agent shares the clock, so a step is every server and
// client stepping at once, as NTP correcting a bad clock would do to one
// of them. Timers and timeouts run on the monotonic clock, which does not
// step: no node may be seen down, claims and releases are granted in
// every phase, the churn checker's counts are 0 and the volume API's
// history is linearizable. docs/faults.md has the figures.
func TestFaults_ClockStep(t *testing.T) {
	cc, ch := startFaultCluster(t, 500*time.Millisecond)
	seed := time.Now().UnixNano() % 1e6
	lin := startLinWorkload(t, cc, seed)
	ch.start(seed)
	watch := watchLeader(cc)
	t.Cleanup(watch.halt)
	clock := ownClock(t, 3*clockPhase+2*time.Minute)

	type phase struct {
		name       string
		offset     time.Duration
		start, end time.Time
	}
	phases := []*phase{{name: "on time"}, {name: "an hour ahead", offset: clockStep},
		{name: "an hour behind", offset: -clockStep}, {name: "on time again"}}
	for _, p := range phases {
		clock.set(p.offset)
		p.start = time.Now()
		hold(clockPhase)
		p.end = time.Now()
		t.Logf("clock step: phase %q over: wall clock %s from the true time", p.name, p.offset)
	}
	watch.halt()

	rep := ch.check(t, "clock step", time.Now(), nil, nil, nil)
	t.Logf("clock step counts: claims cycled=%d", rep.Cycles)
	history := lin.rec.History()
	lin.finish(t, "clock step")
	lin.mu.Lock()
	down := len(lin.downNodes)
	lin.mu.Unlock()
	must.Zero(t, down, must.Sprint("a node was seen down: its heartbeat timed out on a stepped clock"))

	rows := []string{"phase           call     changed  p50       p99       max       repeats  refused  unknown  leader changes  no leader"}
	for _, p := range phases {
		from, to := lin.rec.Offset(p.start), lin.rec.Offset(p.end)
		changes, gap := watch.between(p.start, p.end)
		for _, kind := range []lincheck.Kind{lincheck.KindClaim, lincheck.KindRelease} {
			st := phaseCalls(history, kind, from, to)
			must.Positive(t, len(st.changed), must.Sprintf("phase %q: no %s was granted", p.name, kind))
			rows = append(rows, fmt.Sprintf("%-15s %-7s  %7d  %-8s  %-8s  %-8s  %7d  %7d  %7d  %14d  %s", p.name, kind,
				len(st.changed), fmtMS(percentile(st.changed, 50)), fmtMS(percentile(st.changed, 99)),
				fmtMS(st.changed[len(st.changed)-1]), st.repeats, st.refused, st.unknown, changes, gap.Round(time.Millisecond)))
		}
	}
	t.Logf("clock step (%s each way, %s per phase):\n  %s", clockStep, clockPhase, strings.Join(rows, "\n  "))
}

// machineClock steps the machine's wall clock (CLOCK_REALTIME, which
// every process reads) away from the true time and back. The true time
// is the wall time when the test took the clock plus the monotonic time
// since, which no step touches.
type machineClock struct {
	t     *testing.T
	wall0 time.Time // carries its monotonic reading
}

// ownClock takes the machine's clock for the test and puts it back on
// the true time when the test ends. A test process that dies before its
// cleanup (a timeout's panic) would leave the machine an hour off, so a
// watchdog in a session of its own sets the clock to the true time after
// within, unless the cleanup stops it first.
func ownClock(t *testing.T, within time.Duration) *machineClock {
	t.Helper()
	c := &machineClock{t: t, wall0: time.Now()}
	at := c.wall0.Add(within).Unix()
	dog := exec.Command("sh", "-c", fmt.Sprintf("sleep %d && date -u -s @%d", int(within.Seconds()), at))
	dog.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	must.NoError(t, dog.Start())
	t.Cleanup(func() {
		_ = dog.Process.Kill()
		_ = dog.Wait()
		if err := c.trySet(0); err != nil {
			t.Errorf("e2e: put the clock back on the true time: %v", err)
		}
	})
	return c
}

// set steps the wall clock to offset from the true time, and checks the
// step took.
func (c *machineClock) set(offset time.Duration) {
	c.t.Helper()
	must.NoError(c.t, c.trySet(offset), must.Sprint("stepping the machine's clock needs root (CAP_SYS_TIME)"))
	off := time.Now().Round(0).Sub(c.truth())
	must.True(c.t, (off-offset).Abs() < time.Second, must.Sprintf("the clock is %s from the true time, not %s", off, offset))
}

func (c *machineClock) truth() time.Time { return c.wall0.Round(0).Add(time.Since(c.wall0)) }

func (c *machineClock) trySet(offset time.Duration) error {
	ts := unix.NsecToTimespec(c.truth().Add(offset).UnixNano())
	return unix.ClockSettime(unix.CLOCK_REALTIME, &ts)
}
