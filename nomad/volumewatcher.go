package nomad

import (
	"context"
	"fmt"
	"sync"

	"github.com/roamhq/roam/nomad/volumewatcher"
	"github.com/roamhq/roam/structs"
)

// stuckPublishingAfter is how long a publishing claim may sit with no call
// in flight on this leader before it is settled.
const stuckPublishingAfter = csiCallTimeout

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

// runVolumeWatcher settles claims until ctx (the leader's term) ends; see
// package volumewatcher.
func (s *Server) runVolumeWatcher(ctx context.Context) {
	cfg := volumewatcher.DefaultConfig()
	cfg.State = s.State
	cfg.Releaser = watcherReleaser{s}
	cfg.Logger = s.logger
	cfg.PublishTimeout = stuckPublishingAfter
	cfg.PublishAges = &s.publishAges
	w, err := volumewatcher.New(cfg)
	if err != nil {
		// A broken constant, not an operator's mistake.
		panic(err)
	}
	w.Run(ctx)
}

// watcherReleaser is the watcher's narrow view of the leader.
type watcherReleaser struct{ s *Server }

var _ volumewatcher.Releaser = watcherReleaser{}

// Release walks one claim towards freed, unless the leader is already
// working on it.
func (r watcherReleaser) Release(ctx context.Context, volID, allocID string) error {
	k := claimKey{volID, allocID}
	if !r.s.claims.start(k) {
		return fmt.Errorf("%w: allocation %s, volume %s", structs.ErrClaimInProgress, allocID, volID)
	}
	defer r.s.claims.done(k)
	return r.s.releaseClaim(ctx, volID, allocID, false)
}
