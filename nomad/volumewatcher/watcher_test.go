package volumewatcher

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// fakeReleaser records releases; a release of a volume in hang blocks
// until its context ends or the test lets it go.
type fakeReleaser struct {
	mu       sync.Mutex
	started  []string          // volume IDs, in start order
	finished map[string]int    // volume ID → releases finished
	hang     map[string]bool   // volume IDs whose release hangs
	release  chan struct{}     // closed to let hung releases go
	running  map[string]int    // plugin → releases running now
	maxRun   map[string]int    // plugin → most releases seen running at once
	pluginOf map[string]string // volume ID → plugin
	fail     map[string]error  // volume ID → error every release returns
}

func newFakeReleaser() *fakeReleaser {
	return &fakeReleaser{finished: map[string]int{}, hang: map[string]bool{}, release: make(chan struct{}),
		running: map[string]int{}, maxRun: map[string]int{}, pluginOf: map[string]string{}, fail: map[string]error{}}
}

func (f *fakeReleaser) Release(ctx context.Context, volID, allocID string) error {
	f.mu.Lock()
	f.started = append(f.started, volID)
	p := f.pluginOf[volID]
	f.running[p]++
	f.maxRun[p] = max(f.maxRun[p], f.running[p])
	hang, fail := f.hang[volID], f.fail[volID]
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.running[p]--
		f.finished[volID]++
		f.mu.Unlock()
	}()
	if hang {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.release:
		}
	}
	return fail
}

func (f *fakeReleaser) finishedCount(volID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.finished[volID]
}

func (f *fakeReleaser) startedCount(volID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, v := range f.started {
		if v == volID {
			n++
		}
	}
	return n
}

// world is a store with one ready node and volumes whose claims belong to
// allocations in the given client status.
type world struct {
	store *state.StateStore
	index uint64
	node  *structs.Node
}

func newWorld(t *testing.T) *world {
	store, err := state.NewStateStore()
	must.NoError(t, err)
	w := &world{store: store, index: 1, node: &structs.Node{ID: "node-1", SecretID: "s", Status: structs.NodeStatusReady}}
	must.NoError(t, store.UpsertNode(w.next(), w.node))
	return w
}

func (w *world) next() uint64 { w.index++; return w.index }

// claimed registers volume id of plugin with one taken claim by a new
// allocation in clientStatus, and returns the allocation.
func (w *world) claimed(t *testing.T, id, plugin, clientStatus string) *structs.Allocation {
	a := &structs.Allocation{ID: "alloc-" + id, Namespace: structs.DefaultNamespace, JobID: "j", TaskGroup: "g",
		NodeID: w.node.ID, DesiredStatus: structs.AllocDesiredStatusStop, ClientStatus: clientStatus}
	must.NoError(t, w.store.UpsertAllocs(w.next(), []*structs.Allocation{a}))
	v := &structs.CSIVolume{ID: id, Namespace: structs.DefaultNamespace, ExternalID: "ext-" + id, PluginID: plugin,
		RequestedCapabilities: []*structs.CSIVolumeCapability{{AccessMode: structs.CSIAccessModeSingleNodeWriter,
			AttachmentMode: structs.CSIAttachmentModeFilesystem}}}
	must.NoError(t, w.store.UpsertCSIVolumes(w.next(), []*structs.CSIVolume{v}))
	must.NoError(t, w.store.UpdateCSIVolumeClaim(w.next(), structs.DefaultNamespace, id, &structs.CSIVolumeClaim{
		AllocationID: a.ID, NodeID: w.node.ID, Mode: structs.CSIVolumeClaimWrite,
		AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
		State: structs.CSIVolumeClaimStateTaken, UpdatedAt: time.Now().UnixNano()}))
	return a
}

func (w *world) clientDone(t *testing.T, a *structs.Allocation) {
	c := a.Copy()
	c.ClientStatus = structs.AllocClientStatusComplete
	must.NoError(t, w.store.UpdateAllocsFromClient(w.next(), []*structs.Allocation{c}))
}

func startWatcher(t *testing.T, w *world, r Releaser, perPlugin int, grace time.Duration) {
	cfg := DefaultConfig()
	cfg.State = func() *state.StateStore { return w.store }
	cfg.Releaser = r
	cfg.PerPlugin = perPlugin
	cfg.Interval = 50 * time.Millisecond
	cfg.MaxBackoff = 200 * time.Millisecond
	cfg.ClientReleaseGrace = grace
	wt, err := New(cfg)
	must.NoError(t, err)
	runWatcher(t, wt)
}

// runWatcher runs wt until the test ends; Run returns only after the
// releases it started.
func runWatcher(tb testing.TB, wt *Watcher) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		wt.Run(ctx)
	}()
	tb.Cleanup(func() {
		cancel()
		<-done
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(cond), wait.Timeout(10*time.Second), wait.Gap(5*time.Millisecond)),
		must.Sprintf("waiting for %s", what))
}

// A claim whose allocation the servers asked to stop, but whose client
// still runs it, is left alone until the client reports it done.
func TestWatcher_WaitsForTheClient(t *testing.T) {
	w := newWorld(t)
	r := newFakeReleaser()
	a := w.claimed(t, "v1", "p", structs.AllocClientStatusRunning)
	w.claimed(t, "v2", "p", structs.AllocClientStatusComplete)
	startWatcher(t, w, r, 4, 0)

	// v2 is released; by then the watcher has passed over v1 at least
	// once without touching it.
	waitFor(t, "v2 released", func() bool { return r.finishedCount("v2") > 0 })
	must.Zero(t, r.startedCount("v1"))

	w.clientDone(t, a)
	waitFor(t, "v1 released once its client is done", func() bool { return r.finishedCount("v1") > 0 })
}

// A release stuck on one plugin does not hold up another plugin's, and
// one plugin never has more than PerPlugin releases running.
func TestWatcher_HungPluginDelaysOnlyItsOwn(t *testing.T) {
	w := newWorld(t)
	r := newFakeReleaser()
	const perPlugin = 2
	for i := range 4 {
		id := fmt.Sprintf("a%d", i)
		r.hang[id] = true
		r.pluginOf[id] = "plugin-a"
		w.claimed(t, id, "plugin-a", structs.AllocClientStatusComplete)
	}
	startWatcher(t, w, r, perPlugin, 0)
	waitFor(t, "plugin-a's lane full of hung releases", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.running["plugin-a"] == perPlugin
	})

	// Plugin B's claims arrive while A's releases hang, and still go.
	for i := range 3 {
		id := fmt.Sprintf("b%d", i)
		r.mu.Lock()
		r.pluginOf[id] = "plugin-b"
		r.mu.Unlock()
		w.claimed(t, id, "plugin-b", structs.AllocClientStatusComplete)
	}
	for i := range 3 {
		id := fmt.Sprintf("b%d", i)
		waitFor(t, id+" released", func() bool { return r.finishedCount(id) > 0 })
	}
	r.mu.Lock()
	stillHung := r.running["plugin-a"]
	r.mu.Unlock()
	must.EqOp(t, perPlugin, stillHung, must.Sprint("plugin A's releases are still hung while B's finished"))

	close(r.release)
	for i := range 4 {
		id := fmt.Sprintf("a%d", i)
		waitFor(t, id+" released", func() bool { return r.finishedCount(id) > 0 })
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	must.EqOp(t, perPlugin, r.maxRun["plugin-a"], must.Sprint("per-plugin bound"))
}

// A release that keeps failing is retried with a growing backoff, not in
// a busy loop.
func TestWatcher_BacksOffFailedReleases(t *testing.T) {
	w := newWorld(t)
	r := newFakeReleaser()
	r.fail["v1"] = fmt.Errorf("node detach: %w", structs.ErrCSIUnavailable)
	w.claimed(t, "v1", "p", structs.AllocClientStatusComplete)
	startWatcher(t, w, r, 4, 0)

	// Interval 50ms, backoff 50, 100, 200, 200ms: 5 tries take at least
	// 550ms. A watcher without backoff would make them in one interval.
	start := time.Now()
	waitFor(t, "five tries", func() bool { return r.startedCount("v1") >= 5 })
	must.Greater(t, 500*time.Millisecond, time.Since(start))
}

// A release the leader is already making (or one the core says must
// wait) is not a failure: no backoff, and the next change retries.
func TestWatcher_InUseIsNotAFailure(t *testing.T) {
	w := newWorld(t)
	r := newFakeReleaser()
	r.fail["v1"] = fmt.Errorf("%w: volume v1", structs.ErrClaimInProgress)
	w.claimed(t, "v1", "p", structs.AllocClientStatusComplete)
	startWatcher(t, w, r, 4, 0)
	// Six tries at the 50ms interval take at least 250ms: not a busy loop
	// (a release that ends wakes the watcher at once).
	start := time.Now()
	waitFor(t, "retried at the interval", func() bool { return r.startedCount("v1") >= 6 })
	must.Greater(t, 250*time.Millisecond, time.Since(start))
}

// A taken claim whose client just reported its allocation done is left to
// that client for the grace; a claim on a down node is not.
func TestWatcher_LeavesATakenClaimToItsClient(t *testing.T) {
	w := newWorld(t)
	r := newFakeReleaser()
	w.claimed(t, "v1", "p", structs.AllocClientStatusComplete)
	const grace = 300 * time.Millisecond
	start := time.Now()
	startWatcher(t, w, r, 4, grace)
	waitFor(t, "v1 released after the grace", func() bool { return r.finishedCount("v1") > 0 })
	must.Greater(t, grace, time.Since(start))

	lost := newWorld(t)
	lr := newFakeReleaser()
	lost.claimed(t, "v2", "p", structs.AllocClientStatusRunning)
	down := lost.node.Copy()
	down.Status = structs.NodeStatusDown
	must.NoError(t, lost.store.UpsertNode(lost.next(), down))
	startWatcher(t, lost, lr, 4, time.Hour)
	waitFor(t, "v2 released at once: its node is down", func() bool { return lr.finishedCount("v2") > 0 })
}

func TestConfig_Validate(t *testing.T) {
	good := DefaultConfig()
	good.State = func() *state.StateStore { return nil }
	good.Releaser = newFakeReleaser()
	must.NoError(t, good.Validate())
	for name, mutate := range map[string]func(*Config){
		"no state":         func(c *Config) { c.State = nil },
		"no releaser":      func(c *Config) { c.Releaser = nil },
		"zero per plugin":  func(c *Config) { c.PerPlugin = 0 },
		"zero interval":    func(c *Config) { c.Interval = 0 },
		"backoff too tiny": func(c *Config) { c.MaxBackoff = c.Interval / 2 },
		"negative grace":   func(c *Config) { c.ClientReleaseGrace = -1 },
	} {
		t.Run(name, func(t *testing.T) {
			c := good
			mutate(&c)
			must.Error(t, c.Validate())
		})
	}
}

// A release that failed for want of a controller is tried again as soon as
// a controller is ready, not after its backoff: after a partition heals,
// the claims it held settle at once.
func TestWatcher_RetriesWhenAControllerComesBack(t *testing.T) {
	w := newWorld(t)
	r := newFakeReleaser()
	r.fail["v1"] = fmt.Errorf("controller unpublish: %w", structs.ErrCSIControllerUnavailable)
	w.claimed(t, "v1", "p", structs.AllocClientStatusComplete)
	cfg := DefaultConfig()
	cfg.State = func() *state.StateStore { return w.store }
	cfg.Releaser = r
	cfg.Interval = 50 * time.Millisecond
	cfg.MaxBackoff = time.Hour
	wt, err := New(cfg)
	must.NoError(t, err)
	runWatcher(t, wt)
	// Backoff 50ms, 100ms, ... doubles: after a few tries the next one is
	// far off.
	waitFor(t, "three tries", func() bool { return r.finishedCount("v1") >= 3 })
	wt.mu.Lock()
	next := wt.claims[claimKey{"v1", "alloc-v1"}].next
	wt.mu.Unlock()
	must.Greater(t, 150*time.Millisecond, time.Until(next), must.Sprint("backoff should have grown"))
	before := r.startedCount("v1")

	// A healthy controller on the ready node: the release is tried again
	// without waiting out the backoff.
	r.mu.Lock()
	r.fail["v1"] = nil
	r.mu.Unlock()
	n := w.node.Copy()
	n.CSIControllerPlugins = map[string]*structs.CSIInfo{"p": {PluginID: "p", Healthy: true, RequiresControllerPlugin: true}}
	must.NoError(t, w.store.UpsertNode(w.next(), n))
	waitFor(t, "a retry once the controller is ready", func() bool { return r.startedCount("v1") > before })
	wt.mu.Lock()
	stillWaiting := time.Now().Before(next)
	wt.mu.Unlock()
	must.True(t, stillWaiting, must.Sprint("the retry came only after the backoff ended"))
}

// A release that failed while the controller's node was still listed
// ready (a partition, before the node is declared down) is tried again
// when that node comes back, before its backoff ends: the count dropped
// to 0 and rose to 1, which is a rise although it ends where the release
// started.
func TestWatcher_RetriesWhenControllerNodeReturns(t *testing.T) {
	w := newWorld(t)
	up := w.node.Copy()
	up.CSIControllerPlugins = map[string]*structs.CSIInfo{"p": {PluginID: "p", Healthy: true, RequiresControllerPlugin: true}}
	must.NoError(t, w.store.UpsertNode(w.next(), up))
	w.claimed(t, "v1", "p", structs.AllocClientStatusComplete)
	cfg := DefaultConfig()
	cfg.State = func() *state.StateStore { return w.store }
	cfg.Releaser = newFakeReleaser()
	wt, err := New(cfg)
	must.NoError(t, err)

	// The release started with the node ready, failed for want of a
	// controller, and backs off for a minute.
	k := claimKey{"v1", "alloc-v1"}
	wt.claims[k] = &claimTrack{seen: time.Now().Add(-time.Hour), readyAtStart: 1, noController: true, next: time.Now().Add(time.Minute)}
	due := func() bool {
		t.Helper()
		v, err := w.store.CSIVolumeByID(nil, structs.DefaultNamespace, "v1")
		must.NoError(t, err)
		ok, err := wt.due(w.store, map[string]*structs.CSIPlugin{}, v, v.Claims["alloc-v1"], time.Now())
		must.NoError(t, err)
		return ok
	}
	must.False(t, due(), must.Sprint("retried with the same controller still ready"))

	down := up.Copy()
	down.Status = structs.NodeStatusDown
	must.NoError(t, w.store.UpsertNode(w.next(), down))
	must.False(t, due(), must.Sprint("retried with no controller ready"))

	must.NoError(t, w.store.UpsertNode(w.next(), up.Copy()))
	must.True(t, due(), must.Sprint("the node came back, and the release waits out its backoff"))
}

// A claim left in publishing is released after PublishTimeout of the
// watcher's own clock, however old its stored stamp: the stamp is some
// server's wall clock, which may have stepped or run ahead of this one's.
func TestWatcher_PublishTimeoutOnItsOwnClock(t *testing.T) {
	w := newWorld(t)
	r := newFakeReleaser()
	a := &structs.Allocation{ID: "alloc-v1", Namespace: structs.DefaultNamespace, JobID: "j", TaskGroup: "g",
		NodeID: w.node.ID, DesiredStatus: structs.AllocDesiredStatusRun, ClientStatus: structs.AllocClientStatusRunning}
	must.NoError(t, w.store.UpsertAllocs(w.next(), []*structs.Allocation{a}))
	v := &structs.CSIVolume{ID: "v1", Namespace: structs.DefaultNamespace, ExternalID: "ext-v1", PluginID: "p",
		RequestedCapabilities: []*structs.CSIVolumeCapability{{AccessMode: structs.CSIAccessModeSingleNodeWriter,
			AttachmentMode: structs.CSIAttachmentModeFilesystem}}}
	must.NoError(t, w.store.UpsertCSIVolumes(w.next(), []*structs.CSIVolume{v}))
	must.NoError(t, w.store.UpdateCSIVolumeClaim(w.next(), structs.DefaultNamespace, v.ID, &structs.CSIVolumeClaim{
		AllocationID: a.ID, NodeID: w.node.ID, Mode: structs.CSIVolumeClaimWrite,
		AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
		State: structs.CSIVolumeClaimStatePublishing, UpdatedAt: time.Now().Add(-time.Hour).UnixNano()}))

	var elapsed atomic.Int64 // the fake clock's advance, in nanoseconds
	start := time.Now()
	cfg := DefaultConfig()
	cfg.State = func() *state.StateStore { return w.store }
	cfg.Releaser = r
	cfg.Interval = 20 * time.Millisecond
	cfg.MaxBackoff = 200 * time.Millisecond
	cfg.PublishTimeout = time.Minute
	cfg.Now = func() time.Time { return start.Add(time.Duration(elapsed.Load())) }
	wt, err := New(cfg)
	must.NoError(t, err)
	runWatcher(t, wt)

	// The first pass sights the claim at 0 on the watcher's clock; ten
	// passes under a minute later, the hour-old stamp alone has not made
	// the claim abandoned.
	waitFor(t, "a first whole pass", func() bool { return wt.passes.Load() > 1 })
	elapsed.Store(int64(59 * time.Second))
	from := wt.passes.Load()
	waitFor(t, "ten passes", func() bool { return wt.passes.Load() >= from+10 })
	must.Zero(t, r.startedCount(v.ID), must.Sprint("released on the stored stamp, not on the watcher's own clock"))

	elapsed.Store(int64(61 * time.Second))
	waitFor(t, "the claim released once it sat a minute in publishing", func() bool { return r.finishedCount(v.ID) > 0 })
}
