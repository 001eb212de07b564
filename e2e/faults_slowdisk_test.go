//go:build e2e

package e2e

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/internal/lincheck"
)

// slowSyncDelay is what each fsync on a slow disk takes, as in the issue.
const slowSyncDelay = 2 * time.Second

// slowDiskPhase is how long each phase of the slow-fsync test holds, under
// claim churn and the linearizability workload.
const slowDiskPhase = 20 * time.Second

// A slow disk under a server: every server's data dir is served through
// the FUSE passthrough (diskfaults_linux.go), and the test runs three
// phases under claim churn and the linearizability workload: every fsync
// at full speed (the baseline), then 2 s per fsync under the leader, then
// under one follower. Each phase reports the claim latency the workload's
// clients saw (p50, p99, max, and its ratio to the baseline) and how
// stable leadership was (changes of leader, time without one every server
// agreed on); docs/faults.md has the figures. A slow disk may make the
// cluster slow, never unsafe: the churn checker's three counts are 0, the
// history of the volume API is linearizable, and claims are answered in
// every phase.
func TestFaults_SlowFsync(t *testing.T) {
	cc, ch := startFaultCluster(t, 500*time.Millisecond)
	disks := cc.serversOnDiskFaults(t)
	seed := time.Now().UnixNano() % 1e6
	lin := startLinWorkload(t, cc, seed)
	ch.start(seed)
	watch := watchLeader(cc)
	t.Cleanup(watch.halt)

	type phase struct {
		name       string
		slow       int // the server whose disk is slow; -1 for none
		start, end time.Time
		syncs      int64 // fsyncs the slow server made in the phase
	}
	phases := []*phase{{name: "baseline", slow: -1}, {name: "slow leader"}, {name: "slow follower"}}
	for _, p := range phases {
		leader := cc.Leader()
		switch p.name {
		case "slow leader":
			p.slow = leader
		case "slow follower":
			p.slow = (leader + 1) % len(cc.Servers)
		}
		var before int64
		if p.slow >= 0 {
			before = disks[p.slow].syncs.Load()
			disks[p.slow].syncDelay.Store(int64(slowSyncDelay))
		}
		p.start = time.Now()
		hold(slowDiskPhase)
		p.end = time.Now()
		if p.slow >= 0 {
			disks[p.slow].syncDelay.Store(0)
			p.syncs = disks[p.slow].syncs.Load() - before
		}
		what := "every disk at full speed"
		if p.slow >= 0 {
			what = fmt.Sprintf("%s's fsyncs take %s (leader at the start: %s), %d made", cc.Servers[p.slow].Name, slowSyncDelay, cc.Servers[leader].Name, p.syncs)
		}
		t.Logf("slow fsync: phase %q over: %s", p.name, what)
	}
	watch.halt()

	rep := ch.check(t, "slow fsync", time.Now(), nil, nil, nil)
	t.Logf("slow fsync counts: claims cycled=%d", rep.Cycles)
	history := lin.rec.History()
	lin.finish(t, "slow fsync")

	base := map[lincheck.Kind]time.Duration{}
	rows := []string{"phase          call     changed  p50       p99       max       p50/base  repeats  refused  unknown  leader changes  no leader"}
	for _, p := range phases {
		from, to := lin.rec.Offset(p.start), lin.rec.Offset(p.end)
		changes, gap := watch.between(p.start, p.end)
		for _, kind := range []lincheck.Kind{lincheck.KindClaim, lincheck.KindRelease} {
			st := phaseCalls(history, kind, from, to)
			// Every phase answers calls. With a fast quorum (the leader's
			// disk at full speed) some change claims too; under a slow
			// leader a 20 s phase has room for a few changes or none.
			must.Positive(t, len(st.changed)+st.repeats+st.refused, must.Sprintf("phase %q: no %s was answered", p.name, kind))
			if p.name != "slow leader" {
				must.Positive(t, len(st.changed), must.Sprintf("phase %q: no %s changed a claim", p.name, kind))
			}
			p50, p99, most, ratio := "-", "-", "-", "-"
			if n := len(st.changed); n > 0 {
				p50, p99, most = fmtMS(percentile(st.changed, 50)), fmtMS(percentile(st.changed, 99)), fmtMS(st.changed[n-1])
				if p.slow < 0 {
					base[kind] = percentile(st.changed, 50)
				}
				ratio = fmt.Sprintf("%.1f", float64(percentile(st.changed, 50))/float64(max(base[kind], 1)))
			}
			rows = append(rows, fmt.Sprintf("%-14s %-7s  %7d  %-8s  %-8s  %-8s  %8s  %7d  %7d  %7d  %14d  %s", p.name, kind,
				len(st.changed), p50, p99, most, ratio, st.repeats, st.refused, st.unknown, changes, gap.Round(time.Millisecond)))
			t.Logf("slow fsync: phase %q: slowest %s that changed the claim: %s", p.name, kind, st.slowest)
		}
		if p.slow >= 0 {
			must.Positive(t, p.syncs, must.Sprintf("phase %q: %s made no fsync, so its disk was never slow", p.name, cc.Servers[p.slow].Name))
		}
	}
	t.Logf("slow fsync (%s per fsync, %s per phase):\n  %s", slowSyncDelay, slowDiskPhase, strings.Join(rows, "\n  "))
}

// serversOnDiskFaults serves each server's data dir through a diskFaults,
// one server at a time: it is stopped, its data dir moved under the
// mount, and it is started again and rejoins before the next one stops.
// It returns the faults by server index.
func (cc *csiCluster) serversOnDiskFaults(t *testing.T) []*diskFaults {
	t.Helper()
	out := make([]*diskFaults, len(cc.Servers))
	for i, s := range cc.Servers {
		_, killed, err := s.Stop(30 * time.Second)
		must.NoError(t, err)
		must.False(t, killed, must.Sprintf("%s did not stop on SIGTERM", s.Name))
		out[i] = onDiskFaults(t, s)
		cc.RestartServer(i)
		cc.waitRejoined(t, i)
	}
	return out
}

// hold lets the load run for d: a phase's length, not a wait for a
// condition.
func hold(d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	<-timer.C
}

// callStats is what a phase's calls of one kind saw: how long each one
// that was granted and changed the claim took, sorted; how many were
// granted as repeats (a claim its allocation already held, a release of
// a claim it did not hold: no Raft write, no plugin call); how many were
// refused (answered, changing nothing); how many never answered or
// answered with their outcome unknown; and a line on the slowest change.
type callStats struct {
	changed                   []time.Duration
	repeats, refused, unknown int
	slowest                   string
}

// phaseCalls gathers callStats for the calls of kind made in [from, to),
// on the history's clock. Each claimer works one volume for one
// allocation at a time, so whether a granted call changed the claim
// follows from the last definite outcome of the same pair before it.
func phaseCalls(history []porcupine.Operation, kind lincheck.Kind, from, to int64) callStats {
	ops := slices.Clone(history)
	slices.SortFunc(ops, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	type pair struct{ vol, alloc string }
	held := make(map[pair]*bool) // nil: not known
	var st callStats
	var worst time.Duration
	for _, op := range ops {
		in, ok := op.Input.(lincheck.Input)
		if !ok || (in.Kind != lincheck.KindClaim && in.Kind != lincheck.KindRelease) {
			continue
		}
		out, _ := op.Output.(lincheck.Output)
		k := pair{in.Volume, in.Alloc}
		was := held[k]
		unknown := op.Return == math.MaxInt64 || out.Result == lincheck.Unknown
		switch {
		case unknown:
			held[k] = nil
		case out.Result == lincheck.OK:
			h := in.Kind == lincheck.KindClaim
			held[k] = &h
		}
		if in.Kind != kind || op.Call < from || op.Call >= to {
			continue
		}
		switch {
		case unknown:
			st.unknown++
			continue
		case out.Result != lincheck.OK:
			st.refused++
			continue
		case was != nil && *was == (kind == lincheck.KindClaim):
			st.repeats++
			continue
		}
		d := time.Duration(op.Return - op.Call)
		st.changed = append(st.changed, d)
		if d > worst {
			worst = d
			st.slowest = fmt.Sprintf("%s, volume %s, allocation %s, called %s into the history", fmtMS(d), in.Volume, in.Alloc,
				time.Duration(op.Call).Round(time.Millisecond))
		}
	}
	slices.Sort(st.changed)
	return st
}

// leaderWatch samples which server every running server agrees leads,
// every 100 ms, until halted.
type leaderWatch struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once

	mu      sync.Mutex
	samples []leaderSample
}

// leaderSample is one sample: the agreed leader's index, -1 for none.
type leaderSample struct {
	at     time.Time
	leader int
}

func watchLeader(cc *csiCluster) *leaderWatch {
	w := &leaderWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			leader, err := cc.LeaderNow()
			if err != nil {
				leader = -1
			}
			w.mu.Lock()
			w.samples = append(w.samples, leaderSample{at: time.Now(), leader: leader})
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *leaderWatch) halt() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

// between returns, for the samples taken in [from, to), how many times the
// agreed leader changed (a server taking over from another; a return to
// the same leader after a gap is no change), and how long no leader was
// agreed on (each sample without one counts until the next sample).
func (w *leaderWatch) between(from, to time.Time) (changes int, noLeader time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	last := -1
	for i, s := range w.samples {
		if s.at.Before(from) {
			if s.leader >= 0 {
				last = s.leader
			}
			continue
		}
		if !s.at.Before(to) {
			break
		}
		if s.leader < 0 {
			next := to
			if i+1 < len(w.samples) && w.samples[i+1].at.Before(to) {
				next = w.samples[i+1].at
			}
			noLeader += next.Sub(s.at)
			continue
		}
		if last >= 0 && s.leader != last {
			changes++
		}
		last = s.leader
	}
	return changes, noLeader
}
