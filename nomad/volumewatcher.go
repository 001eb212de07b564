package nomad

import (
	"context"
	"sync"
	"time"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/roamhq/roam/structs"
)

// The volume watcher runs on the leader. It drives to a settled state every
// claim whose allocation is terminal or gone or whose node is down or
// gone, every claim left half-released, and every claim stuck in
// publishing (the leader that reserved it is gone), so no claim is left
// without an allocation and no volume stays attached without a claim.
const (
	volumeWatchInterval = time.Second
	// stuckPublishingAfter is how long a publishing claim may sit with no
	// call in flight on this leader before it is settled.
	stuckPublishingAfter = csiCallTimeout
	maxVolumeBackoff     = 30 * time.Second
)

// claimsInFlight records claims the leader is working on now, so the
// watcher leaves them alone, and so a departing leader can wait for every
// claim transition it started to reach its checkpoint.
type claimsInFlight struct {
	mu sync.Mutex
	m  map[claimKey]bool
	// active counts the entries of m, for a departing leader to wait on.
	active inFlight
}

type claimKey struct{ vol, alloc string }

func (c *claimsInFlight) start(k claimKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[claimKey]bool)
	}
	if c.m[k] {
		return false
	}
	c.m[k] = true
	c.active.add()
	return true
}

func (c *claimsInFlight) done(k claimKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m[k] {
		delete(c.m, k)
		c.active.done()
	}
}

// waitIdle waits until no claim transition is in flight, or ctx ends, and
// returns how many there were when it was called.
func (c *claimsInFlight) waitIdle(ctx context.Context) (int, error) {
	return c.active.waitIdle(ctx)
}

func (c *claimsInFlight) has(k claimKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[k]
}

// runVolumeWatcher settles claims until ctx (the leader's term) ends.
func (s *Server) runVolumeWatcher(ctx context.Context) {
	next := make(map[string]time.Time) // volume ID → earliest next attempt
	backoff := make(map[string]time.Duration)
	for {
		ws := memdb.NewWatchSet()
		s.watchVolumesOnce(ctx, ws, next, backoff)
		wctx, cancel := context.WithTimeout(ctx, volumeWatchInterval)
		_ = ws.WatchCtx(wctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
	}
}

func (s *Server) watchVolumesOnce(ctx context.Context, ws memdb.WatchSet, next map[string]time.Time, backoff map[string]time.Duration) {
	store := s.State()
	ws.Add(store.AbandonCh())
	vols, err := store.CSIVolumes(ws, structs.DefaultNamespace, "")
	if err != nil {
		s.logger.Error("volume watcher: list volumes", "error", err)
		return
	}
	now := time.Now()
	for _, v := range vols {
		if len(v.Claims) == 0 || now.Before(next[v.ID]) {
			continue
		}
		failed := false
		for allocID, claim := range v.Claims {
			if ctx.Err() != nil {
				return // leadership is ending: start no new release
			}
			k := claimKey{v.ID, allocID}
			if s.claims.has(k) || !s.claimNeedsSettling(ws, claim, now) {
				continue
			}
			if !s.claims.start(k) {
				continue
			}
			err := s.releaseClaim(ctx, v.ID, allocID, false)
			s.claims.done(k)
			if err != nil {
				failed = true
				s.logger.Warn("volume watcher: claim not yet released; will retry",
					"volume_id", v.ID, "alloc_id", allocID, "state", claim.State, "error", err)
				continue
			}
			s.logger.Info("volume watcher: claim released", "volume_id", v.ID, "alloc_id", allocID)
		}
		// Rate-limit per volume: back off while releases keep failing.
		if failed {
			b := min(max(2*backoff[v.ID], volumeWatchInterval), maxVolumeBackoff)
			backoff[v.ID] = b
			next[v.ID] = now.Add(b)
		} else {
			delete(backoff, v.ID)
			delete(next, v.ID)
		}
	}
}

// claimNeedsSettling reports whether the watcher should release claim.
func (s *Server) claimNeedsSettling(ws memdb.WatchSet, claim *structs.CSIVolumeClaim, now time.Time) bool {
	switch claim.State {
	case structs.CSIVolumeClaimStateUnpublishing, structs.CSIVolumeClaimStateNodeDetached,
		structs.CSIVolumeClaimStateControllerDetached:
		return true // a release that stopped part way
	case structs.CSIVolumeClaimStatePublishing:
		if now.Sub(time.Unix(0, claim.UpdatedAt)) > stuckPublishingAfter {
			return true
		}
	}
	return s.claimStaleWatch(ws, claim)
}

// claimStale reports whether a claim's allocation is over: terminal or
// gone, or on a node that is down or gone.
func (s *Server) claimStale(claim *structs.CSIVolumeClaim) bool { return s.claimStaleWatch(nil, claim) }

func (s *Server) claimStaleWatch(ws memdb.WatchSet, claim *structs.CSIVolumeClaim) bool {
	store := s.State()
	alloc, err := store.AllocByID(ws, claim.AllocationID)
	if err != nil {
		return false
	}
	if alloc == nil || alloc.TerminalStatus() {
		return true
	}
	node, err := store.NodeByID(ws, claim.NodeID)
	if err != nil {
		return false
	}
	return node == nil || node.Status == structs.NodeStatusDown
}
