// Package volumewatcher runs on the leader and drives every claim that
// needs it to a settled state: claims whose allocation's tasks are gone
// (csiclaim.Releasable), claims left half-released, and claims stuck in
// publishing. So no claim is left without an allocation and no volume
// stays attached without a claim.
//
// It decides with the claim core (csiclaim.Next) and acts only through a
// Releaser, so it knows nothing of Raft or RPC. Releases of different
// plugins run concurrently, and at most Config.PerPlugin at a time for one
// plugin: a hung plugin delays only its own volumes.
package volumewatcher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	memdb "github.com/hashicorp/go-memdb"

	"github.com/roamhq/roam/nomad/csiclaim"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// Releaser releases one claim. It fails with structs.ErrCSIClaimInUse
// while the claim may not be released yet and with
// structs.ErrClaimInProgress while the leader is already working on it;
// the watcher takes neither as a failure.
type Releaser interface {
	Release(ctx context.Context, volumeID, allocID string) error
}

// Config configures a Watcher.
type Config struct {
	// State returns the current state store (it is swapped on restore).
	State    func() *state.StateStore
	Releaser Releaser
	Logger   hclog.Logger
	// PerPlugin bounds the releases in flight for one plugin.
	PerPlugin int
	// Interval bounds the wait between passes when nothing changes:
	// publish timeouts and backoffs need a clock, not a change.
	Interval time.Duration
	// MinPassGap is the least time between the starts of two passes that
	// a change to the state (rather than a release ending) set off, so
	// that a burst of writes costs one pass over every claim, not one per
	// write. Zero means a quarter of Interval; it may not exceed Interval.
	MinPassGap time.Duration
	// MaxBackoff bounds the wait before a failed release is tried again.
	MaxBackoff time.Duration
	// PublishTimeout is how long a claim may sit in publishing before it
	// is released although its allocation runs.
	PublishTimeout time.Duration
	// PublishAges measures that on the server's own clock; the leader
	// shares its own with its claim walks, which must agree with the
	// watcher. The watcher keeps one of its own when nil.
	PublishAges *csiclaim.PublishAges
	// ClientReleaseGrace is how long the watcher leaves a taken claim to
	// its own client once the client reported the allocation terminal: a
	// live client unpublishes and releases its claims itself right after,
	// and stepping in at once only sends the node plugin every unpublish
	// twice. A node that is down gets no grace.
	ClientReleaseGrace time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// DefaultConfig returns the timings the leader uses; State and Releaser
// are the caller's.
func DefaultConfig() Config {
	return Config{
		PerPlugin:          4,
		Interval:           time.Second,
		MaxBackoff:         30 * time.Second,
		PublishTimeout:     2 * time.Minute,
		ClientReleaseGrace: 5 * time.Second,
	}
}

// Validate checks the configuration and changes nothing.
func (c Config) Validate() error {
	switch {
	case c.State == nil:
		return errors.New("volumewatcher: State is required")
	case c.Releaser == nil:
		return errors.New("volumewatcher: Releaser is required")
	case c.PerPlugin < 1:
		return fmt.Errorf("volumewatcher: PerPlugin = %d, must be at least 1", c.PerPlugin)
	case c.Interval <= 0:
		return fmt.Errorf("volumewatcher: Interval = %s, must be positive", c.Interval)
	case c.MinPassGap < 0 || c.MinPassGap > c.Interval:
		return fmt.Errorf("volumewatcher: MinPassGap = %s, must be between 0 and Interval (%s)", c.MinPassGap, c.Interval)
	case c.ClientReleaseGrace < 0:
		return fmt.Errorf("volumewatcher: ClientReleaseGrace = %s, must not be negative", c.ClientReleaseGrace)
	case c.MaxBackoff < c.Interval:
		return fmt.Errorf("volumewatcher: MaxBackoff = %s, must be at least Interval (%s)", c.MaxBackoff, c.Interval)
	}
	return nil
}

// minPassGap is MinPassGap with its default applied.
func (c Config) minPassGap() time.Duration {
	if c.MinPassGap == 0 {
		return c.Interval / 4
	}
	return c.MinPassGap
}

type claimKey struct{ vol, alloc string }

// claimTrack is what the watcher remembers of one claim between passes.
type claimTrack struct {
	// seen is when the watcher first found the claim due.
	seen    time.Time
	running bool
	backoff time.Duration
	next    time.Time // earliest next attempt after a failure
	// readyAtStart is how many of the plugin's healthy controllers were on
	// ready nodes when the last release started. A release that failed
	// for want of a controller is tried again as soon as more are ready
	// (the partition healed, the node came back) rather than after its
	// backoff, which by then may be most of MaxBackoff.
	readyAtStart int
	noController bool // the last release failed for want of a controller
}

// Watcher settles claims; see the package doc.
type Watcher struct {
	cfg    Config
	logger hclog.Logger
	// wake is poked when a release ends, so a plugin's next claim starts
	// without waiting for the interval.
	wake chan struct{}

	// passes counts passes, for tests and benchmarks.
	passes atomic.Int64

	mu       sync.Mutex
	claims   map[claimKey]*claimTrack
	inPlugin map[string]int // releases in flight per plugin
}

// New returns a Watcher; Run starts it.
func New(cfg Config) (*Watcher, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.PublishAges == nil {
		cfg.PublishAges = new(csiclaim.PublishAges)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Watcher{
		cfg:      cfg,
		logger:   cfg.Logger.Named("volume_watcher"),
		wake:     make(chan struct{}, 1),
		claims:   make(map[claimKey]*claimTrack),
		inPlugin: make(map[string]int),
	}, nil
}

// Run settles claims until ctx ends, then waits for the releases it
// started (they end with ctx too) before it returns.
func (w *Watcher) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		ws := memdb.NewWatchSet()
		started := time.Now()
		w.pass(ctx, ws, &wg)
		wctx, cancel := context.WithTimeout(ctx, w.cfg.Interval)
		var released atomic.Bool
		woke := make(chan struct{})
		go func() {
			defer close(woke)
			select {
			case <-w.wake:
				released.Store(true)
				cancel()
			case <-wctx.Done():
			}
		}()
		changed := ws.WatchCtx(wctx) == nil
		cancel()
		<-woke
		if ctx.Err() != nil {
			return
		}
		if changed && !released.Load() {
			// A pass reads every claim: at 10,000 claims one per write
			// took more CPU than the writes, and the claim path's
			// checkpoints are writes. Changes that come faster than
			// the gap share one pass; a release that ends does not
			// wait, so a plugin's next release starts at once.
			w.waitGap(ctx, started)
		}
	}
}

// waitGap waits until MinPassGap has passed since started, a release ends,
// or ctx ends.
func (w *Watcher) waitGap(ctx context.Context, started time.Time) {
	rest := w.cfg.minPassGap() - time.Since(started)
	if rest <= 0 {
		return
	}
	t := time.NewTimer(rest)
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.wake:
	case <-ctx.Done():
	}
}

// pass looks at every claim once and starts the releases that are due.
func (w *Watcher) pass(ctx context.Context, ws memdb.WatchSet, wg *sync.WaitGroup) {
	w.passes.Add(1)
	store := w.cfg.State()
	ws.Add(store.AbandonCh())
	vols, err := store.CSIVolumes(ws, structs.DefaultNamespace, "")
	if err != nil {
		w.logger.Error("list volumes", "error", err)
		return
	}
	// The pass depends on claims' allocations, nodes and plugins: one
	// channel per table wakes it on any change to them. A channel per
	// object read made the watch set three times the claims, and
	// building and waiting on it cost more than the pass's reads.
	if err := store.WatchTables(ws, state.TableAllocs, state.TableNodes, state.TableCSIPlugins); err != nil {
		w.logger.Error("watch tables", "error", err)
		return
	}
	now := w.cfg.Now()
	live := make(map[claimKey]bool)
	plugins := make(map[string]*structs.CSIPlugin)
	for _, v := range vols {
		for allocID, claim := range v.Claims {
			if ctx.Err() != nil {
				return // leadership is ending: start no new release
			}
			k := claimKey{v.ID, allocID}
			live[k] = true
			due, err := w.due(store, plugins, v, claim, now)
			if err != nil {
				w.logger.Error("read claim", "volume_id", v.ID, "alloc_id", allocID, "error", err)
				continue
			}
			if due {
				w.start(ctx, wg, k, v.PluginID, claim.State)
			}
		}
	}
	w.forget(live)
}

// due says whether the claim needs a release started now: the core wants
// work done, no release of it is running here, its backoff is over, and
// its plugin has room.
// plugins holds the plugins this pass has read, by ID (nil: none).
func (w *Watcher) due(store *state.StateStore, plugins map[string]*structs.CSIPlugin, v *structs.CSIVolume, claim *structs.CSIVolumeClaim, now time.Time) (bool, error) {
	alloc, err := store.AllocByID(nil, claim.AllocationID)
	if err != nil {
		return false, err
	}
	node, err := store.NodeByID(nil, claim.NodeID)
	if err != nil {
		return false, err
	}
	plugin, ok := plugins[v.PluginID]
	if !ok {
		if plugin, err = store.CSIPluginByID(nil, v.PluginID); err != nil {
			return false, err
		}
		plugins[v.PluginID] = plugin
	}
	step := csiclaim.Next(csiclaim.Input{
		Goal: csiclaim.GoalRelease, Claim: claim, Alloc: alloc, Node: node,
		PluginID: v.PluginID, Plugin: plugin, PublishTimeout: w.cfg.PublishTimeout,
		PublishingFor: w.cfg.PublishAges.Of(v.ID, claim, now),
	})
	switch step.Action {
	case csiclaim.ActionWait, csiclaim.ActionDone:
		return false, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	k := claimKey{v.ID, claim.AllocationID}
	t := w.claims[k]
	if t == nil {
		t = &claimTrack{seen: now}
		w.claims[k] = t
	}
	if t.running {
		return false, nil
	}
	ready := readyControllers(store, plugin)
	if t.noController {
		// A controller's node that went down and came back counts as
		// one more ready: the low point is what the rise is measured from.
		t.readyAtStart = min(t.readyAtStart, ready)
	}
	if now.Before(t.next) && !(t.noController && ready > t.readyAtStart) {
		return false, nil
	}
	if claim.State == structs.CSIVolumeClaimStateTaken && alloc != nil && node != nil &&
		node.Status != structs.NodeStatusDown && now.Sub(t.seen) < w.cfg.ClientReleaseGrace {
		return false, nil // its own client is releasing it
	}
	if w.inPlugin[v.PluginID] >= w.cfg.PerPlugin {
		return false, nil
	}
	t.readyAtStart = ready
	return true, nil
}

// readyControllers counts plugin's healthy controllers on ready nodes: the
// controllers a release could be sent to.
func readyControllers(store *state.StateStore, plugin *structs.CSIPlugin) int {
	if plugin == nil {
		return 0
	}
	n := 0
	for nodeID, info := range plugin.Controllers {
		if info == nil || !info.Healthy {
			continue
		}
		node, err := store.NodeByID(nil, nodeID)
		if err == nil && node != nil && node.Status == structs.NodeStatusReady {
			n++
		}
	}
	return n
}

// start runs one release in its own goroutine.
func (w *Watcher) start(ctx context.Context, wg *sync.WaitGroup, k claimKey, pluginID string, from structs.CSIClaimState) {
	w.mu.Lock()
	t := w.claims[k]
	t.running = true
	w.inPlugin[pluginID]++
	w.mu.Unlock()

	wg.Add(1)
	go func() {
		defer wg.Done()
		err := w.cfg.Releaser.Release(ctx, k.vol, k.alloc)
		w.finish(k, pluginID, from, err)
		if errors.Is(err, structs.ErrClaimInProgress) || errors.Is(err, structs.ErrCSIClaimInUse) {
			// Nothing was released: the claim is someone else's to
			// walk (the claim path's, for every claim it releases)
			// or not yet releasable. Waking here made a pass over
			// every claim for each claim the claim path released.
			return
		}
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}()
}

// finish records how a release ended and sets the claim's backoff.
func (w *Watcher) finish(k claimKey, pluginID string, from structs.CSIClaimState, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inPlugin[pluginID]--
	if w.inPlugin[pluginID] == 0 {
		delete(w.inPlugin, pluginID)
	}
	t := w.claims[k]
	t.running = false
	t.noController = errors.Is(err, structs.ErrCSIControllerUnavailable)
	switch {
	case err == nil:
		t.backoff, t.next = 0, time.Time{}
		w.logger.Info("claim released", "volume_id", k.vol, "alloc_id", k.alloc, "from", from)
	case errors.Is(err, structs.ErrCSIClaimInUse), errors.Is(err, structs.ErrClaimInProgress):
		// Not ours to release now (someone else is, or the task still
		// runs): not a failure, but not again before the interval.
		t.backoff, t.next = 0, w.cfg.Now().Add(w.cfg.Interval)
	default:
		t.backoff = min(max(2*t.backoff, w.cfg.Interval), w.cfg.MaxBackoff)
		t.next = w.cfg.Now().Add(t.backoff)
		w.logger.Warn("claim not yet released; will retry", "volume_id", k.vol, "alloc_id", k.alloc,
			"state", from, "retry_in", t.backoff, "error", err)
	}
}

// forget drops what it remembers of claims that are gone.
func (w *Watcher) forget(live map[claimKey]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, t := range w.claims {
		if !live[k] && !t.running {
			delete(w.claims, k)
		}
	}
	w.cfg.PublishAges.Retain(func(vol, alloc string) bool { return live[claimKey{vol, alloc}] })
}
