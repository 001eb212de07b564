package nomad

import (
	"context"
	"sync"
	"time"

	metrics "github.com/hashicorp/go-metrics"
	"github.com/roamhq/roam/structs"
)

// evalBroker queues evaluations for the leader's scheduler workers. It
// hands out at most one evaluation per job at a time, so two plans for one
// job never race; holds delayed evaluations until their WaitUntil; and
// keeps blocked evaluations until the cluster's capacity changes. It is
// empty and disabled on followers.
type evalBroker struct {
	mu      sync.Mutex
	enabled bool
	ready   []*structs.Evaluation
	// queued holds the IDs in ready, delayed or in flight, so the same
	// evaluation is never queued twice.
	queued  map[string]bool
	running map[jobKey]bool
	delayed map[string]*time.Timer
	blocked map[jobKey]*structs.Evaluation
	// unblocks counts unblock calls, so an evaluation scheduled against a
	// snapshot taken before the latest one is not blocked on stale news.
	unblocks uint64
	// wake is closed and replaced whenever work may be ready.
	wake chan struct{}
}

type jobKey struct{ namespace, id string }

func keyOf(e *structs.Evaluation) jobKey { return jobKey{e.Namespace, e.JobID} }

func newEvalBroker() *evalBroker {
	b := &evalBroker{wake: make(chan struct{})}
	b.resetLocked()
	return b
}

func (b *evalBroker) resetLocked() {
	for _, t := range b.delayed {
		t.Stop()
	}
	b.ready = nil
	b.queued = make(map[string]bool)
	b.running = make(map[jobKey]bool)
	b.delayed = make(map[string]*time.Timer)
	b.blocked = make(map[jobKey]*structs.Evaluation)
}

// setEnabled turns the broker on (gaining leadership) or off, dropping
// everything queued: a new leader reloads pending evaluations from state.
func (b *evalBroker) setEnabled(on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.enabled = on
	b.resetLocked()
	b.signalLocked()
}

func (b *evalBroker) signalLocked() {
	close(b.wake)
	b.wake = make(chan struct{})
}

// enqueue adds pending evaluations; blocked ones go to the blocked set.
// Others (complete, failed) are ignored.
func (b *evalBroker) enqueue(evals ...*structs.Evaluation) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.enabled {
		return
	}
	for _, e := range evals {
		if e == nil {
			continue
		}
		switch e.Status {
		case structs.EvalStatusBlocked:
			b.blocked[keyOf(e)] = e
			continue
		case structs.EvalStatusPending:
		default:
			continue
		}
		if b.queued[e.ID] {
			continue
		}
		b.queued[e.ID] = true
		if wait := time.Until(e.WaitUntil); !e.WaitUntil.IsZero() && wait > 0 {
			e := e
			b.delayed[e.ID] = time.AfterFunc(wait, func() { b.promote(e) })
			continue
		}
		b.ready = append(b.ready, e)
	}
	metrics.SetGauge([]string{"broker", "ready"}, float32(len(b.ready)))
	b.signalLocked()
}

// promote moves a delayed evaluation whose time has come to ready.
func (b *evalBroker) promote(e *structs.Evaluation) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.delayed[e.ID]; !ok {
		return // reset meanwhile
	}
	delete(b.delayed, e.ID)
	b.ready = append(b.ready, e)
	b.signalLocked()
}

// unblock re-queues every blocked evaluation but those of the jobs in
// except: capacity changed, so they may now place.
func (b *evalBroker) unblock(except ...jobKey) {
	b.mu.Lock()
	b.unblocks++
	blocked := b.blocked
	b.blocked = make(map[jobKey]*structs.Evaluation)
	for _, k := range except {
		if e, ok := blocked[k]; ok {
			b.blocked[k] = e
			delete(blocked, k)
		}
	}
	b.mu.Unlock()
	for _, e := range blocked {
		c := e.Copy()
		c.Status = structs.EvalStatusPending
		b.enqueue(c)
	}
}

// dequeue returns the oldest ready evaluation whose job has none in
// flight, waiting until there is one or ctx ends.
func (b *evalBroker) dequeue(ctx context.Context) (*structs.Evaluation, error) {
	for {
		b.mu.Lock()
		for i, e := range b.ready {
			if b.running[keyOf(e)] {
				continue
			}
			b.ready = append(b.ready[:i:i], b.ready[i+1:]...)
			b.running[keyOf(e)] = true
			b.mu.Unlock()
			return e, nil
		}
		wake := b.wake
		b.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// ack releases the evaluation's job for the next evaluation.
func (b *evalBroker) ack(e *structs.Evaluation) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.running, keyOf(e))
	delete(b.queued, e.ID)
	b.signalLocked()
}

// unblockGen returns the unblock count; a worker reads it before taking
// the snapshot it schedules against, and hands it to block.
func (b *evalBroker) unblockGen() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.unblocks
}

// block records an evaluation that could not place everything. If
// capacity changed since gen (an unblock came while it was scheduled
// against an older snapshot, say a volume claim freed), it is queued
// again at once instead: that change would otherwise be lost to it.
func (b *evalBroker) block(e *structs.Evaluation, gen uint64) {
	b.mu.Lock()
	if !b.enabled {
		b.mu.Unlock()
		return
	}
	if b.unblocks == gen {
		b.blocked[keyOf(e)] = e
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	c := e.Copy()
	c.Status = structs.EvalStatusPending
	b.enqueue(c)
}

// stats returns the counts of ready, delayed and blocked evaluations.
func (b *evalBroker) stats() (ready, delayed, blocked int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.ready), len(b.delayed), len(b.blocked)
}
