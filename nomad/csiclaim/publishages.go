package csiclaim

import (
	"sync"
	"time"

	"github.com/roamhq/roam/structs"
)

// PublishAges measures how long claims have sat in publishing, on this
// server's own clock. The stored claim's UpdatedAt was stamped by
// whichever server wrote it, from that server's wall clock: after a step
// of the clock, or on a new leader whose clock runs an hour ahead, every
// claim in publishing would look abandoned at once, and a backward step
// would leave an abandoned one held for as long as the step. A claim
// unchanged since this server first saw it (same state, same UpdatedAt)
// has sat in publishing at least since that sighting, so the age is the
// time since it, taken from time.Now's monotonic reading. A new leader
// starts counting when it first looks: it waits out the timeout itself,
// which costs a release that much later and never releases one early.
//
// The zero value is ready to use; it is safe for concurrent use.
type PublishAges struct {
	mu sync.Mutex
	m  map[ageKey]sighting
}

type ageKey struct{ vol, alloc string }

type sighting struct {
	updatedAt int64
	at        time.Time
}

// Of returns how long c, a claim on volume volID, has been seen in
// publishing unchanged as of now: zero at its first sighting, and zero
// for a claim in any other state (which is forgotten). now must come
// from the same clock on every call.
func (p *PublishAges) Of(volID string, c *structs.CSIVolumeClaim, now time.Time) time.Duration {
	if c == nil {
		return 0
	}
	k := ageKey{volID, c.AllocationID}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.State != structs.CSIVolumeClaimStatePublishing {
		delete(p.m, k)
		return 0
	}
	if p.m == nil {
		p.m = make(map[ageKey]sighting)
	}
	s, ok := p.m[k]
	if !ok || s.updatedAt != c.UpdatedAt {
		p.m[k] = sighting{updatedAt: c.UpdatedAt, at: now}
		return 0
	}
	return max(now.Sub(s.at), 0)
}

// Retain forgets every claim for which keep is false: claims that are no
// longer stored, so the map stays the size of the claims in publishing.
func (p *PublishAges) Retain(keep func(volID, allocID string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := range p.m {
		if !keep(k.vol, k.alloc) {
			delete(p.m, k)
		}
	}
}

// Len returns how many claims are remembered.
func (p *PublishAges) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}
