package nomad

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	metrics "github.com/hashicorp/go-metrics"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/structs"
)

// defaultLaneCallTimeout bounds one controller call when newControllerLanes
// is given no positive timeout.
const defaultLaneCallTimeout = 2 * time.Minute

// controllerLanes is the leader's serializer for destructive CSI controller
// calls: one lane per plugin ID, in memory. By default a plugin's calls run
// one at a time in arrival order; a plugin that accepts N at once (its
// controller_concurrency) runs up to N, never two on one volume nor two
// publish/unpublish calls for one node, each volume's and each node's calls
// in arrival order (laneadmit.Admit decides). Calls for different plugins
// never wait for each other.
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
	// warned is, by plugin ID, the last controller_concurrency warning
	// logged; at most maxLaneStats plugins.
	warned map[string]string
	// sending is, by plugin ID, where the plugin's calls are in flight
	// (see enterNode); only plugins with a call in flight.
	sending map[string]sendingTo
}

// maxLaneStats bounds how many plugins' lane stats a leader keeps; a
// plugin beyond it is not recorded (its lane works the same).
const maxLaneStats = 1024

// laneStats is one plugin's record; guarded by controllerLanes.mu.
type laneStats struct {
	// limit is the lane's limit as its latest call gave it.
	limit    int
	inFlight int
	calls    uint64
	timeouts uint64
	// recent is a ring of the latest finished calls; next is where the
	// next one goes.
	recent []structs.CSILaneCall
	next   int
}

// lane is one plugin's queue. Invariants (under controllerLanes.mu): a lane
// in the map has a call running or waiting; every change to running,
// waiters or limit is followed by an admission, so no waiter that
// laneadmit.Admit would start is left waiting.
type lane struct {
	// limit is how many calls may run at once, as the latest caller gave
	// it (the plugin's controller_concurrency).
	limit   int
	running []*laneTicket
	waiters []*laneTicket
}

// laneTicket is one caller's place in a lane. ready is closed, with
// granted set under the lock, when the call may start.
type laneTicket struct {
	op      string
	key     laneadmit.Call
	ready   chan struct{}
	granted bool
}

// laneRequest is one call's place in its plugin's lane.
type laneRequest struct {
	PluginID string
	// Op names the call for logs and stats: publish, unpublish, ...
	Op string
	// Key is the volume, and for publish and unpublish the target node,
	// that no other call of the lane may act on at the same time.
	Key laneadmit.Call
	// Limit is the plugin's controller_concurrency; below 1 counts as 1.
	Limit int
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
		warned:      make(map[string]string),
		sending:     make(map[string]sendingTo),
	}
}

// firstWarning reports whether warning is new for pluginID (so the caller
// logs it), and remembers it.
func (l *controllerLanes) firstWarning(pluginID, warning string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.warned[pluginID] == warning {
		return false
	}
	if _, ok := l.warned[pluginID]; !ok && len(l.warned) >= maxLaneStats {
		return false
	}
	l.warned[pluginID] = warning
	return true
}

// Call waits for a place in req's plugin lane, runs fn there and returns
// fn's error.
//
// While waiting: if the parent context ends, Call returns an error wrapping
// structs.ErrNoLeader (the client retries against the new leader); if ctx
// ends, the caller leaves the queue, the others keep their order, and Call
// returns ctx.Err() wrapped. Neither ever starts fn.
//
// fn's context is ctx without its cancellation, plus a deadline of
// callTimeout. A controller call already sent must finish: cutting it when
// the caller gives up or the leader steps down could leave a volume half
// attached (see DESIGN, "The serializer"). The deadline keeps one hung
// plugin from blocking its lane forever: when it passes, the call's place
// goes to the next caller even if fn has not returned (logged, and counted
// as csi.lane.timeout). Call itself still returns only when fn does.
func (l *controllerLanes) Call(ctx context.Context, req laneRequest, fn func(ctx context.Context) error) error {
	pluginID, op := req.PluginID, req.Op
	t, err := l.wait(ctx, req)
	if err != nil {
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
	// the call's place: stop() reports true only if the callback will
	// never run.
	timedOut := context.AfterFunc(callCtx, func() {
		metrics.IncrCounterWithLabels([]string{"csi", "lane", "timeout"}, 1, pluginLabels(pluginID))
		l.logger.Warn("controller call passed its deadline; releasing lane to the next caller",
			"plugin_id", pluginID, "op", op, "timeout", l.callTimeout)
		l.release(pluginID, t)
	})
	err = fn(callCtx)
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
		l.release(pluginID, t)
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
			PluginID: id, Limit: st.limit, InFlight: st.inFlight, Calls: st.calls, Timeouts: st.timeouts,
			Recent: make([]structs.CSILaneCall, 0, len(st.recent)),
		}
		if ln, ok := l.lanes[id]; ok {
			ls.Depth = len(ln.waiters)
			ls.Running = laneKeysShown(ln.running, len(ln.running))
			ls.Queued = laneKeysShown(ln.waiters, structs.CSILaneKeysShown)
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
// the calls running.
func (l *controllerLanes) Depth(pluginID string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ln, ok := l.lanes[pluginID]; ok {
		return len(ln.waiters)
	}
	return 0
}

// wait returns the caller's ticket once its call may start, counted as
// running. The call is granted and counted under l.mu, after checking the
// parent there: once the parent has ended and waitIdle has seen no call
// running, no call starts.
func (l *controllerLanes) wait(ctx context.Context, req laneRequest) (*laneTicket, error) {
	pluginID, op := req.PluginID, req.Op
	if err := l.parent.Err(); err != nil {
		return nil, l.noLeader(pluginID, op, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("csi plugin %q: %s: %w", pluginID, op, err)
	}

	start := time.Now()
	t := &laneTicket{op: op, key: req.Key, ready: make(chan struct{})}
	l.mu.Lock()
	if err := l.parent.Err(); err != nil {
		l.mu.Unlock()
		return nil, l.noLeader(pluginID, op, err)
	}
	ln, ok := l.lanes[pluginID]
	if !ok {
		ln = &lane{}
		l.lanes[pluginID] = ln
	}
	ln.limit = req.Limit
	if st := l.statsLocked(pluginID); st != nil {
		st.limit = max(1, req.Limit)
	}
	ln.waiters = append(ln.waiters, t)
	l.admitLocked(pluginID, ln)
	if t.granted {
		l.running.add()
		l.mu.Unlock()
		metrics.MeasureSinceWithLabels([]string{"csi", "lane", "wait"}, start, pluginLabels(pluginID))
		return t, nil
	}
	l.mu.Unlock()
	l.logger.Debug("waiting for lane", "plugin_id", pluginID, "op", op)

	var cause error
	select {
	case <-t.ready:
		// The parent may have ended at the same moment; no new call starts
		// after it has.
		l.mu.Lock()
		if err := l.parent.Err(); err != nil {
			l.releaseLocked(pluginID, t)
			l.mu.Unlock()
			return nil, l.noLeader(pluginID, op, err)
		}
		l.running.add()
		l.mu.Unlock()
		metrics.MeasureSinceWithLabels([]string{"csi", "lane", "wait"}, start, pluginLabels(pluginID))
		l.logger.Debug("lane acquired", "plugin_id", pluginID, "op", op, "waited", time.Since(start))
		return t, nil
	case <-ctx.Done():
		cause = fmt.Errorf("csi plugin %q: %s: %w", pluginID, op, ctx.Err())
	case <-l.parent.Done():
		cause = l.noLeader(pluginID, op, l.parent.Err())
	}

	l.mu.Lock()
	// Granted between the select and the lock, or not: either way the
	// ticket leaves, and what it held or blocked may now start.
	l.releaseLocked(pluginID, t)
	l.mu.Unlock()
	metrics.MeasureSinceWithLabels([]string{"csi", "lane", "wait"}, start, pluginLabels(pluginID))
	l.logger.Debug("left lane without running", "plugin_id", pluginID, "op", op, "error", cause)
	return nil, cause
}

// release gives up t's place in pluginID's lane, running or waiting, and
// starts what may start after it.
func (l *controllerLanes) release(pluginID string, t *laneTicket) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(pluginID, t)
}

func (l *controllerLanes) releaseLocked(pluginID string, t *laneTicket) {
	ln, ok := l.lanes[pluginID]
	if !ok {
		panic(fmt.Sprintf("csi lane %q released while not held", pluginID))
	}
	list := &ln.waiters
	if t.granted {
		list = &ln.running
	}
	i := slices.Index(*list, t)
	if i < 0 {
		panic(fmt.Sprintf("csi lane %q: %s released twice", pluginID, t.op))
	}
	*list = slices.Delete(*list, i, i+1)
	if len(ln.running) == 0 && len(ln.waiters) == 0 {
		delete(l.lanes, pluginID)
		l.setDepthLocked(pluginID, nil)
		return
	}
	l.admitLocked(pluginID, ln)
}

// admitLocked starts every waiter of ln that laneadmit.Admit lets start.
func (l *controllerLanes) admitLocked(pluginID string, ln *lane) {
	start := laneadmit.Admit(laneKeys(ln.running), laneKeys(ln.waiters), ln.limit)
	if len(start) > 0 {
		kept := ln.waiters[:0]
		next := 0
		for i, w := range ln.waiters {
			if next < len(start) && start[next] == i {
				next++
				w.granted = true
				ln.running = append(ln.running, w)
				close(w.ready)
				continue
			}
			kept = append(kept, w)
		}
		clear(ln.waiters[len(kept):])
		ln.waiters = kept
	}
	l.setDepthLocked(pluginID, ln)
}

// laneKeysShown lists the first n of ts for operators.
func laneKeysShown(ts []*laneTicket, n int) []structs.CSILaneKey {
	if len(ts) == 0 {
		return nil
	}
	out := make([]structs.CSILaneKey, 0, min(n, len(ts)))
	for _, t := range ts[:min(n, len(ts))] {
		out = append(out, structs.CSILaneKey{Op: t.op, Volume: t.key.Volume, Node: t.key.Node})
	}
	return out
}

func laneKeys(ts []*laneTicket) []laneadmit.Call {
	keys := make([]laneadmit.Call, len(ts))
	for i, t := range ts {
		keys[i] = t.key
	}
	return keys
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
