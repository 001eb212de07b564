package nomad

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	metrics "github.com/hashicorp/go-metrics"

	"github.com/roamhq/roam/structs"
)

// defaultLaneCallTimeout bounds one controller call when newControllerLanes
// is given no positive timeout.
const defaultLaneCallTimeout = 2 * time.Minute

// controllerLanes is the leader's serializer for destructive CSI controller
// calls: one first-come-first-served lane per plugin ID, in memory. Calls
// for one plugin run one at a time in arrival order; calls for different
// plugins never wait for each other.
//
// Waiting is bound to the caller's context and to the parent context given
// at construction (the server's shutdown or the leader's term). There is no
// Close: cancelling the parent is how the lanes end, after which every
// waiter, and every later Do, gets an error wrapping structs.ErrNoLeader.
//
// The zero value is not usable; build one with newControllerLanes.
type controllerLanes struct {
	parent      context.Context
	callTimeout time.Duration
	logger      hclog.Logger
	// term is the Raft term of the leadership that opened these lanes;
	// every controller call they send carries it (see
	// structs.CSIControllerQuery.LeaderTerm). Zero sends no term.
	term uint64

	mu sync.Mutex
	// lanes holds only lanes that are busy; an idle lane is deleted, so the
	// map does not grow with every plugin ever seen.
	lanes map[string]*lane
	// running counts calls whose fn has not returned. It is added to under
	// mu, together with the grant of a lane, so no call starts unseen
	// after the parent has ended.
	running inFlight
	// fences pins a plugin's calls to one node, by plugin ID (see fence).
	fences map[string]fence
	// idle is, by plugin ID, the node on which this leader has seen a
	// controller call answered: that client's lane has finished every
	// call an earlier leader sent there (see recordedFence).
	idle map[string]string
	// stats are what the lanes did, by plugin ID, for operators (the UI's
	// plugin page); at most maxLaneStats plugins.
	stats map[string]*laneStats
}

// maxLaneStats bounds how many plugins' lane stats a leader keeps; a
// plugin beyond it is not recorded (its lane works the same).
const maxLaneStats = 1024

// laneStats is one plugin's record; guarded by controllerLanes.mu.
type laneStats struct {
	inFlight int
	calls    uint64
	timeouts uint64
	// recent is a ring of the latest finished calls; next is where the
	// next one goes.
	recent []structs.CSILaneCall
	next   int
}

// lane is one plugin's queue. Invariant (under controllerLanes.mu): a lane
// in the map is busy, and waiters is empty whenever the lane is not busy;
// releasing hands the lane straight to the first waiter.
type lane struct {
	waiters []*laneWaiter
}

// laneWaiter is one queued caller. ready is closed, with granted set under
// the lock, when the lane is handed to it.
type laneWaiter struct {
	ready   chan struct{}
	granted bool
}

// newControllerLanes returns an empty serializer. parent ends all waiting
// (see controllerLanes); callTimeout bounds each call's hold on its lane
// (non-positive means defaultLaneCallTimeout).
func newControllerLanes(parent context.Context, callTimeout time.Duration, logger hclog.Logger) *controllerLanes {
	if callTimeout <= 0 {
		callTimeout = defaultLaneCallTimeout
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &controllerLanes{
		parent:      parent,
		callTimeout: callTimeout,
		logger:      logger.Named("csi_lanes"),
		lanes:       make(map[string]*lane),
		fences:      make(map[string]fence),
		stats:       make(map[string]*laneStats),
		idle:        make(map[string]string),
	}
}

// Do waits for pluginID's lane, runs fn in it and returns fn's error.
//
// While waiting: if the parent context ends, Do returns an error wrapping
// structs.ErrNoLeader (the client retries against the new leader); if ctx
// ends, the caller leaves the queue, the others keep their order, and Do
// returns ctx.Err() wrapped. Neither ever starts fn.
//
// fn's context is ctx without its cancellation, plus a deadline of
// callTimeout. A controller call already sent must finish: cutting it when
// the caller gives up or the leader steps down could leave a volume half
// attached (see DESIGN, "The serializer"). The deadline keeps one hung
// plugin from blocking its lane forever: when it passes, the lane goes to
// the next caller even if fn has not returned (logged, and counted as
// csi.lane.timeout). Do itself still returns only when fn does.
func (l *controllerLanes) Do(ctx context.Context, pluginID string, op string, fn func(ctx context.Context) error) error {
	if err := l.wait(ctx, pluginID, op); err != nil {
		return err
	}
	// wait counted the call as running.
	defer l.running.done()

	callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.callTimeout)
	defer cancel()
	start := time.Now()
	l.callStarted(pluginID)
	var passedDeadline bool

	// Exactly one of the deadline callback and the normal return releases
	// the lane: stop() reports true only if the callback will never run.
	timedOut := context.AfterFunc(callCtx, func() {
		metrics.IncrCounterWithLabels([]string{"csi", "lane", "timeout"}, 1, pluginLabels(pluginID))
		l.logger.Warn("controller call passed its deadline; releasing lane to the next caller",
			"plugin_id", pluginID, "op", op, "timeout", l.callTimeout)
		l.release(pluginID)
	})
	err := fn(callCtx)
	passedDeadline = !timedOut()
	// A call that ran into its deadline timed out, whether or not the
	// lane was released before it returned.
	reachedDeadline := passedDeadline || errors.Is(callCtx.Err(), context.DeadlineExceeded)
	// Recorded before the lane passes on, so the ring of recent calls is
	// in the order the plugin saw them.
	l.callDone(pluginID, structs.CSILaneCall{
		Op: op, Start: start, Duration: time.Since(start), TimedOut: reachedDeadline, Failed: err != nil,
	})
	if !passedDeadline {
		l.release(pluginID)
	}
	return err
}

// statsLocked returns pluginID's record, creating it while there is room.
func (l *controllerLanes) statsLocked(pluginID string) *laneStats {
	st, ok := l.stats[pluginID]
	if !ok && len(l.stats) < maxLaneStats {
		st = &laneStats{}
		l.stats[pluginID] = st
	}
	return st
}

func (l *controllerLanes) callStarted(pluginID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if st := l.statsLocked(pluginID); st != nil {
		st.inFlight++
	}
}

func (l *controllerLanes) callDone(pluginID string, call structs.CSILaneCall) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.statsLocked(pluginID)
	if st == nil {
		return
	}
	st.inFlight--
	st.calls++
	if call.TimedOut {
		// Counted with the call's record, not in the deadline's callback,
		// which may run a moment after the call returns: the two agree.
		st.timeouts++
	}
	if len(st.recent) < structs.CSILaneRecentCalls {
		st.recent = append(st.recent, call)
		return
	}
	st.recent[st.next] = call
	st.next = (st.next + 1) % len(st.recent)
}

// Stats returns every recorded lane, sorted by plugin ID.
func (l *controllerLanes) Stats() []*structs.CSILaneStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*structs.CSILaneStats, 0, len(l.stats))
	for id, st := range l.stats {
		ls := &structs.CSILaneStats{
			PluginID: id, InFlight: st.inFlight, Calls: st.calls, Timeouts: st.timeouts,
			Recent: make([]structs.CSILaneCall, 0, len(st.recent)),
		}
		if ln, ok := l.lanes[id]; ok {
			ls.Depth = len(ln.waiters)
		}
		ls.Recent = append(ls.Recent, st.recent[st.next:]...)
		ls.Recent = append(ls.Recent, st.recent[:st.next]...)
		out = append(out, ls)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PluginID < out[j].PluginID })
	return out
}

// waitIdle waits until no call is running, or ctx ends. It returns how many
// calls were running when it began. With the parent ended no new call
// starts, so this is how a departing leader lets in-flight controller
// calls finish.
func (l *controllerLanes) waitIdle(ctx context.Context) (int, error) {
	return l.running.waitIdle(ctx)
}

// Depth is the number of callers waiting in pluginID's lane, not counting
// the running call.
func (l *controllerLanes) Depth(pluginID string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ln, ok := l.lanes[pluginID]; ok {
		return len(ln.waiters)
	}
	return 0
}

// wait returns nil once the caller holds pluginID's lane, counted as
// running. The lane is granted and counted under l.mu, after checking the
// parent there: once the parent has ended and waitIdle has seen no call
// running, no call starts.
func (l *controllerLanes) wait(ctx context.Context, pluginID, op string) error {
	if err := l.parent.Err(); err != nil {
		return l.noLeader(pluginID, op, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("csi plugin %q: %s: %w", pluginID, op, err)
	}

	start := time.Now()
	l.mu.Lock()
	if err := l.parent.Err(); err != nil {
		l.mu.Unlock()
		return l.noLeader(pluginID, op, err)
	}
	ln, busy := l.lanes[pluginID]
	if !busy {
		l.lanes[pluginID] = &lane{}
		l.running.add()
		l.mu.Unlock()
		metrics.MeasureSinceWithLabels([]string{"csi", "lane", "wait"}, start, pluginLabels(pluginID))
		return nil
	}
	w := &laneWaiter{ready: make(chan struct{})}
	ln.waiters = append(ln.waiters, w)
	l.setDepthLocked(pluginID, ln)
	l.mu.Unlock()
	l.logger.Debug("waiting for lane", "plugin_id", pluginID, "op", op)

	var cause error
	select {
	case <-w.ready:
		// The parent may have ended at the same moment; no new call starts
		// after it has.
		l.mu.Lock()
		if err := l.parent.Err(); err != nil {
			l.releaseLocked(pluginID)
			l.mu.Unlock()
			return l.noLeader(pluginID, op, err)
		}
		l.running.add()
		l.mu.Unlock()
		metrics.MeasureSinceWithLabels([]string{"csi", "lane", "wait"}, start, pluginLabels(pluginID))
		l.logger.Debug("lane acquired", "plugin_id", pluginID, "op", op, "waited", time.Since(start))
		return nil
	case <-ctx.Done():
		cause = fmt.Errorf("csi plugin %q: %s: %w", pluginID, op, ctx.Err())
	case <-l.parent.Done():
		cause = l.noLeader(pluginID, op, l.parent.Err())
	}

	l.mu.Lock()
	if w.granted {
		// Handed the lane between the select and the lock: pass it on.
		l.releaseLocked(pluginID)
	} else {
		l.removeWaiterLocked(pluginID, w)
	}
	l.mu.Unlock()
	metrics.MeasureSinceWithLabels([]string{"csi", "lane", "wait"}, start, pluginLabels(pluginID))
	l.logger.Debug("left lane without running", "plugin_id", pluginID, "op", op, "error", cause)
	return cause
}

// release hands pluginID's lane to its first waiter, or frees it.
func (l *controllerLanes) release(pluginID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(pluginID)
}

func (l *controllerLanes) releaseLocked(pluginID string) {
	ln, ok := l.lanes[pluginID]
	if !ok {
		panic(fmt.Sprintf("csi lane %q released while not held", pluginID))
	}
	if len(ln.waiters) == 0 {
		delete(l.lanes, pluginID)
		l.setDepthLocked(pluginID, nil)
		return
	}
	next := ln.waiters[0]
	ln.waiters[0] = nil
	ln.waiters = ln.waiters[1:]
	next.granted = true
	close(next.ready)
	l.setDepthLocked(pluginID, ln)
}

func (l *controllerLanes) removeWaiterLocked(pluginID string, w *laneWaiter) {
	ln, ok := l.lanes[pluginID]
	if !ok {
		return
	}
	for i, x := range ln.waiters {
		if x == w {
			ln.waiters = append(ln.waiters[:i], ln.waiters[i+1:]...)
			break
		}
	}
	l.setDepthLocked(pluginID, ln)
}

// setDepthLocked publishes the queue depth; it is set under the lock so
// that successive values cannot be reordered.
func (l *controllerLanes) setDepthLocked(pluginID string, ln *lane) {
	depth := 0
	if ln != nil {
		depth = len(ln.waiters)
	}
	metrics.SetGaugeWithLabels([]string{"csi", "lane", "depth"}, float32(depth), pluginLabels(pluginID))
}

func (l *controllerLanes) noLeader(pluginID, op string, cause error) error {
	return fmt.Errorf("csi plugin %q: %s: lanes closed (%v): %w", pluginID, op, cause, structs.ErrNoLeader)
}

func pluginLabels(pluginID string) []metrics.Label {
	return []metrics.Label{{Name: "plugin", Value: pluginID}}
}
