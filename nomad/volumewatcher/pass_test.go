package volumewatcher

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// startWatcherWith starts a watcher over w with the test timings changed
// by set, and returns it.
func startWatcherWith(t *testing.T, w *world, r Releaser, set func(*Config)) *Watcher {
	cfg := DefaultConfig()
	cfg.State = func() *state.StateStore { return w.store }
	cfg.Releaser = r
	cfg.ClientReleaseGrace = 0
	set(&cfg)
	wt, err := New(cfg)
	must.NoError(t, err)
	runWatcher(t, wt)
	return wt
}

// The watcher wakes on a change to a claim's allocation, node or plugin,
// not only on its interval: with an interval of a minute, a client that
// reports its allocation done, or a node that goes down, still has its
// claim released within the test's wait.
func TestWatcher_WakesOnChanges(t *testing.T) {
	for _, change := range []string{"alloc", "node"} {
		t.Run(change, func(t *testing.T) {
			w := newWorld(t)
			r := newFakeReleaser()
			a := w.claimed(t, "v1", "p", structs.AllocClientStatusRunning)
			wt := startWatcherWith(t, w, r, func(c *Config) {
				c.Interval, c.MaxBackoff, c.MinPassGap = time.Minute, time.Minute, time.Millisecond
			})
			waitFor(t, "a first pass", func() bool { return wt.passes.Load() > 0 })
			must.Zero(t, r.startedCount("v1"))
			switch change {
			case "alloc":
				w.clientDone(t, a)
			case "node":
				down := w.node.Copy()
				down.Status = structs.NodeStatusDown
				must.NoError(t, w.store.UpsertNode(w.next(), down))
			}
			waitFor(t, "v1 released after the change", func() bool { return r.finishedCount("v1") > 0 })
		})
	}
}

// Writes that come faster than MinPassGap share passes: 50 claim writes
// within one gap of a minute cost at most the one pass the first of them
// set off, not 50.
func TestWatcher_WritesShareAPass(t *testing.T) {
	w := newWorld(t)
	r := newFakeReleaser()
	w.claimed(t, "v1", "p", structs.AllocClientStatusRunning)
	spare := w.claimed(t, "v2", "p", structs.AllocClientStatusRunning)
	wt := startWatcherWith(t, w, r, func(c *Config) {
		c.Interval, c.MaxBackoff, c.MinPassGap = time.Minute, time.Minute, time.Minute
	})
	waitFor(t, "a first pass", func() bool { return wt.passes.Load() > 0 })
	first := wt.passes.Load()
	for i := range 50 {
		claim := &structs.CSIVolumeClaim{AllocationID: spare.ID, NodeID: w.node.ID, Mode: structs.CSIVolumeClaimWrite,
			AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
			State: structs.CSIVolumeClaimStateTaken, UpdatedAt: int64(i)}
		must.NoError(t, w.store.UpdateCSIVolumeClaim(w.next(), structs.DefaultNamespace, "v2", claim))
	}
	// Give any pass the writes would set off time to run, then count.
	passesStayAtMost(t, wt, first+1)
}

// passesStayAtMost fails if wt's pass count goes past n within half a
// second: the time any pass a test's writes or endings set off needs to
// start. It returns as soon as the count is past n.
func passesStayAtMost(t *testing.T, wt *Watcher, n int64) {
	t.Helper()
	window := time.NewTimer(500 * time.Millisecond)
	defer window.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for wt.passes.Load() <= n {
		select {
		case <-window.C:
			return
		case <-tick.C:
		}
	}
	must.LessEq(t, n, wt.passes.Load())
}

// storeReleaser frees the claim in the store before it reports the
// release done, as the leader's checkpoints do: the write wakes the
// watcher before the release's end does.
type storeReleaser struct {
	*fakeReleaser
	w *world
	// mu serializes the world's index.
	mu sync.Mutex
}

func (s *storeReleaser) Release(ctx context.Context, volID, allocID string) error {
	if err := s.fakeReleaser.Release(ctx, volID, allocID); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.store.UpdateCSIVolumeClaim(s.w.next(), structs.DefaultNamespace, volID,
		&structs.CSIVolumeClaim{AllocationID: allocID, State: structs.CSIVolumeClaimStateFreed})
}

// A release that ends starts the plugin's next one at once, gap or not:
// with PerPlugin 1 and a gap and interval of a minute, three due claims of
// one plugin are all released within the test's wait, one at a time,
// although each release's own write starts a gap.
func TestWatcher_ReleaseEndSkipsTheGap(t *testing.T) {
	w := newWorld(t)
	r := &storeReleaser{fakeReleaser: newFakeReleaser(), w: w}
	for _, id := range []string{"v1", "v2", "v3"} {
		w.claimed(t, id, "p", structs.AllocClientStatusComplete)
		r.pluginOf[id] = "p"
	}
	startWatcherWith(t, w, r, func(c *Config) {
		c.PerPlugin = 1
		c.Interval, c.MaxBackoff, c.MinPassGap = time.Minute, time.Minute, time.Minute
	})
	waitFor(t, "every claim released", func() bool {
		return r.finishedCount("v1") > 0 && r.finishedCount("v2") > 0 && r.finishedCount("v3") > 0
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	must.Eq(t, 1, r.maxRun["p"])
}

func TestConfig_MinPassGap(t *testing.T) {
	c := DefaultConfig()
	c.State = func() *state.StateStore { return nil }
	c.Releaser = newFakeReleaser()
	must.NoError(t, c.Validate())
	must.Eq(t, c.Interval/4, c.minPassGap())
	c.MinPassGap = -time.Second
	must.ErrorContains(t, c.Validate(), "MinPassGap = -1s")
	c.MinPassGap = 2 * c.Interval
	must.ErrorContains(t, c.Validate(), "MinPassGap = 2s")
	c.MinPassGap = c.Interval
	must.NoError(t, c.Validate())
	must.Eq(t, c.Interval, c.minPassGap())
}

// A release the leader is already walking (ErrClaimInProgress) ends at
// once and releases nothing; it must not set off another pass over every
// claim. With 20 such claims, one plugin and PerPlugin 1, passes stay at
// the first one's until the gap (a minute) is over.
//
// (It first also bounded the releases started to 2, which failed 4 runs in
// 20 under -race: a release that ends while the pass is still walking the
// claims frees its plugin's slot for the next claim in that same pass.)
func TestWatcher_InProgressDoesNotWake(t *testing.T) {
	w := newWorld(t)
	r := newFakeReleaser()
	for i := range 20 {
		id := fmt.Sprintf("v%d", i)
		w.claimed(t, id, "p", structs.AllocClientStatusComplete)
		r.fail[id] = fmt.Errorf("walking it: %w", structs.ErrClaimInProgress)
		r.pluginOf[id] = "p"
	}
	wt := startWatcherWith(t, w, r, func(c *Config) {
		c.PerPlugin = 1
		c.Interval, c.MaxBackoff, c.MinPassGap = time.Minute, time.Minute, time.Minute
	})
	waitFor(t, "a first release tried", func() bool { return r.finishedCount("v0") > 0 })
	// Give passes the wake-ups would set off time to run, then count.
	passesStayAtMost(t, wt, 2)
	// Within one pass, a slot a fast release frees is used by the next
	// due claim, so several releases may start; none may start twice,
	// which only another pass could do (each is backed off a minute).
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := make(map[string]bool)
	for _, id := range r.started {
		must.False(t, seen[id], must.Sprintf("release of %s started twice: %v", id, r.started))
		seen[id] = true
	}
}
