//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// EnvBenchHandoffs overrides how many handoffs of each kind
// BenchmarkLeadership_LeaderlessGap measures (default 20), and
// EnvBenchLogLevel the servers' log level (default INFO; DEBUG shows
// Raft's election, with ROAM_E2E_KEEP_LOGS to keep the logs).
const (
	EnvBenchHandoffs = "ROAM_BENCH_HANDOFFS"
	EnvBenchLogLevel = "ROAM_BENCH_LOG_LEVEL"
)

// hclogTime is hclog's default timestamp layout (millisecond resolution),
// for suites that read agents' log timestamps.
const hclogTime = "2006-01-02T15:04:05.000Z0700"

// handoffSample is one measured change of leader, as the servers' own
// metrics tell it (nomad/leader_metrics.go).
type handoffSample struct {
	kind     string // "graceful" (SIGTERM) or "kill9" (SIGKILL)
	old, new int
	// gap is the leaderless gap the new leader measured: from the last
	// contact with the old leader to its own duties open.
	gap time.Duration
	// takeover holds the new leader's roam_leader_takeover_*_ms gauges, by
	// step.
	takeover map[string]time.Duration
	// handoff holds, for a graceful stop, the old leader's
	// roam_leader_handoff_*_ms gauges by step, from the metrics it left
	// as it exited.
	handoff map[string]time.Duration
	// drained is how many controller calls the old leader drained.
	drained int
	// waited is whether the new leader's FSM still had to catch up on
	// the previous terms' entries when it won (nomad's catchUp).
	waited bool
	// seen is from the signal until a surviving server answers
	// /v1/status/leader with another running server: measured outside.
	seen time.Duration
	// exit describes how the old leader's process ended.
	exit string
	// note records anything unexpected about this handoff.
	note string
}

// The steps of a takeover and a handoff as the benchmark prints them, in
// the order they happen; the names are those of the gauges.
var (
	takeoverSteps = []string{"caught_up", "cluster_id", "lanes", "heartbeats", "watcher", "eval_broker", "drainer",
		"acquired_to_duties", "heartbeat_timers", "eval_restore", "workers", "duties_to_done"}
	handoffSteps = []string{"revoke", "drain", "barrier", "transfer", "total"}
)

// BenchmarkLeadership_LeaderlessGap measures, on a three-server cluster of
// real processes with on-disk Raft, how long the cluster goes without a
// serving leader when the leader is stopped gracefully (SIGTERM: it hands
// leadership over) and when it is killed (SIGKILL: the others wait out an
// election timeout). One iteration is the whole measurement: handoffs of
// each kind, alternating, with the old leader restarted as a follower and
// the cluster whole again before the next one. Between two rounds, three
// bare hashicorp/raft nodes in this process, on the same disk, hand
// leadership over once (bench_rawraft_test.go): the engine's own figure,
// under the same load, which Roam's graceful handoff is judged against.
//
// Run with: go test -tags e2e -run '^$' -bench LeaderlessGap -benchtime 1x ./e2e/
func BenchmarkLeadership_LeaderlessGap(b *testing.B) {
	n := 20
	if s := os.Getenv(EnvBenchHandoffs); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			b.Fatalf("%s=%q: want a positive integer", EnvBenchHandoffs, s)
		}
		n = v
	}
	level := "INFO"
	if l := os.Getenv(EnvBenchLogLevel); l != "" {
		level = l
	}
	c := StartCluster(b, Opts{Servers: 3, LogLevel: level})
	waitWhole(b, c, -1)
	raw := startRawCluster(b, filepath.Join(c.Dir, "raw-raft"))

	var samples []handoffSample
	var rawTimes []rawHandoff
	b.ResetTimer()
	for range b.N {
		for i := range n {
			samples = append(samples, measureHandoff(b, c, "graceful", syscall.SIGTERM))
			fmt.Printf("graceful %2d/%d: %s\n", i+1, n, samples[len(samples)-1])
			samples = append(samples, measureHandoff(b, c, "kill9", syscall.SIGKILL))
			fmt.Printf("kill9    %2d/%d: %s\n", i+1, n, samples[len(samples)-1])
			rawTimes = append(rawTimes, measureRawHandoffs(b, raw, 1)...)
			r := rawTimes[len(rawTimes)-1]
			fmt.Printf("raw raft %2d/%d: transfer->first write %s, last contact->first write %s\n", i+1, n, fmtMS(r.transfer), fmtMS(r.gap))
		}
	}
	b.StopTimer()
	reportLeaderlessGap(b, samples, rawTimes)
}

func (s handoffSample) String() string {
	out := fmt.Sprintf("server-%d -> server-%d gap=%s seen=%s caught_up_at_win=%t takeover[%s]",
		s.old, s.new, fmtMS(s.gap), s.seen.Round(time.Millisecond), !s.waited, fmtSteps(s.takeover, takeoverSteps))
	if s.handoff != nil {
		out += fmt.Sprintf(" handoff[%s] drained=%d", fmtSteps(s.handoff, handoffSteps), s.drained)
	}
	out += fmt.Sprintf(" exit=%q", s.exit)
	if s.note != "" {
		out += " NOTE: " + s.note
	}
	return out
}

func fmtSteps(m map[string]time.Duration, order []string) string {
	var parts []string
	for _, k := range order {
		if d, ok := m[k]; ok {
			parts = append(parts, k+"="+fmtMS(d))
		}
	}
	return strings.Join(parts, " ")
}

// gaugesMS picks the gauges prefix+step+"_ms" out of m.
func gaugesMS(m map[string]float64, prefix string, steps []string) map[string]time.Duration {
	out := make(map[string]time.Duration)
	for _, k := range steps {
		if v, ok := m[prefix+k+"_ms"]; ok {
			out[k] = time.Duration(v * float64(time.Millisecond))
		}
	}
	return out
}

// measureHandoff signals the current leader with sig, waits for another
// server to lead and to finish its takeover, reads the figures from the
// servers' metrics, then restarts the old leader and waits for the
// cluster to be whole again.
func measureHandoff(b *testing.B, c *Cluster, kind string, sig syscall.Signal) handoffSample {
	b.Helper()
	old := c.Leader()
	s := handoffSample{kind: kind, old: old, new: -1}

	before := survivorMetrics(b, c, old)

	start := time.Now()
	if err := c.Servers[old].Signal(sig); err != nil {
		b.Fatalf("signal %s: %v", c.Servers[old].Name, err)
	}
	// The outside view: a survivor names another server as leader. Polled
	// every 20 ms: at 5 ms the requests (and the garbage they leave) loaded
	// the servers whose gap is measured, and their collections landed
	// inside elections; the gap itself is measured by the servers.
	if err := pollEvery(settle, 20*time.Millisecond, func() error {
		for i, a := range c.Servers {
			if i == old {
				continue
			}
			l, err := StatusLeader(a.HTTPAddr())
			if err != nil {
				continue
			}
			if idx := c.serverByRPC(l); idx >= 0 && idx != old {
				return nil
			}
		}
		return errors.New("no survivor names a new leader")
	}); err != nil {
		b.Fatalf("%s after %s of %s: %v", kind, sig, c.Servers[old].Name, err)
	}
	s.seen = time.Since(start)

	timeout := stopTimeout
	if sig == syscall.SIGKILL {
		timeout = killTimeout
	}
	if _, err := c.Servers[old].Wait(timeout); err != nil {
		b.Fatalf("after %s: %v", sig, err)
	}
	s.exit = c.Servers[old].ExitState()

	// The new leader, as the survivors agree on it, once it has finished
	// its takeover (duties open, then the work that follows).
	var now map[string]float64
	s.new, now = awaitTakeover(b, c, old, before, settle)
	var notes []string
	if k := now[metricDutiesStarted] - before[s.new][metricDutiesStarted]; k > 1 {
		notes = append(notes, fmt.Sprintf("new leader started duties %.0f times", k))
	}
	for i, a := range c.Servers {
		if i == old || i == s.new {
			continue
		}
		if m, err := promMetrics(a.HTTPAddr()); err == nil && m[metricDutiesStarted] > before[i][metricDutiesStarted] {
			notes = append(notes, fmt.Sprintf("%s also led for a while", a.Name))
		}
	}
	s.takeover = gaugesMS(now, "roam_leader_takeover_", takeoverSteps)
	s.waited = now[metricCatchUpWaited] > before[s.new][metricCatchUpWaited]
	gap, ok := now[metricGapMS]
	if !ok {
		b.Fatalf("%s: new leader %s published no %s", kind, c.Servers[s.new].Name, metricGapMS)
	}
	s.gap = time.Duration(gap * float64(time.Millisecond))
	if gap <= 0 {
		notes = append(notes, fmt.Sprintf("new leader measured no gap; its counters: duties %.0f->%.0f, takeovers %.0f->%.0f",
			before[s.new][metricDutiesStarted], now[metricDutiesStarted], before[s.new][metricTakeoverDone], now[metricTakeoverDone]))
	}
	if sig == syscall.SIGTERM {
		m, err := exitMetrics(c.Servers[old])
		switch {
		case err != nil:
			notes = append(notes, err.Error())
		case m[metricHandoffDone] < 1:
			notes = append(notes, "old leader completed no handoff")
		default:
			s.handoff = gaugesMS(m, "roam_leader_handoff_", handoffSteps)
			s.drained = int(m[metricDrainedCalls])
		}
		if !strings.Contains(s.exit, "exit status 0") {
			notes = append(notes, "graceful stop did not exit 0")
		}
	}
	s.note = strings.Join(notes, "; ")

	c.RestartServer(old)
	waitWhole(b, c, old)
	waitQuiet(b, c)
	return s
}

// Quiet, for waitQuiet: every server used at most quietCPU of CPU time in
// the last quietWindow.
const (
	quietWindow = 500 * time.Millisecond
	quietCPU    = quietWindow / 25 // 4 % of a core
)

// waitQuiet waits until no server is busy: a server restarted a moment
// ago is still loading its state, catching up on the log and joining the
// gossip pool, and on two cores that work delays the others too. The raw
// engine's nodes, which are never restarted, are measured quiet; so are
// Roam's servers.
func waitQuiet(b *testing.B, c *Cluster) {
	b.Helper()
	type sample struct {
		at  time.Time
		cpu time.Duration
	}
	window := make([][]sample, len(c.Servers))
	err := pollEvery(settle, 50*time.Millisecond, func() error {
		now := time.Now()
		var busy []string
		for i, a := range c.Servers {
			cpu, err := procCPU(a.PID())
			if err != nil {
				return err
			}
			window[i] = append(window[i], sample{now, cpu})
			for len(window[i]) > 1 && now.Sub(window[i][1].at) >= quietWindow {
				window[i] = window[i][1:]
			}
			first := window[i][0]
			if now.Sub(first.at) < quietWindow {
				busy = append(busy, a.Name+" (not watched long enough)")
			} else if used := cpu - first.cpu; used > quietCPU {
				busy = append(busy, fmt.Sprintf("%s (%s of CPU in %s)", a.Name, used, now.Sub(first.at).Round(time.Millisecond)))
			}
		}
		if len(busy) > 0 {
			return fmt.Errorf("servers busy: %s", strings.Join(busy, ", "))
		}
		return nil
	})
	if err != nil {
		b.Fatalf("cluster never quiet: %v", err)
	}
}

// waitWhole waits until every server runs, agrees on one leader (not
// notLeader, the server just restarted), lists all three as voters, and
// sees every server alive, as TestFoundation_ClusterFailover does after a
// restart.
func waitWhole(b *testing.B, c *Cluster, notLeader int) {
	b.Helper()
	names := make([]string, len(c.Servers))
	for i, a := range c.Servers {
		names[i] = a.Name
	}
	var leader int
	WaitFor(b, settle, func() error {
		idx, err := c.LeaderNow()
		if err != nil {
			return err
		}
		if idx == notLeader {
			return fmt.Errorf("restarted server %s is leader", c.Servers[idx].Name)
		}
		leader = idx
		return nil
	})
	for i := range c.Servers {
		WaitFor(b, settle, func() error { return checkRaft(c, c.ServerHTTP(i), leader, notLeader) })
		WaitFor(b, settle, func() error { return checkMembersHTTP(c.ServerHTTP(i), names, nil) })
	}
}

// reportLeaderlessGap reports the percentiles as benchmark metrics and logs
// a summary table: Roam's gaps, each step of its takeover and handoff, and
// the raw engine's handovers measured in the same run.
func reportLeaderlessGap(b *testing.B, samples []handoffSample, raw []rawHandoff) {
	b.Helper()
	pick := func(kind string, f func(handoffSample) (time.Duration, bool)) []time.Duration {
		var out []time.Duration
		for _, s := range samples {
			if s.kind == kind {
				if d, ok := f(s); ok {
					out = append(out, d)
				}
			}
		}
		slices.Sort(out)
		return out
	}
	gap := func(s handoffSample) (time.Duration, bool) { return s.gap, true }
	seen := func(s handoffSample) (time.Duration, bool) { return s.seen, true }
	step := func(m func(handoffSample) map[string]time.Duration, k string) func(handoffSample) (time.Duration, bool) {
		return func(s handoffSample) (time.Duration, bool) {
			d, ok := m(s)[k]
			return d, ok
		}
	}
	takeover := func(s handoffSample) map[string]time.Duration { return s.takeover }
	handoff := func(s handoffSample) map[string]time.Duration { return s.handoff }

	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	g, k := pick("graceful", gap), pick("kill9", gap)
	var r, rgap []time.Duration
	for _, h := range raw {
		r = append(r, h.transfer)
		if h.gap >= 0 {
			rgap = append(rgap, h.gap)
		}
	}
	slices.Sort(r)
	slices.Sort(rgap)
	gp50, gp99 := percentile(g, 50), percentile(g, 99)
	kp50, kp99 := percentile(k, 50), percentile(k, 99)
	rp50, rp99 := percentile(r, 50), percentile(r, 99)
	killRatio, rawRatio := math.NaN(), math.NaN()
	if gp99 > 0 {
		killRatio = float64(kp50) / float64(gp99)
	}
	if rp99 > 0 {
		rawRatio = float64(gp99) / float64(rp99)
	}
	b.ReportMetric(ms(gp50), "graceful_p50_ms")
	b.ReportMetric(ms(gp99), "graceful_p99_ms")
	b.ReportMetric(ms(kp50), "kill9_p50_ms")
	b.ReportMetric(ms(kp99), "kill9_p99_ms")
	b.ReportMetric(ms(rp50), "raw_p50_ms")
	b.ReportMetric(ms(rp99), "raw_p99_ms")
	b.ReportMetric(killRatio, "kill9_p50/graceful_p99")
	b.ReportMetric(rawRatio, "graceful_p99/raw_p99")

	var t strings.Builder
	fmt.Fprintf(&t, "leaderless gap over %d graceful and %d kill -9 handoffs (3 servers, raft-wal on disk), "+
		"and %d raw hashicorp/raft handoffs in this process on the same disk\n", len(g), len(k), len(r))
	fmt.Fprintf(&t, "%-9s %-34s %5s %9s %9s %9s %9s %9s\n", "kind", "figure (from the servers' metrics)", "n", "min", "p50", "p90", "p99", "max")
	row := func(kind, name string, d []time.Duration) {
		if len(d) == 0 {
			return
		}
		fmt.Fprintf(&t, "%-9s %-34s %5d %9s %9s %9s %9s %9s\n", kind, name, len(d),
			fmtMS(percentile(d, 0)), fmtMS(percentile(d, 50)), fmtMS(percentile(d, 90)),
			fmtMS(percentile(d, 99)), fmtMS(percentile(d, 100)))
	}
	row("raw", "transfer->first write committed", r)
	row("raw", "last contact->first write", rgap)
	for _, kind := range []string{"graceful", "kill9"} {
		waited := 0
		for _, s := range samples {
			if s.kind == kind && s.waited {
				waited++
			}
		}
		fmt.Fprintf(&t, "%-9s new leader's FSM behind the previous terms when it won: %d of %d\n", kind, waited, len(pick(kind, gap)))
		row(kind, "leaderless_gap", pick(kind, gap))
		row(kind, "signal->leader seen (http)", pick(kind, seen))
		for _, st := range handoffSteps {
			row(kind, "old: handoff "+st, pick(kind, step(handoff, st)))
		}
		for _, st := range takeoverSteps {
			row(kind, "new: takeover "+st, pick(kind, step(takeover, st)))
		}
	}
	fmt.Fprintf(&t, "ratio graceful_p99 / raw_p99 = %.2f (target <= 1.2): %s\n", rawRatio, verdict(rawRatio <= 1.2))
	if rp50 > 0 {
		// Less at the mercy of one slow handoff on a loaded machine.
		fmt.Fprintf(&t, "ratio graceful_p50 / raw_p50 = %.2f\n", float64(gp50)/float64(rp50))
	}
	fmt.Fprintf(&t, "ratio kill9_p50 / graceful_p99 = %.1f (target >= 100): %s\n", killRatio, verdict(killRatio >= 100))
	for _, s := range samples {
		if s.note != "" {
			fmt.Fprintf(&t, "anomaly: %s %s\n", s.kind, s)
		}
	}
	// Straight to stdout: a benchmark's log is cut to its first lines
	// unless run with -v, and this table is what the run is for.
	fmt.Printf("--- %s summary\n%s", b.Name(), t.String())
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// percentile returns the nearest-rank p-th percentile of sorted (p = 0 is
// the minimum), 0 when empty.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

func fmtMS(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + "ms"
}
