package nomad

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	metrics "github.com/hashicorp/go-metrics"

	"github.com/roamhq/roam/nomad/heartbeatlag"
	"github.com/roamhq/roam/structs"
)

// heartbeater keeps one timer per live node on the leader. A node that does
// not heartbeat within its TTL plus the grace is marked down, unless the
// leader is behind on heartbeats (heartbeatlag): then its TTL is extended
// first, a bounded number of times.
type heartbeater struct {
	srv *Server

	mu sync.Mutex
	// timers is nil when this server is not leading.
	timers  map[string]*nodeTimer
	expired chan string
	ctx     context.Context
	// lag counts the heartbeats answered lately, and the late ones.
	lag *heartbeatlag.Counter
	// extensions counts the TTLs extended because the leader was behind.
	extensions atomic.Int64
}

// nodeTimer is one node's timer: when its TTL ends (the grace follows),
// and how often it was extended since the node's last heartbeat.
type nodeTimer struct {
	timer      *time.Timer
	ttlEnd     time.Time
	extensions int
}

// lagSpan is the window over which the leader judges whether it is behind
// on heartbeats: at least the failover TTL and grace, in which every live
// client heartbeats after a leader change.
func lagSpan(c *Config) time.Duration {
	return max(c.FailoverHeartbeatTTL+c.HeartbeatGrace, 10*time.Second)
}

func newHeartbeater(s *Server) *heartbeater { return &heartbeater{srv: s} }

// start makes the timers ready for heartbeats (reset) and starts the loop
// that marks expired nodes down. It reads no state, so it is cheap on a
// new leader's critical path; armKnown then arms the nodes already known.
func (h *heartbeater) start(ctx context.Context, wg *sync.WaitGroup) {
	h.mu.Lock()
	h.timers = make(map[string]*nodeTimer)
	h.expired = make(chan string, 64)
	h.ctx = ctx
	h.lag = heartbeatlag.NewCounter(lagSpan(h.srv.config))
	expired := h.expired
	h.mu.Unlock()

	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case id := <-expired:
				h.srv.markNodeDown(id)
			case <-ctx.Done():
				return
			}
		}
	}()
}

// armKnown arms a timer with the failover TTL for every node not already
// down and not already armed by a heartbeat since start, so a client that
// died while there was no leader is still caught within
// FailoverHeartbeatTTL + HeartbeatGrace. ctx is the term start was given:
// once that term has ended it does nothing.
func (h *heartbeater) armKnown(ctx context.Context) error {
	nodes, err := h.srv.State().Nodes(nil)
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.timers == nil || h.ctx != ctx {
		return nil
	}
	cfg := h.srv.config
	for _, n := range nodes {
		if _, ok := h.timers[n.ID]; !ok && n.Status != structs.NodeStatusDown {
			h.armLocked(n.ID, cfg.FailoverHeartbeatTTL, cfg.HeartbeatGrace, 0)
		}
	}
	return nil
}

// stop disarms every timer.
func (h *heartbeater) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range h.timers {
		t.timer.Stop()
	}
	h.timers = nil
	h.ctx = nil
	h.lag = nil
}

// reset re-arms nodeID's timer and returns the TTL to hand the client.
func (h *heartbeater) reset(nodeID string) (time.Duration, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.timers == nil {
		return 0, fmt.Errorf("%w: heartbeat timers are not running", structs.ErrNoLeader)
	}
	cfg := h.srv.config
	base := time.Duration(float64(len(h.timers)) / cfg.MaxHeartbeatsPerSecond * float64(time.Second))
	if base < cfg.MinHeartbeatTTL {
		base = cfg.MinHeartbeatTTL
	}
	ttl := jitter(base, 4)
	// A heartbeat answered after the TTL it was given had run came late:
	// the client heartbeats halfway through it.
	now := time.Now()
	if t, ok := h.timers[nodeID]; ok {
		late := now.After(t.ttlEnd)
		h.lag.Add(now, late)
		if late {
			metrics.IncrCounter([]string{"heartbeat", "late"}, 1)
		}
	}
	h.armLocked(nodeID, ttl, cfg.HeartbeatGrace, 0)
	metrics.IncrCounter([]string{"heartbeat", "reset"}, 1)
	metrics.SetGauge([]string{"heartbeat", "active"}, float32(len(h.timers)))
	return ttl, nil
}

// running reports whether the timers are armed (this server has finished
// establishing leadership).
func (h *heartbeater) running() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.timers != nil
}

// clear forgets nodeID's timer (the node is down or gone).
func (h *heartbeater) clear(nodeID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if t, ok := h.timers[nodeID]; ok {
		t.timer.Stop()
		delete(h.timers, nodeID)
	}
}

// count returns the number of armed timers.
func (h *heartbeater) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.timers)
}

// armLocked arms nodeID's timer for ttl and grace; extensions is how often
// its TTL was already extended since the node's last heartbeat.
func (h *heartbeater) armLocked(nodeID string, ttl, grace time.Duration, extensions int) {
	if t, ok := h.timers[nodeID]; ok {
		t.timer.Stop()
	}
	ctx, expired := h.ctx, h.expired
	nt := &nodeTimer{ttlEnd: time.Now().Add(ttl), extensions: extensions}
	nt.timer = time.AfterFunc(ttl+grace, func() { h.expire(ctx, expired, nodeID, nt) })
	h.timers[nodeID] = nt
}

// expire runs when nt, nodeID's timer, runs out: the node is sent to be
// marked down, or, while this leader is behind on heartbeats, its TTL is
// extended by the failover TTL (heartbeatlag.Decide).
func (h *heartbeater) expire(ctx context.Context, expired chan<- string, nodeID string, nt *nodeTimer) {
	h.mu.Lock()
	if h.timers[nodeID] != nt {
		h.mu.Unlock()
		return // re-armed or stopped meanwhile
	}
	w := h.lag.Window(time.Now())
	verdict := heartbeatlag.Decide(w, nt.extensions)
	if verdict == heartbeatlag.Extend {
		cfg := h.srv.config
		h.armLocked(nodeID, cfg.FailoverHeartbeatTTL, cfg.HeartbeatGrace, nt.extensions+1)
	} else {
		delete(h.timers, nodeID)
	}
	h.mu.Unlock()
	if verdict == heartbeatlag.Extend {
		h.extensions.Add(1)
		metrics.IncrCounter([]string{"heartbeat", "extended"}, 1)
		h.srv.logger.Warn("node's heartbeat timer ran out while this leader is behind on heartbeats; its TTL is extended",
			"node_id", nodeID, "extension", nt.extensions+1, "of", heartbeatlag.MaxExtensions,
			"late", w.Late, "answered", w.Answered, "window", lagSpan(h.srv.config))
		return
	}
	select {
	case expired <- nodeID:
	case <-ctx.Done():
	}
}

// armed reports whether nodeID has a live timer: a heartbeat arrived after
// the timer fired.
func (h *heartbeater) armed(nodeID string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.timers[nodeID]
	return ok
}

// markNodeDown records that nodeID missed its heartbeat, unless a
// heartbeat re-armed its timer since it fired.
func (s *Server) markNodeDown(nodeID string) {
	node, err := s.State().NodeByID(nil, nodeID)
	if err != nil || node == nil || node.Status == structs.NodeStatusDown || s.heartbeats.armed(nodeID) {
		return
	}
	evals, err := s.evalsForNode(nodeID, structs.EvalTriggerNodeUpdate)
	if err != nil {
		s.logger.Error("failed to build evaluations for a down node", "node_id", nodeID, "error", err)
	}
	req := structs.NodeUpdateStatusRequest{
		NodeID:    nodeID,
		Status:    structs.NodeStatusDown,
		UpdatedAt: time.Now().Unix(),
		Evals:     evals,
	}
	if _, _, err := s.raftApply(structs.NodeUpdateStatusRequestType, &req); err != nil {
		s.logger.Error("failed to mark node down", "node_id", nodeID, "error", err)
		return
	}
	metrics.IncrCounter([]string{"heartbeat", "invalidate"}, 1)
	s.logger.Warn("node missed its heartbeat, marked down", "node_id", nodeID, "name", node.Name)
}
