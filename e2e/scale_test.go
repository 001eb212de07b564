//go:build e2e && scale

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/sim"
)

// make scale: three real servers on disk and one process of simulated
// nodes (package sim), at each size of ROAM_SCALE_SIZES (default
// "1000,5000"), with 4 volumes per node and half of them claimed. It
// prints one table; every figure in a column comes from the same run.

// scaleServerTimers give thousands of nodes room: heartbeats every few
// seconds rather than every second, and Raft timers three times the LAN
// defaults, as this machine is shared and a starved server would
// otherwise lose its leadership over CPU, not over anything measured.
//
// The job holds two allocations per node plus the latency probes, past
// the default group_max_count (10,000) from 5,000 nodes on; sizes go up to
// 20,000 nodes.
const scaleServerTimers = `server {
  raft_multiplier        = 3
  min_heartbeat_ttl      = "20s"
  heartbeat_grace        = "10s"
  failover_heartbeat_ttl = "20s"
}
limits {
  group_max_count = 50000
}
`

// extraNodes are added to each size; none today (a node has room for
// four allocations, so replacements and phase C find room).
const extraNodes = 0

// probeClaims is how many claims each latency sample takes.
const probeClaims = 50

type scaleRow struct {
	name  string
	cells map[int]string
}

type scaleTable struct {
	sizes []int
	rows  []*scaleRow
}

func (t *scaleTable) set(size int, name, format string, args ...any) {
	for _, r := range t.rows {
		if r.name == name {
			r.cells[size] = fmt.Sprintf(format, args...)
			return
		}
	}
	t.rows = append(t.rows, &scaleRow{name: name, cells: map[int]string{size: fmt.Sprintf(format, args...)}})
}

func (t *scaleTable) get(size int, name string) string {
	for _, r := range t.rows {
		if r.name == name {
			return r.cells[size]
		}
	}
	return ""
}

func (t *scaleTable) String() string {
	var b strings.Builder
	w := 0
	for _, r := range t.rows {
		w = max(w, len(r.name))
	}
	fmt.Fprintf(&b, "%-*s", w+2, "measurement")
	for _, s := range t.sizes {
		fmt.Fprintf(&b, " | %22s", fmt.Sprintf("%d nodes", s))
	}
	b.WriteString("\n")
	for _, r := range t.rows {
		fmt.Fprintf(&b, "%-*s", w+2, r.name)
		for _, s := range t.sizes {
			v, ok := r.cells[s]
			if !ok {
				v = "not measured"
			}
			fmt.Fprintf(&b, " | %22s", v)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func scaleSizes(t *testing.T) []int {
	spec := os.Getenv("ROAM_SCALE_SIZES")
	if spec == "" {
		spec = "1000,5000"
	}
	var out []int
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		must.NoError(t, err, must.Sprintf("ROAM_SCALE_SIZES=%q", spec))
		must.True(t, n >= 100 && n <= 20000, must.Sprintf("size %d must be 100 to 20000", n))
		out = append(out, n)
	}
	return out
}

func TestScale(t *testing.T) {
	tbl := &scaleTable{sizes: scaleSizes(t)}
	t.Cleanup(func() { fmt.Printf("\n==== make scale ====\n%s\n", tbl) })
	for _, n := range tbl.sizes {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) { runScale(t, tbl, n) })
	}
}

func dirSize(dir string) int64 {
	var total int64
	_ = filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			total += info.Size()
		}
		return nil
	})
	return total
}

func runScale(t *testing.T, tbl *scaleTable, n int) {
	c := StartCluster(t, Opts{Servers: 3, LogLevel: "WARN", ServerConfigExtra: scaleServerTimers})
	leader := c.Leader()
	follower := (leader + 1) % 3
	L, F := c.Servers[leader], c.Servers[follower]
	rssL0, err := L.RSS()
	must.NoError(t, err)
	rssF0, err := F.RSS()
	must.NoError(t, err)
	raft0 := dirSize(L.DataDir)

	// Nodes.
	start := time.Now()
	s := startSim(t, c, n+extraNodes, 3)
	tbl.set(n, "register all nodes", "%.1f s", time.Since(start).Seconds())
	t.Logf("%s: %s", "register all nodes", tbl.get(n, "register all nodes"))
	// The whole run's bound. Phase B places 2 allocations per node at
	// 3.7-18 a second (0.1-0.55 s per node), the zone outage releases and
	// re-publishes 0.4 claims per node one at a time through the lane
	// (0.1-0.3 s each), and the rest is a few minutes whatever the size:
	// 60 minutes at 1,000 nodes, as before, and 2.5 hours at 5,000.
	ctx, cancel := context.WithTimeout(t.Context(), sizedTimeout(37*time.Minute, n, 1400*time.Millisecond))
	defer cancel()

	// Phase A: a first 100 volumes, 50 claimed; claim latency with little state.
	must.NoError(t, s.RegisterVolumes(ctx, sim.VolumeIDs(0, probeClaims, 0, 100-probeClaims), 200))
	must.NoError(t, s.RegisterJob(ctx, probeClaims))
	must.NoError(t, s.WaitClaims(ctx, probeClaims))
	small := s.Counts()

	// Phase B: the whole workload, 4 volumes per node, 2 claimed.
	claimed, total := 2*n, 4*n
	start = time.Now()
	must.NoError(t, s.RegisterVolumes(ctx, sim.VolumeIDs(probeClaims, claimed, 100-probeClaims, total-claimed), 500))
	tbl.set(n, "register volumes (500/call)", "%.1f s (%d vols)", time.Since(start).Seconds(), total)
	t.Logf("%s: %s", "register volumes (500/call)", tbl.get(n, "register volumes (500/call)"))
	start = time.Now()
	must.NoError(t, s.RegisterJob(ctx, claimed))
	must.NoError(t, s.WaitClaims(ctx, claimed))
	el := time.Since(start)
	tbl.set(n, "place+claim+run allocs/s", "%.0f /s (%d in %.0f s)", float64(claimed-probeClaims)/el.Seconds(), claimed-probeClaims, el.Seconds())
	t.Logf("%s: %s", "place+claim+run allocs/s", tbl.get(n, "place+claim+run allocs/s"))

	// Phase C: 50 more claims with all the state in place.
	// 1,000 blocking queries on its volumes wait on the leader meanwhile.
	s.ResetClaimTimes()
	must.NoError(t, s.RegisterVolumes(ctx, sim.VolumeIDs(claimed, claimed+probeClaims, 0, 0), 200))
	rssW0, err := L.RSS()
	must.NoError(t, err)
	woke := startWatchers(t, L.HTTPAddr(), 1000, sim.VolumeIDs(claimed, claimed+probeClaims, 0, 0),
		sizedTimeout(5*time.Minute, n, 60*time.Millisecond))
	settle := time.Now() // a measuring window for the queries to park, not a wait for a condition
	WaitFor(t, time.Minute, func() error {
		if time.Since(settle) < 2*time.Second {
			return fmt.Errorf("settling")
		}
		return nil
	})
	rssW1, err := L.RSS()
	must.NoError(t, err)
	tbl.set(n, "leader RSS of 1,000 watchers", "%s", mib(rssW1-rssW0))
	t.Logf("%s: %s", "leader RSS of 1,000 watchers", tbl.get(n, "leader RSS of 1,000 watchers"))
	start = time.Now()
	must.NoError(t, s.RegisterJob(ctx, claimed+probeClaims))
	must.NoError(t, s.WaitClaims(ctx, claimed+probeClaims))
	big := s.Counts()
	tbl.set(n, "1,000 watchers all woken", "%.2f s after job register", woke(start).Seconds())
	t.Logf("%s: %s", "1,000 watchers all woken", tbl.get(n, "1,000 watchers all woken"))
	tbl.set(n, "claim p50 (100 vols / full)", "%s / %s", small.ClaimP50.Round(time.Millisecond), big.ClaimP50.Round(time.Millisecond))
	tbl.set(n, "claim p99 (100 vols / full)", "%s / %s", small.ClaimP99.Round(time.Millisecond), big.ClaimP99.Round(time.Millisecond))
	t.Logf("%s: %s", "claim p99 (100 vols / full)", tbl.get(n, "claim p99 (100 vols / full)"))
	tbl.set(n, "claim p99 ratio full/100", "%.2fx", float64(big.ClaimP99)/float64(max(small.ClaimP99, 1)))

	// Memory and Raft, at rest.
	rssL, err := L.RSS()
	must.NoError(t, err)
	rssF, err := F.RSS()
	must.NoError(t, err)
	nodes, vols := n+extraNodes, total+probeClaims
	tbl.set(n, "leader RSS", "%s", mib(rssL))
	t.Logf("%s: %s", "leader RSS", tbl.get(n, "leader RSS"))
	tbl.set(n, "follower RSS", "%s", mib(rssF))
	tbl.set(n, "leader RSS per node+4 vols", "%.1f KiB", float64(rssL-rssL0)/float64(nodes)/1024)
	t.Logf("%s: %s", "leader RSS per node+4 vols", tbl.get(n, "leader RSS per node+4 vols"))
	tbl.set(n, "follower RSS per node+4 vols", "%.1f KiB", float64(rssF-rssF0)/float64(nodes)/1024)
	tbl.set(n, "leader RSS per volume (all/vols)", "%.1f KiB", float64(rssL-rssL0)/float64(vols)/1024)
	t.Logf("%s: %s", "leader RSS per volume (all/vols)", tbl.get(n, "leader RSS per volume (all/vols)"))
	tbl.set(n, "leader data dir growth", "%s", mib(dirSize(L.DataDir)-raft0))

	// Heartbeat CPU on the leader, at rest.
	hb0, cpu0, t0 := s.Counts().Heartbeats, mustCPU(t, L), time.Now()
	WaitFor(t, time.Minute, func() error {
		if time.Since(t0) < 20*time.Second {
			return fmt.Errorf("measuring")
		}
		return nil
	})
	hb1, cpu1, t1 := s.Counts().Heartbeats, mustCPU(t, L), time.Now()
	rate := float64(hb1-hb0) / t1.Sub(t0).Seconds()
	tbl.set(n, "heartbeats/s (sim)", "%.0f /s", rate)
	t.Logf("%s: %s", "heartbeats/s (sim)", tbl.get(n, "heartbeats/s (sim)"))
	tbl.set(n, "leader CPU at rest", "%.1f %% of a core", 100*(cpu1-cpu0).Seconds()/t1.Sub(t0).Seconds())
	if hb1 > hb0 {
		tbl.set(n, "leader CPU per heartbeat", "%.0f us", float64((cpu1-cpu0).Microseconds())/float64(hb1-hb0))
		t.Logf("%s: %s", "leader CPU per heartbeat", tbl.get(n, "leader CPU per heartbeat"))
	}

	// Snapshot.
	snap := filepath.Join(t.TempDir(), "scale.snap")
	start = time.Now()
	out, errOut, code := RunCLIAt(t, L.HTTPAddr(), "operator", "snapshot", "save", snap)
	must.Eq(t, 0, code, must.Sprintf("snapshot save: %s %s", out, errOut))
	tbl.set(n, "snapshot save (CLI)", "%.2f s", time.Since(start).Seconds())
	t.Logf("%s: %s", "snapshot save (CLI)", tbl.get(n, "snapshot save (CLI)"))
	if fi, err := os.Stat(snap); err == nil {
		tbl.set(n, "snapshot size", "%s", mib(fi.Size()))
		t.Logf("%s: %s", "snapshot size", tbl.get(n, "snapshot size"))
	}

	// Follower restart: time until it serves the whole state again.
	wantNodes := n + extraNodes
	_, _, err = F.Stop(time.Minute)
	must.NoError(t, err)
	start = time.Now()
	must.NoError(t, F.Start())
	// A restarted follower restores its snapshot and applies the log
	// after it, whose entries cost more the more nodes there are.
	WaitFor(t, sizedTimeout(8*time.Minute, n, 120*time.Millisecond), func() error {
		list, err := Nodes(F.HTTPAddr(), true)
		if err != nil {
			return err
		}
		if len(list) < wantNodes {
			return fmt.Errorf("follower has %d of %d nodes", len(list), wantNodes)
		}
		return nil
	})
	tbl.set(n, "follower restart to full state", "%.1f s", time.Since(start).Seconds())
	t.Logf("%s: %s", "follower restart to full state", tbl.get(n, "follower restart to full state"))

	// Zone outage: a fifth of the nodes go dark at once.
	want := claimed + probeClaims
	before := s.Counts()
	start = time.Now()
	killed := s.Kill(n / 5)
	must.NoError(t, s.WaitClaims(ctx, 0+want), must.Sprint("every claim re-placed"))
	// Every claim of the dark nodes is released and published again
	// through the plugin's lane, one call at a time: 0.4 per node.
	WaitFor(t, sizedTimeout(5*time.Minute, n, 300*time.Millisecond), func() error {
		h := s.Holders()
		if len(h) != want {
			return fmt.Errorf("%d of %d volumes held by live nodes", len(h), want)
		}
		return nil
	})
	after := s.Counts()
	tbl.set(n, "zone outage (20%) to all re-placed", "%.1f s (%d nodes)", time.Since(start).Seconds(), len(killed))
	t.Logf("%s: %s", "zone outage (20%) to all re-placed", tbl.get(n, "zone outage (20%) to all re-placed"))
	tbl.set(n, "zone outage unpublishes", "%d", after.Unpublishes-before.Unpublishes)
	tbl.set(n, "provider overlaps / max in flight", "%d / %d", after.Overlaps, after.MaxInFlight)
	t.Logf("%s: %s", "provider overlaps / max in flight", tbl.get(n, "provider overlaps / max in flight"))
	must.Eq(t, int64(0), after.Overlaps)

	// Takeover: SIGTERM the leader, then kill -9 the next one; each time
	// until the cluster accepts a volume registration again.
	takeover := func(sig syscall.Signal, label string, k int) {
		li := c.Leader()
		a := c.Servers[li]
		before := survivorMetrics(t, c, li)
		start := time.Now()
		must.NoError(t, a.Signal(sig))
		must.NoError(t, s.RegisterVolumes(ctx, []string{fmt.Sprintf("takeover-%d", k)}, 1))
		tbl.set(n, label, "%.2f s", time.Since(start).Seconds())
		t.Logf("%s: %s", label, tbl.get(n, label))
		// The new leader's own account of its takeover (nomad/leader_metrics.go):
		// what lies on the critical path, and the work that scans all of
		// the state, which runs once the duties are open.
		_, now := awaitTakeover(t, c, li, before, 2*time.Minute)
		g := func(step string) float64 { return now["roam_leader_takeover_"+step+"_ms"] }
		tbl.set(n, label+": leaderless gap", "%.1f ms", g("leaderless_gap"))
		tbl.set(n, label+": caught up / duties open", "%.1f / %.1f ms", g("caught_up"), g("acquired_to_duties"))
		tbl.set(n, label+": then timers / evals", "%.1f / %.1f ms", g("heartbeat_timers"), g("eval_restore"))
		for _, row := range []string{": leaderless gap", ": caught up / duties open", ": then timers / evals"} {
			t.Logf("%s%s: %s", label, row, tbl.get(n, label+row))
		}
		// A handoff may take its drain timeout; a leader still running
		// after two minutes is recorded and stopped.
		if _, err := a.Wait(2 * time.Minute); err != nil {
			tbl.set(n, label+": exit", "not within 2 min")
			_, _, err = a.Stop(time.Minute)
			must.NoError(t, err)
		} else {
			tbl.set(n, label+": exit", "%.2f s", time.Since(start).Seconds())
		}
		c.RestartServer(li)
	}
	takeover(syscall.SIGTERM, "takeover after SIGTERM (write ok)", 1)
	takeover(syscall.SIGKILL, "takeover after kill -9 (write ok)", 2)
	t.Logf("sim: %+v", s.Counts())
}

func mustCPU(t *testing.T, a *Agent) time.Duration {
	t.Helper()
	d, err := procCPU(a.PID())
	must.NoError(t, err)
	return d
}

// startWatchers parks count blocking queries on the leader's HTTP API, on
// volumes ids in turn, each at the volume's current index. It returns once
// every one is started; the returned func waits until every one woke
// with a newer index (or giveUp passes) and gives the time from since to
// the last wake.
func startWatchers(t *testing.T, base string, count int, ids []string, giveUp time.Duration) func(since time.Time) time.Duration {
	t.Helper()
	client := &http.Client{Timeout: 3 * time.Minute}
	index := map[string]uint64{}
	for _, id := range ids {
		meta, err := GetJSONMeta(base, "/v1/volume/csi/"+id, &struct{}{})
		must.NoError(t, err)
		index[id] = meta.Index
	}
	begin := time.Now()
	done := make(chan time.Time, count)
	for i := range count {
		id := ids[i%len(ids)]
		go func() {
			for {
				url := fmt.Sprintf("%s/v1/volume/csi/%s?index=%d&wait=2m", base, id, index[id])
				resp, err := client.Get(url)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					got, _ := strconv.ParseUint(resp.Header.Get("X-Nomad-Index"), 10, 64)
					if resp.StatusCode == http.StatusOK && got > index[id] {
						done <- time.Now()
						return
					}
				}
				if time.Since(begin) > giveUp {
					done <- time.Time{}
					return
				}
			}
		}()
	}
	return func(since time.Time) time.Duration {
		t.Helper()
		var last time.Time
		for range count {
			at := <-done
			must.False(t, at.IsZero(), must.Sprint("a watcher never woke"))
			if at.After(last) {
				last = at
			}
		}
		return last.Sub(since)
	}
}
