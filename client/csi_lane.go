package client

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/roamhq/roam/structs"
)

// csiLane runs one plugin's controller calls one at a time, in the order
// they arrived. Providers are not safe against overlapping destructive
// calls, and servers cannot promise not to overlap them: a leader that
// steps down mid-call cannot stop the call it sent, and its successor may
// send the next one at once. The lane settles that on the client, whoever
// the sender.
type csiLane struct {
	logger hclog.Logger
	wake   chan struct{} // capacity 1: "the queue may be non-empty"
	// stopped is closed once run has returned.
	stopped chan struct{}

	// mu guards queue and closed.
	mu     sync.Mutex
	queue  []*csiLaneCall
	closed bool
}

// Lane call states.
const (
	laneCallQueued int32 = iota
	laneCallRunning
	laneCallAbandoned
)

type csiLaneCall struct {
	method  string
	ctx     context.Context
	timeout time.Duration
	fn      func(context.Context) error
	queued  time.Time
	state   atomic.Int32
	done    chan error // capacity 1
}

func newCSILane(logger hclog.Logger) *csiLane {
	return &csiLane{
		logger:  logger.Named("lane"),
		wake:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
	}
}

// do queues fn and waits for its result or for ctx. fn gets a context that
// keeps ctx's values but not its cancellation, with its own timeout. If
// ctx ends before fn started, fn never runs; if fn is running, it runs to
// completion and do returns an error wrapping ErrCSIUnavailable (the
// caller does not learn the outcome) and ctx's error.
func (l *csiLane) do(ctx context.Context, method string, timeout time.Duration, fn func(context.Context) error) error {
	c := &csiLaneCall{method: method, ctx: ctx, timeout: timeout, fn: fn, queued: time.Now(), done: make(chan error, 1)}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return fmt.Errorf("csi %s: %w: the plugin was removed", method, structs.ErrCSIPluginNotFound)
	}
	l.queue = append(l.queue, c)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}

	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		if c.state.CompareAndSwap(laneCallQueued, laneCallAbandoned) {
			return fmt.Errorf("csi %s: caller gave up before the call started: %w", method, ctx.Err())
		}
		return fmt.Errorf("csi %s: %w: caller gave up; the call runs to completion on the client: %w",
			method, structs.ErrCSIUnavailable, ctx.Err())
	}
}

// run serves the queue until ctx ends, then fails whatever is still
// queued. A call in progress when ctx ends is finished first.
func (l *csiLane) run(ctx context.Context) {
	defer close(l.stopped)
	defer l.drain()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		}
		for ctx.Err() == nil {
			c := l.pop()
			if c == nil {
				break
			}
			if !c.state.CompareAndSwap(laneCallQueued, laneCallRunning) {
				continue // abandoned while queued
			}
			callCtx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), c.timeout)
			start := time.Now()
			l.logger.Debug("controller call started", "method", c.method, "queued", start.Sub(c.queued))
			err := c.fn(callCtx)
			cancel()
			if err != nil {
				l.logger.Debug("controller call failed", "method", c.method, "duration", time.Since(start), "error", err)
			}
			c.done <- err
		}
	}
}

func (l *csiLane) pop() *csiLaneCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.queue) == 0 {
		return nil
	}
	c := l.queue[0]
	l.queue[0] = nil
	l.queue = l.queue[1:]
	return c
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
			c.done <- fmt.Errorf("csi %s: %w: the plugin was removed before the call started", c.method, structs.ErrCSIPluginNotFound)
		}
	}
}
