//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
)

// TestStorm runs a loop of jobs claiming and releasing CSI volumes on a
// 3-server, 2-client cluster, and in alternate windows of stormWindow a
// storm of bad traffic at every agent: random bytes under each first byte
// of the RPC port, partial RPC and Raft frames, slow HTTP bodies,
// blocking queries whose callers hang up, nested HCL, oversized jobs (4
// MiB of empty groups, over HTTP and as one RPC frame, and counts of
// 2^62). Quiet and stormy windows alternate, stormWindows of each, so both
// halves of the comparison see the same machine (others build on it too).
//
// It checks: no agent dies or is killed by the memory guard at any time;
// the claim loop's p99 latency (job registered to claim taken) in the
// stormy windows is within 2x of its p99 in the quiet ones; and once the
// storm and the loop are over, every server's goroutines and RSS come back
// within 10% of what they were before the first storm.
//
// It takes about 3 minutes, and runs with the rest of the e2e suite.
func TestStorm(t *testing.T) {
	const (
		servers, clients = 3, 2
		workers          = 4 // claim loops, one volume each
		stormWindow      = 10 * time.Second
		stormWindows     = 6 // of each kind: 60 s quiet, 60 s stormy
		warmCycles       = 3 // per claim worker before the baseline
		// maxP99Ratio is the acceptance bound: p99 with the storm at most
		// twice p99 without.
		maxP99Ratio = 2.0
		// settleWithin bounds the wait for goroutines and RSS to come back
		// after the storm. The Go runtime gives freed memory back to the
		// OS after a garbage collection, which an idle agent may only run
		// when the runtime forces one (every 2 minutes).
		settleWithin = 3 * time.Minute
		// backWithin is "back within 10% of the baseline".
		backWithin = 0.10
		// minSamples per kind of window, below which a p99 means nothing.
		minSamples = 30
	)
	cc := startCSICluster(t, csiOpts{
		Servers: servers, Clients: clients,
		ServerConfigExtra: biLimits, ClientConfigExtra: biLimits,
		// INFO: the storm's requests would be a DEBUG line each.
		LogLevel: "INFO",
	})
	agents := cc.agents()
	guard := guardMemory(t, memGuardCap, agents...)
	deaths := watchDeaths(t, agents)

	vols := make([]string, workers)
	for i := range vols {
		vols[i] = fmt.Sprintf("storm-vol-%d", i)
	}
	ext := cc.createVolumes(t, "client-0", vols...)
	for i, v := range vols {
		cc.registerVolumeHTTP(t, v, ext[i])
	}

	loop := startClaimLoop(t, cc, vols)
	WaitFor(t, 2*time.Minute, func() error {
		if n := loop.minCycles(); n < warmCycles {
			return fmt.Errorf("claim workers warming up: the slowest has done %d cycles of %d; errors: %v", n, warmCycles, loop.errorSummary())
		}
		return nil
	})
	// The baseline is the cluster at rest, as it will be at the end: the
	// loop paused between cycles, its idle connections closed.
	var base []serverFigures
	loop.whilePaused(func() {
		base = settledServerFigures(t, cc)
	})
	for i, s := range cc.Servers {
		t.Logf("baseline %s: %d goroutines, RSS %s", s.Name, base[i].goroutines, mib(base[i].rss))
	}

	st := newStorm(cc)
	var windows []window
	for i := 0; i < 2*stormWindows; i++ {
		w := window{stormy: i%2 == 1, start: time.Now()}
		if w.stormy {
			ctx, cancel := context.WithTimeout(context.Background(), stormWindow)
			st.run(ctx)
			cancel()
		} else {
			time.Sleep(stormWindow) // the quiet window itself: nothing to wait for
		}
		w.end = time.Now()
		windows = append(windows, w)
		t.Logf("%s window %d: %s", w.kind(), i/2, w.end.Sub(w.start).Round(time.Millisecond))
	}
	loop.stop()
	t.Logf("storm traffic: %s", st.summary())

	// 0 crashes.
	for _, d := range deaths.list() {
		t.Errorf("agent died: %s", d)
	}
	for _, a := range agents {
		if rss, ok := guard.killedAt(a); ok {
			t.Errorf("%s was killed by the memory guard at %s", a.Name, mib(rss))
		}
	}

	// p99 of claim latency, quiet against stormy.
	quiet, stormy, straddled := loop.split(windows)
	t.Logf("claim cycles: %d in quiet windows, %d in stormy ones, %d across a boundary (not counted), %d errors",
		len(quiet), len(stormy), straddled, loop.errorCount())
	for _, e := range loop.errorSummary() {
		t.Logf("  claim loop error: %s", e)
	}
	pq, ps := percentile(sortedCopy(quiet), 99), percentile(sortedCopy(stormy), 99)
	t.Logf("claim latency quiet:  %s", latencySummary(quiet))
	t.Logf("claim latency stormy: %s", latencySummary(stormy))
	ratio := float64(ps) / float64(pq)
	t.Logf("p99 stormy / p99 quiet = %s / %s = %.2f (bound %.1f)", ps.Round(time.Millisecond), pq.Round(time.Millisecond), ratio, maxP99Ratio)
	test.GreaterEq(t, minSamples, len(quiet), test.Sprint("too few quiet claim cycles for a p99"))
	test.GreaterEq(t, minSamples, len(stormy), test.Sprint("too few stormy claim cycles for a p99"))
	test.LessEq(t, maxP99Ratio, ratio, test.Sprint("claim p99 under the storm against without it"))

	// Back to the baseline: goroutines and RSS of every server.
	start := time.Now()
	var last []serverFigures
	err := poll(settleWithin, func() error {
		if len(deaths.list()) > 0 {
			return nil // reported above; figures of a dead agent mean nothing
		}
		last = readServerFigures(t, cc)
		var errs []error
		for i, s := range cc.Servers {
			if g, b := last[i].goroutines, base[i].goroutines; float64(g) > float64(b)*(1+backWithin) {
				errs = append(errs, fmt.Errorf("%s: %d goroutines, baseline %d", s.Name, g, b))
			}
			if r, b := last[i].rss, base[i].rss; float64(r) > float64(b)*(1+backWithin) {
				errs = append(errs, fmt.Errorf("%s: RSS %s, baseline %s", s.Name, mib(r), mib(b)))
			}
		}
		return errors.Join(errs...)
	})
	for i, s := range cc.Servers {
		if i < len(last) {
			t.Logf("after %s: %s %d goroutines (baseline %d, %+.0f%%), RSS %s (baseline %s, %+.0f%%)",
				time.Since(start).Round(time.Second), s.Name,
				last[i].goroutines, base[i].goroutines, 100*(float64(last[i].goroutines)/float64(base[i].goroutines)-1),
				mib(last[i].rss), mib(base[i].rss), 100*(float64(last[i].rss)/float64(base[i].rss)-1))
		}
	}
	if err != nil {
		t.Errorf("servers not back within %.0f%% of their baseline %s after the storm: %v", 100*backWithin, settleWithin, err)
	}
}

// serverFigures is what the storm's aftermath is judged by.
type serverFigures struct {
	goroutines int
	rss        int64
}

// settledServerFigures waits until the servers' goroutine counts hold
// still (the connections just closed have ended in them) and returns the
// figures then.
func settledServerFigures(t *testing.T, cc *csiCluster) []serverFigures {
	t.Helper()
	var prev []serverFigures
	WaitFor(t, settle, func() error {
		now := readServerFigures(t, cc)
		defer func() { prev = now }()
		if prev == nil {
			return errors.New("first sample")
		}
		for i := range now {
			if now[i].goroutines != prev[i].goroutines {
				return fmt.Errorf("%s: goroutines moving (%d, then %d)", cc.Servers[i].Name, prev[i].goroutines, now[i].goroutines)
			}
		}
		return nil
	})
	return prev
}

// readServerFigures reads every server's goroutine count and RSS.
func readServerFigures(t *testing.T, cc *csiCluster) []serverFigures {
	t.Helper()
	out := make([]serverFigures, len(cc.Servers))
	for i, s := range cc.Servers {
		rt, err := ReadRuntime(s.HTTPAddr())
		must.NoError(t, err)
		rss, err := s.RSS()
		must.NoError(t, err)
		out[i] = serverFigures{goroutines: rt.Goroutines, rss: rss}
	}
	return out
}

// deathWatch records every agent that stops running.
type deathWatch struct {
	mu     sync.Mutex
	deaths []string
}

func (d *deathWatch) list() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.deaths)
}

// watchDeaths polls the agents' processes until the test ends.
func watchDeaths(t *testing.T, agents []*Agent) *deathWatch {
	d := &deathWatch{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		dead := map[*Agent]bool{}
		tick := time.NewTicker(pollGap)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, a := range agents {
				if !dead[a] && !a.Running() {
					dead[a] = true
					d.mu.Lock()
					d.deaths = append(d.deaths, fmt.Sprintf("%s at %s: %s", a.Name, time.Now().Format(time.TimeOnly), a.ExitState()))
					d.mu.Unlock()
				}
			}
		}
	}()
	// Registered after the cluster's cleanup, so it runs before the
	// agents are stopped on purpose.
	t.Cleanup(func() { close(stop); <-done })
	return d
}

// window is one quiet or stormy stretch of the run.
type window struct {
	stormy     bool
	start, end time.Time
}

func (w window) kind() string {
	if w.stormy {
		return "stormy"
	}
	return "quiet"
}

// claimSample is one cycle of a claim worker.
type claimSample struct {
	worker int
	// start is when the job was sent; taken when its claim was seen taken.
	start, taken time.Time
}

func (s claimSample) latency() time.Duration { return s.taken.Sub(s.start) }

// claimLoop runs one worker per volume: register a batch job that mounts
// the volume and exits, wait for its claim to be taken, wait for the
// claim to be freed, purge the job; again.
type claimLoop struct {
	cc   *csiCluster
	vols []string
	http *http.Client
	ctx  context.Context
	halt context.CancelFunc
	wg   sync.WaitGroup

	// gate is held (shared) by each worker through a cycle, so that
	// whilePaused can hold the loop between cycles.
	gate sync.RWMutex

	mu      sync.Mutex
	samples []claimSample
	cycles  []int
	errs    []string
}

// claimCycleBound bounds one step of a cycle. A cycle that passes it
// counts as a sample of this length, and an error, so that a stalled
// cluster shows up in the p99 instead of vanishing from it.
const claimCycleBound = time.Minute

func startClaimLoop(t *testing.T, cc *csiCluster, vols []string) *claimLoop {
	ctx, cancel := context.WithCancel(context.Background())
	l := &claimLoop{
		cc:   cc,
		vols: vols,
		// Keep-alive: the loop is a well-behaved client from 127.0.0.1.
		http:   &http.Client{Timeout: claimCycleBound + 10*time.Second},
		ctx:    ctx,
		halt:   cancel,
		cycles: make([]int, len(vols)),
	}
	for i := range vols {
		l.wg.Add(1)
		go l.worker(i)
	}
	t.Cleanup(l.stop)
	return l
}

// whilePaused runs f once every worker is between cycles and none can
// start another, with the loop's idle connections closed.
func (l *claimLoop) whilePaused(f func()) {
	l.gate.Lock()
	defer l.gate.Unlock()
	l.http.CloseIdleConnections()
	f()
}

// stop ends the workers (each finishes its step) and drops idle
// connections, which would otherwise count in the servers' goroutines.
func (l *claimLoop) stop() {
	l.halt()
	l.wg.Wait()
	l.http.CloseIdleConnections()
}

func (l *claimLoop) fail(i int, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, fmt.Sprintf("worker %d: ", i)+fmt.Sprintf(format, args...))
}

// server is the HTTP API worker i talks to: the servers take turns.
func (l *claimLoop) server(i int) string {
	return l.cc.Servers[i%len(l.cc.Servers)].HTTPAddr()
}

func (l *claimLoop) worker(i int) {
	defer l.wg.Done()
	vol := l.vols[i]
	for n := 0; l.ctx.Err() == nil; n++ {
		l.gate.RLock()
		l.cycle(i, n, vol)
		l.gate.RUnlock()
	}
}

// cycle is one claim and release of vol by worker i: register a batch
// job mounting it, wait for the claim to be taken (the sample), wait for
// it to be freed, purge the job.
func (l *claimLoop) cycle(i, n int, vol string) {
	jobID := fmt.Sprintf("claim-%d-%d", i, n)
	base := l.server(i)
	v, idx, err := l.volume(base, vol, 0)
	if err != nil {
		l.fail(i, "read volume: %v", err)
		l.pause()
		return
	}
	if len(v.Claims) > 0 {
		// The previous cycle's claim is still being freed.
		_, _ = l.waitVolume(base, vol, idx, func(v *api.CSIVolume) bool { return len(v.Claims) == 0 })
		return
	}
	start := time.Now()
	ans, err := sendHTTP(l.http, http.MethodPut, base+"/v1/jobs", jobJSON(jobOpts{
		ID: jobID, Type: "batch", Count: 1, Command: "/bin/true", VolumeSource: vol, MountDest: "data",
	}))
	if err != nil || ans.Status != http.StatusOK {
		l.fail(i, "register %s: %v %v", jobID, ans, err)
		l.pause()
		return
	}
	idx, err = l.waitVolume(base, vol, idx, func(v *api.CSIVolume) bool {
		for _, c := range v.Claims {
			if c.State == "taken" {
				return true
			}
		}
		return false
	})
	taken := time.Now()
	switch {
	case l.ctx.Err() != nil:
		return // stopped mid-cycle: no sample
	case err != nil:
		l.fail(i, "%s: claim not taken: %v", jobID, err)
	}
	l.mu.Lock()
	l.samples = append(l.samples, claimSample{worker: i, start: start, taken: taken})
	l.cycles[i]++
	l.mu.Unlock()
	if _, err := l.waitVolume(base, vol, idx, func(v *api.CSIVolume) bool { return len(v.Claims) == 0 }); err != nil && l.ctx.Err() == nil {
		l.fail(i, "%s: claim not freed: %v", jobID, err)
	}
	if ans, err := sendHTTP(l.http, http.MethodDelete, base+"/v1/job/"+jobID+"?purge=true", nil); err != nil || ans.Status != http.StatusOK {
		l.fail(i, "purge %s: %v %v", jobID, ans, err)
	}
}

// pause backs off after an error, unless the loop is stopping.
func (l *claimLoop) pause() {
	select {
	case <-l.ctx.Done():
	case <-time.After(time.Second):
	}
}

// volume reads a volume, blocking until its index passes index (0: at
// once).
func (l *claimLoop) volume(base, id string, index uint64) (*api.CSIVolume, uint64, error) {
	path := "/v1/volume/csi/" + id
	if index > 0 {
		path += fmt.Sprintf("?index=%d&wait=%s", index, claimCycleBound/2)
	}
	req, err := http.NewRequestWithContext(l.ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := l.http.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
	}
	var v api.CSIVolume
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, 0, err
	}
	var next uint64
	_, _ = fmt.Sscan(resp.Header.Get("X-Nomad-Index"), &next)
	return &v, next, nil
}

// waitVolume follows the volume with blocking queries until cond holds,
// within claimCycleBound, and returns the index it last saw.
func (l *claimLoop) waitVolume(base, id string, index uint64, cond func(*api.CSIVolume) bool) (uint64, error) {
	deadline := time.Now().Add(claimCycleBound)
	for time.Now().Before(deadline) {
		v, next, err := l.volume(base, id, index)
		if err != nil {
			if l.ctx.Err() != nil {
				return index, err
			}
			l.pause()
			continue
		}
		if cond(v) {
			return next, nil
		}
		index = next
	}
	return index, fmt.Errorf("volume %s: condition not met within %s", id, claimCycleBound)
}

// minCycles is the fewest cycles any worker has completed.
func (l *claimLoop) minCycles() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Min(l.cycles)
}

func (l *claimLoop) errorCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.errs)
}

// errorSummary is the first few errors.
func (l *claimLoop) errorSummary() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) > 5 {
		return append(slices.Clone(l.errs[:5]), fmt.Sprintf("and %d more", len(l.errs)-5))
	}
	return slices.Clone(l.errs)
}

// split sorts the latencies of the samples that lie wholly inside one
// window into quiet and stormy, and counts those that cross a boundary.
func (l *claimLoop) split(windows []window) (quiet, stormy []time.Duration, straddled int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.samples {
		placed := false
		for _, w := range windows {
			if !s.start.Before(w.start) && !s.taken.After(w.end) {
				if w.stormy {
					stormy = append(stormy, s.latency())
				} else {
					quiet = append(quiet, s.latency())
				}
				placed = true
				break
			}
		}
		if !placed && !s.start.Before(windows[0].start) && !s.taken.After(windows[len(windows)-1].end) {
			straddled++
		}
	}
	return quiet, stormy, straddled
}

// sortedCopy returns ds sorted, for percentile.
func sortedCopy(ds []time.Duration) []time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s
}

func latencySummary(ds []time.Duration) string {
	s := sortedCopy(ds)
	return fmt.Sprintf("n=%d p50=%s p90=%s p99=%s max=%s", len(s),
		percentile(s, 50).Round(time.Millisecond), percentile(s, 90).Round(time.Millisecond),
		percentile(s, 99).Round(time.Millisecond), percentile(s, 100).Round(time.Millisecond))
}

// storm sends bad traffic at a cluster. Every generator is a fixed number
// of workers with a pause or a deadline between their sends, so the storm
// is bounded in connections at any moment and in rate.
type storm struct {
	rpcAddrs   []string // servers' RPC ports
	httpAddrs  []string // servers' HTTP host:port
	httpBases  []string // every agent's HTTP base URL
	groupsJSON []byte
	groupsRPC  []byte
	nested     []byte
	seq        atomic.Int64

	mu     sync.Mutex
	counts map[string]int
}

func newStorm(cc *csiCluster) *storm {
	s := &storm{
		groupsJSON: emptyGroupsJobJSON("storm-groups", 4<<20),
		groupsRPC:  emptyGroupsRegisterFrame("storm-groups", 4<<20-64),
		nested:     nestedParseBody(100_000),
		counts:     map[string]int{},
	}
	for _, a := range cc.Servers {
		s.rpcAddrs = append(s.rpcAddrs, a.RPCAddr())
		s.httpAddrs = append(s.httpAddrs, strings.TrimPrefix(a.HTTPAddr(), "http://"))
	}
	for _, a := range cc.agents() {
		s.httpBases = append(s.httpBases, a.HTTPAddr())
	}
	return s
}

func (s *storm) count(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[what]++
}

func (s *storm) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.counts))
	for k := range s.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, s.counts[k]))
	}
	return strings.Join(parts, " ")
}

// Generator sizes: workers each, every one from its own source address
// (under the per-address connection caps).
const (
	stormJunkWorkers     = 4   // random bytes under each first byte
	stormPartialWorkers  = 20  // partial RPC frames; as many partial Raft frames
	stormSlowWorkers     = 20  // slow HTTP bodies
	stormBlockingWorkers = 100 // blocking queries hanging up after 2 s
	// stormJunkGap paces each junk worker: 4 workers, at most 200
	// connections a second.
	stormJunkGap = 20 * time.Millisecond
	// stormBigGap paces the nested-HCL and oversized-job workers.
	stormBigGap = 500 * time.Millisecond
	// stormRefusedGap is a worker's pause after its agent refused the
	// connection or failed the request.
	stormRefusedGap = 100 * time.Millisecond
)

// run sends the storm until ctx ends, and returns once every generator
// has closed its connections.
func (s *storm) run(ctx context.Context) {
	var wg sync.WaitGroup
	src := 0
	spawn := func(n int, f func(src string)) {
		for range n {
			a := attackerAddr(src)
			src++
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					f(a)
				}
			}()
		}
	}
	pick := func(list []string) string { return list[mrand.IntN(len(list))] }
	sleep := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	held := biFrameTimeout + closeSlack
	// outcome counts a held connection's end: closed by the agent, still
	// open at the test's limit ("held"), or not even opened ("refused",
	// after which the worker backs off: a dead agent is not to be spun on).
	outcome := func(kind string, err error) {
		var oe *net.OpError
		switch {
		case ctx.Err() != nil:
			s.count(kind + "-cut")
		case err == nil:
			s.count(kind)
		case errors.As(err, &oe) && oe.Op == "dial":
			s.count(kind + "-refused")
			sleep(stormRefusedGap)
		default:
			s.count(kind + "-held")
		}
	}
	var nextByte atomic.Int64
	spawn(stormJunkWorkers, func(src string) {
		junk := make([]byte, 1+mrand.IntN(512))
		_, _ = rand.Read(junk)
		junk[0] = byte(nextByte.Add(1))
		_, err := holdOpen(ctx, src, pick(s.rpcAddrs), junk, held)
		outcome("junk", err)
		sleep(stormJunkGap)
	})
	spawn(stormPartialWorkers, func(src string) {
		_, err := holdOpen(ctx, src, pick(s.rpcAddrs), partialRPCFrame(), held)
		outcome("partial-rpc", err)
	})
	spawn(stormPartialWorkers, func(src string) {
		_, err := holdOpen(ctx, src, pick(s.rpcAddrs), partialRaftFrame(), held)
		outcome("partial-raft", err)
	})
	spawn(stormSlowWorkers, func(src string) {
		_, _, err := slowBody(ctx, src, pick(s.httpAddrs), biBodyTimeout+closeSlack)
		outcome("slow-body", err)
	})
	spawn(stormBlockingWorkers, func(src string) {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		// An index far ahead: the query waits its full time.
		if err := blockingQueryUntil(qctx, src, "http://"+pick(s.httpAddrs), 1<<40); err != nil && ctx.Err() == nil {
			s.count("blocking-error")
			sleep(stormRefusedGap)
			return
		}
		s.count("blocking")
	})
	cl := httpFrom(attackerAddr(src), time.Minute)
	src++
	// refused counts an answer to a big bad input: a 4xx (or a closed
	// connection, on the RPC port) is a refusal; anything else is not.
	refused := func(kind string, ans *httpAnswer, err error) {
		switch {
		case ctx.Err() != nil:
			s.count(kind + "-cut")
		case err != nil:
			s.count(kind + "-failed")
			sleep(stormRefusedGap)
		case ans.Status/100 == 4:
			s.count(kind)
		default:
			s.count(fmt.Sprintf("%s-answered-%d", kind, ans.Status))
		}
	}
	spawn(1, func(string) {
		ans, err := sendHTTPCtx(ctx, cl, http.MethodPut, pick(s.httpBases)+"/v1/jobs/parse", s.nested)
		refused("nested-hcl", ans, err)
		sleep(stormBigGap)
	})
	spawn(1, func(src string) {
		switch n := s.seq.Add(1); n % 3 {
		case 0:
			ans, err := sendHTTPCtx(ctx, cl, http.MethodPut, "http://"+pick(s.httpAddrs)+"/v1/jobs", s.groupsJSON)
			refused("groups-json", ans, err)
		case 1:
			ans, err := rawRPCCtx(ctx, src, pick(s.rpcAddrs), s.groupsRPC, time.Minute)
			switch {
			case ctx.Err() != nil:
				s.count("groups-rpc-cut")
			case err != nil:
				s.count("groups-rpc-failed")
				sleep(stormRefusedGap)
			case ans.Closed || ans.Error != "":
				s.count("groups-rpc")
			default:
				s.count("groups-rpc-accepted")
			}
		case 2:
			id := fmt.Sprintf("storm-count-%d", n)
			ans, err := sendHTTPCtx(ctx, cl, http.MethodPut, "http://"+pick(s.httpAddrs)+"/v1/jobs", hugeCountJob(id, 1<<62, "dc-nowhere"))
			refused("huge-count", ans, err)
		}
		sleep(stormBigGap)
	})
	wg.Wait()
}
