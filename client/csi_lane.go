package client

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/structs"
)

// csiLane runs one plugin's controller calls: by default one at a time, in
// the order they arrived. Providers are not safe against overlapping
// destructive calls, and servers cannot promise not to overlap them: a
// leader that steps down mid-call cannot stop the call it sent, and its
// successor may send the next one at once. The lane settles that on the
// client, whoever the sender.
//
// A plugin configured with controller_concurrency N runs up to N calls at
// once, once every server understands it (see csiManager.laneLimit): never
// two on one volume nor two publish/unpublish calls for one node, each
// volume's and node's calls in arrival order (laneadmit.Admit). Each call
// tells its sender whether a call that arrived before it was still queued
// or running when it ended (structs.CSIControllerReply): with one call at a
// time that is never so, and a sender may take an answer to mean that
// every earlier call has ended; with several it must ask.
type csiLane struct {
	logger hclog.Logger
	// limit is how many calls may run at once, read at each admission.
	limit func() int
	wake  chan struct{} // capacity 1: "the queue or the running set changed"
	// stopped is closed once run has returned.
	stopped chan struct{}

	// mu guards queue, running, seq and closed.
	mu      sync.Mutex
	queue   []*csiLaneCall
	running []*csiLaneCall
	seq     uint64
	closed  bool
}

// Lane call states.
const (
	laneCallQueued int32 = iota
	laneCallRunning
	laneCallAbandoned
)

type csiLaneCall struct {
	method  string
	key     laneadmit.Call
	seq     uint64 // arrival order
	ctx     context.Context
	timeout time.Duration
	fn      func(context.Context) error
	queued  time.Time
	// startBy is when the call must have started, or it is refused
	// unrun; zero: no bound.
	startBy time.Time
	state   atomic.Int32
	done    chan csiLaneResult // capacity 1
}

// csiLaneResult is how a call ended.
type csiLaneResult struct {
	err error
	// busyBefore: a call that arrived before this one was still queued or
	// running when this one ended.
	busyBefore bool
}

// newCSILane returns a lane; limit is asked at each admission (nil means
// one call at a time).
func newCSILane(logger hclog.Logger, limit func() int) *csiLane {
	if limit == nil {
		limit = func() int { return 1 }
	}
	return &csiLane{
		logger:  logger.Named("lane"),
		limit:   limit,
		wake:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
	}
}

func (l *csiLane) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// laneBounds bound one call of a lane: timeout once it runs, and
// startWithin (when not zero) how long it may wait for its turn.
type laneBounds struct {
	timeout, startWithin time.Duration
}

// do queues fn and waits for its result or for ctx. fn gets a context that
// keeps ctx's values but not its cancellation, with its own timeout. If
// ctx ends before fn started, fn never runs; if fn is running, it runs to
// completion and do returns an error wrapping ErrCSIUnavailable (the
// caller does not learn the outcome) and ctx's error. A call whose turn
// comes after its startWithin is refused unrun, also with
// ErrCSIUnavailable: its sender may have stopped waiting for it and
// counted on it being over. busyBefore is the call's
// csiLaneResult.busyBefore, false when fn did not run to an answer.
func (l *csiLane) do(ctx context.Context, method string, key laneadmit.Call, b laneBounds, fn func(context.Context) error) (busyBefore bool, err error) {
	now := time.Now()
	c := &csiLaneCall{method: method, key: key, ctx: ctx, timeout: b.timeout, fn: fn, queued: now, done: make(chan csiLaneResult, 1)}
	if b.startWithin > 0 {
		c.startBy = now.Add(b.startWithin)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false, fmt.Errorf("csi %s: %w: the plugin was removed", method, structs.ErrCSIPluginNotFound)
	}
	l.seq++
	c.seq = l.seq
	l.queue = append(l.queue, c)
	l.mu.Unlock()
	l.poke()

	select {
	case r := <-c.done:
		return r.busyBefore, r.err
	case <-ctx.Done():
		if c.state.CompareAndSwap(laneCallQueued, laneCallAbandoned) {
			// Its keys may hold calls behind it.
			l.poke()
			return false, fmt.Errorf("csi %s: caller gave up before the call started: %w", method, ctx.Err())
		}
		return false, fmt.Errorf("csi %s: %w: caller gave up; the call runs to completion on the client: %w",
			method, structs.ErrCSIUnavailable, ctx.Err())
	}
}

// run serves the queue until ctx ends, then waits for the calls running,
// and fails whatever is still queued.
func (l *csiLane) run(ctx context.Context) {
	var calls sync.WaitGroup
	defer close(l.stopped)
	defer l.drain()
	defer calls.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		}
		if ctx.Err() != nil {
			return
		}
		for _, c := range l.admit() {
			calls.Add(1)
			go func() {
				defer calls.Done()
				l.runCall(c)
			}()
		}
	}
}

// admit takes out of the queue the calls abandoned there and the calls
// laneadmit.Admit lets start, and returns the latter, marked running.
func (l *csiLane) admit() []*csiLaneCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept := l.queue[:0]
	for _, c := range l.queue {
		if c.state.Load() != laneCallAbandoned {
			kept = append(kept, c)
		}
	}
	clear(l.queue[len(kept):])
	l.queue = kept

	start := laneadmit.Admit(laneCallKeys(l.running), laneCallKeys(l.queue), l.limit())
	if len(start) == 0 {
		return nil
	}
	var out []*csiLaneCall
	kept = l.queue[:0]
	next := 0
	for i, c := range l.queue {
		if next < len(start) && start[next] == i {
			next++
			if c.state.CompareAndSwap(laneCallQueued, laneCallRunning) {
				l.running = append(l.running, c)
				out = append(out, c)
				continue
			}
			// Abandoned since the filter: its keys are free at the next
			// admission.
			defer l.poke()
			continue
		}
		kept = append(kept, c)
	}
	clear(l.queue[len(kept):])
	l.queue = kept
	return out
}

func (l *csiLane) runCall(c *csiLaneCall) {
	start := time.Now()
	var err error
	if !c.startBy.IsZero() && start.After(c.startBy) {
		waited := start.Sub(c.queued)
		l.logger.Warn("controller call refused unrun: its turn came too late", "method", c.method,
			"queued", waited, "start_within", c.startBy.Sub(c.queued))
		err = fmt.Errorf("csi %s: %w: waited %s in the plugin's lane, past the %s its sender allows; not run",
			c.method, structs.ErrCSIUnavailable, waited.Round(time.Millisecond), c.startBy.Sub(c.queued))
	} else {
		callCtx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), c.timeout)
		l.logger.Debug("controller call started", "method", c.method, "queued", start.Sub(c.queued))
		err = c.fn(callCtx)
		cancel()
	}
	if err != nil {
		l.logger.Debug("controller call failed", "method", c.method, "duration", time.Since(start), "error", err)
	}
	l.mu.Lock()
	l.running = slices.DeleteFunc(l.running, func(x *csiLaneCall) bool { return x == c })
	busy := slices.ContainsFunc(l.running, func(x *csiLaneCall) bool { return x.seq < c.seq }) ||
		slices.ContainsFunc(l.queue, func(x *csiLaneCall) bool { return x.seq < c.seq && x.state.Load() != laneCallAbandoned })
	l.mu.Unlock()
	c.done <- csiLaneResult{err: err, busyBefore: busy}
	l.poke()
}

func laneCallKeys(cs []*csiLaneCall) []laneadmit.Call {
	keys := make([]laneadmit.Call, len(cs))
	for i, c := range cs {
		keys[i] = c.key
	}
	return keys
}

// drain closes the lane and fails every queued call.
func (l *csiLane) drain() {
	l.mu.Lock()
	l.closed = true
	queue := l.queue
	l.queue = nil
	l.mu.Unlock()
	for _, c := range queue {
		if c.state.CompareAndSwap(laneCallQueued, laneCallAbandoned) {
			c.done <- csiLaneResult{err: fmt.Errorf("csi %s: %w: the plugin was removed before the call started", c.method, structs.ErrCSIPluginNotFound)}
		}
	}
}
