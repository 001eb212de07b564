//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// EnvBenchHandoffs overrides how many handoffs of each kind
// BenchmarkLeadership_LeaderlessGap measures (default 20).
const EnvBenchHandoffs = "ROAM_BENCH_HANDOFFS"

// The new leader's own figure for the gap, logged by reportLeaderlessGap in
// nomad/leader.go: from the last time it heard from the previous leader to
// the start of its own duties. hclog writes the duration with String().
var (
	dutiesRe   = regexp.MustCompile(`(?m)^(\S+) \[INFO\]\s+.*leader duties started(?:: leaderless_gap=(\S+))?`)
	acquiredRe = regexp.MustCompile(`(?m)^(\S+) \[INFO\]\s+.*cluster leadership acquired`)
)

// hclogTime is hclog's default timestamp layout (millisecond resolution).
const hclogTime = "2006-01-02T15:04:05.000Z0700"

// handoffSample is one measured change of leader.
type handoffSample struct {
	kind     string // "graceful" (SIGTERM) or "kill9" (SIGKILL)
	old, new int
	// gap is the leaderless gap the new leader logged.
	gap time.Duration
	// duties is the new leader's "cluster leadership acquired" to "leader
	// duties started" (barrier plus duty start), from log timestamps, so
	// only to the millisecond; negative when not found.
	duties time.Duration
	// seen is from the signal until a surviving server answers
	// /v1/status/leader with another running server: measured outside.
	seen time.Duration
	// toDuties is from the signal to the new leader's "leader duties
	// started" line (log timestamp); gap - toDuties is how long the new
	// leader had not heard from the old one when the signal was sent.
	// Negative when not found.
	toDuties time.Duration
	// handover is, for a graceful stop, the old leader's "server shutting
	// down" to "leadership handed over" (log timestamps); negative if absent.
	handover time.Duration
	// exit describes how the old leader's process ended.
	exit string
	// note records anything unexpected about this handoff.
	note string
}

// BenchmarkLeadership_LeaderlessGap measures, on a three-server cluster of
// real processes with on-disk Raft, how long the cluster goes without a
// serving leader when the leader is stopped gracefully (SIGTERM: it hands
// leadership over) and when it is killed (SIGKILL: the others wait out an
// election timeout). One iteration is the whole measurement: handoffs of
// each kind, alternating, with the old leader restarted as a follower and
// the cluster whole again before the next one.
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
	// INFO keeps the logs small enough to reread on every poll; every line
	// the measurement reads is logged at INFO.
	c := StartCluster(b, Opts{Servers: 3, LogLevel: "INFO"})
	waitWhole(b, c, -1)

	var samples []handoffSample
	b.ResetTimer()
	for range b.N {
		for i := range n {
			samples = append(samples, measureHandoff(b, c, "graceful", syscall.SIGTERM))
			b.Logf("graceful %2d/%d: %s", i+1, n, samples[len(samples)-1])
			samples = append(samples, measureHandoff(b, c, "kill9", syscall.SIGKILL))
			b.Logf("kill9    %2d/%d: %s", i+1, n, samples[len(samples)-1])
		}
	}
	b.StopTimer()
	reportLeaderlessGap(b, samples)
}

func (s handoffSample) String() string {
	out := fmt.Sprintf("server-%d -> server-%d gap=%s acquired->duties=%s signal->duties=%s seen=%s",
		s.old, s.new, s.gap, s.duties, s.toDuties, s.seen.Round(time.Millisecond))
	if s.handover >= 0 {
		out += fmt.Sprintf(" handover=%s", s.handover)
	}
	out += fmt.Sprintf(" exit=%q", s.exit)
	if s.note != "" {
		out += " NOTE: " + s.note
	}
	return out
}

// measureHandoff signals the current leader with sig, waits for another
// server to lead and log its gap, then restarts the old leader and waits
// for the cluster to be whole again.
func measureHandoff(b *testing.B, c *Cluster, kind string, sig syscall.Signal) handoffSample {
	b.Helper()
	old := c.Leader()
	s := handoffSample{kind: kind, old: old, new: -1, duties: -1, toDuties: -1, handover: -1}

	// How many duty lines each other server has logged so far, so only a
	// line written after the signal counts.
	before := make(map[int]int)
	for i, a := range c.Servers {
		if i != old {
			before[i] = len(dutiesRe.FindAllStringSubmatch(a.Log(), -1))
		}
	}

	start := time.Now()
	if err := c.Servers[old].Signal(sig); err != nil {
		b.Fatalf("signal %s: %v", c.Servers[old].Name, err)
	}
	// The outside view: a survivor names another server as leader. Polled
	// tightly, since this is itself a measurement.
	if err := pollEvery(settle, 2*time.Millisecond, func() error {
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

	// The new leader, as the survivors agree on it, and its duty line.
	var lines [][]string
	WaitFor(b, settle, func() error {
		idx, err := c.LeaderNow()
		if err != nil {
			return err
		}
		if idx == old {
			return fmt.Errorf("%s still named leader", c.Servers[old].Name)
		}
		all := dutiesRe.FindAllStringSubmatch(c.Servers[idx].Log(), -1)
		if len(all) <= before[idx] {
			return fmt.Errorf("new leader %s has not logged its leader duties yet", c.Servers[idx].Name)
		}
		s.new, lines = idx, all[before[idx]:]
		return nil
	})
	var notes []string
	if len(lines) > 1 {
		notes = append(notes, fmt.Sprintf("new leader started duties %d times", len(lines)))
	}
	for i, a := range c.Servers {
		if i == old || i == s.new {
			continue
		}
		if k := len(dutiesRe.FindAllStringSubmatch(a.Log(), -1)); k > before[i] {
			notes = append(notes, fmt.Sprintf("%s also led for a while", a.Name))
		}
	}
	last := lines[len(lines)-1]
	if last[2] == "" {
		b.Fatalf("%s: new leader %s logged no leaderless_gap: %q", kind, c.Servers[s.new].Name, last[0])
	}
	gap, err := time.ParseDuration(last[2])
	if err != nil {
		b.Fatalf("%s: parse leaderless_gap in %q: %v", kind, last[0], err)
	}
	s.gap = gap
	s.duties = acquiredToDuties(c.Servers[s.new].Log(), last[1])
	if at, err := time.Parse(hclogTime, last[1]); err == nil {
		s.toDuties = at.Sub(start)
	}
	if sig == syscall.SIGTERM {
		oldLog := c.Servers[old].Log()
		s.handover = handoverTime(oldLog, start)
		if s.handover < 0 {
			// The agent's directory goes when the benchmark ends: keep
			// what the old leader said about its handoff.
			notes = append(notes, "old leader logged no handover:\n"+handoffLines(oldLog, start))
		}
	}
	if sig == syscall.SIGTERM && !strings.Contains(s.exit, "exit status 0") {
		notes = append(notes, "graceful stop did not exit 0")
	}
	s.note = strings.Join(notes, "; ")

	c.RestartServer(old)
	waitWhole(b, c, old)
	return s
}

// acquiredToDuties returns the time between the last "cluster leadership
// acquired" line at or before dutiesAt and dutiesAt, -1 if not found.
func acquiredToDuties(log, dutiesAt string) time.Duration {
	end, err := time.Parse(hclogTime, dutiesAt)
	if err != nil {
		return -1
	}
	got := time.Duration(-1)
	for _, m := range acquiredRe.FindAllStringSubmatch(log, -1) {
		t, err := time.Parse(hclogTime, m[1])
		if err != nil || t.After(end) {
			continue
		}
		got = end.Sub(t)
	}
	return got
}

// handoverTime returns, from the first "server shutting down" line logged
// at or after since, the time until the next "leadership handed over" line;
// -1 if either is missing. Timestamps are to the millisecond, so since is
// truncated likewise.
func handoverTime(log string, since time.Time) time.Duration {
	since = since.Truncate(time.Millisecond)
	var down time.Time
	for _, line := range strings.Split(log, "\n") {
		ts, _, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		t, err := time.Parse(hclogTime, ts)
		if err != nil || t.Before(since) {
			continue
		}
		switch {
		case down.IsZero() && strings.Contains(line, "server shutting down"):
			down = t
		case !down.IsZero() && strings.Contains(line, "leadership handed over"):
			return t.Sub(down)
		}
	}
	return -1
}

// handoffLines returns the old leader's warnings, errors and leadership
// lines logged at or after since.
func handoffLines(log string, since time.Time) string {
	since = since.Truncate(time.Millisecond)
	var out []string
	for _, line := range strings.Split(log, "\n") {
		ts, _, _ := strings.Cut(line, " ")
		t, err := time.Parse(hclogTime, ts)
		if err != nil || t.Before(since) {
			continue
		}
		if strings.Contains(line, "[WARN]") || strings.Contains(line, "[ERROR]") ||
			strings.Contains(line, "leader") || strings.Contains(line, "shutting down") {
			out = append(out, "    "+line)
		}
	}
	return strings.Join(out, "\n")
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
// a summary table.
func reportLeaderlessGap(b *testing.B, samples []handoffSample) {
	b.Helper()
	pick := func(kind string, f func(handoffSample) time.Duration) []time.Duration {
		var out []time.Duration
		for _, s := range samples {
			if s.kind == kind {
				if d := f(s); d >= 0 {
					out = append(out, d)
				}
			}
		}
		slices.Sort(out)
		return out
	}
	gap := func(s handoffSample) time.Duration { return s.gap }
	duties := func(s handoffSample) time.Duration { return s.duties }
	seen := func(s handoffSample) time.Duration { return s.seen }
	toDuties := func(s handoffSample) time.Duration { return s.toDuties }
	preSignal := func(s handoffSample) time.Duration {
		if s.toDuties < 0 {
			return -1
		}
		return max(0, s.gap-s.toDuties)
	}
	handover := func(s handoffSample) time.Duration { return s.handover }

	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	g, k := pick("graceful", gap), pick("kill9", gap)
	gp50, gp99 := percentile(g, 50), percentile(g, 99)
	kp50, kp99 := percentile(k, 50), percentile(k, 99)
	ratio := math.NaN()
	if gp99 > 0 {
		ratio = float64(kp50) / float64(gp99)
	}
	b.ReportMetric(ms(gp50), "graceful_p50_ms")
	b.ReportMetric(ms(gp99), "graceful_p99_ms")
	b.ReportMetric(ms(kp50), "kill9_p50_ms")
	b.ReportMetric(ms(kp99), "kill9_p99_ms")
	b.ReportMetric(ratio, "ratio")

	var t strings.Builder
	fmt.Fprintf(&t, "leaderless gap over %d graceful and %d kill -9 handoffs (3 servers, raft-wal on disk)\n", len(g), len(k))
	fmt.Fprintf(&t, "%-9s %-30s %5s %9s %9s %9s %9s %9s\n", "kind", "figure", "n", "min", "p50", "p90", "p99", "max")
	for _, kind := range []string{"graceful", "kill9"} {
		for _, f := range []struct {
			name string
			get  func(handoffSample) time.Duration
		}{
			{"leaderless_gap (log)", gap},
			{"  last contact->signal", preSignal},
			{"  signal->duties (log ts)", toDuties},
			{"  acquired->duties (log ts)", duties},
			{"old: shutting down->handed", handover},
			{"signal->leader seen (http)", seen},
		} {
			d := pick(kind, f.get)
			if len(d) == 0 {
				continue
			}
			fmt.Fprintf(&t, "%-9s %-30s %5d %9s %9s %9s %9s %9s\n", kind, f.name, len(d),
				fmtMS(percentile(d, 0)), fmtMS(percentile(d, 50)), fmtMS(percentile(d, 90)),
				fmtMS(percentile(d, 99)), fmtMS(percentile(d, 100)))
		}
	}
	fmt.Fprintf(&t, "ratio kill9_p50 / graceful_p99 = %.1f (target >= 10)\n", ratio)
	fmt.Fprintf(&t, "graceful p99 %s (target < 100ms): %s\n", fmtMS(gp99), verdict(gp99 < 100*time.Millisecond && ratio >= 10))
	for _, s := range samples {
		if s.note != "" {
			fmt.Fprintf(&t, "anomaly: %s %s\n", s.kind, s)
		}
	}
	b.Logf("\n%s", t.String())
}

func verdict(ok bool) string {
	if ok {
		return "targets met"
	}
	return "TARGETS MISSED"
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
