package nomad

import (
	"context"
	"fmt"
	"sync"
	"time"

	metrics "github.com/hashicorp/go-metrics"
	"github.com/roamhq/roam/structs"
)

// heartbeater keeps one timer per live node on the leader. A node that does
// not heartbeat within its TTL plus the grace is marked down.
type heartbeater struct {
	srv *Server

	mu sync.Mutex
	// timers is nil when this server is not leading.
	timers  map[string]*time.Timer
	expired chan string
	ctx     context.Context
}

func newHeartbeater(s *Server) *heartbeater { return &heartbeater{srv: s} }

// start makes the timers ready for heartbeats (reset) and starts the loop
// that marks expired nodes down. It reads no state, so it is cheap on a
// new leader's critical path; armKnown then arms the nodes already known.
func (h *heartbeater) start(ctx context.Context, wg *sync.WaitGroup) {
	h.mu.Lock()
	h.timers = make(map[string]*time.Timer)
	h.expired = make(chan string, 64)
	h.ctx = ctx
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
	ttl := h.srv.config.FailoverHeartbeatTTL + h.srv.config.HeartbeatGrace
	for _, n := range nodes {
		if _, ok := h.timers[n.ID]; !ok && n.Status != structs.NodeStatusDown {
			h.armLocked(n.ID, ttl)
		}
	}
	return nil
}

// stop disarms every timer.
func (h *heartbeater) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range h.timers {
		t.Stop()
	}
	h.timers = nil
	h.ctx = nil
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
	h.armLocked(nodeID, ttl+cfg.HeartbeatGrace)
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
		t.Stop()
		delete(h.timers, nodeID)
	}
}

// count returns the number of armed timers.
func (h *heartbeater) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.timers)
}

func (h *heartbeater) armLocked(nodeID string, d time.Duration) {
	if t, ok := h.timers[nodeID]; ok {
		t.Stop()
	}
	ctx, expired := h.ctx, h.expired
	var timer *time.Timer
	timer = time.AfterFunc(d, func() {
		h.mu.Lock()
		current := h.timers[nodeID] == timer
		if current {
			delete(h.timers, nodeID)
		}
		h.mu.Unlock()
		if !current {
			return // re-armed or stopped meanwhile
		}
		select {
		case expired <- nodeID:
		case <-ctx.Done():
		}
	})
	h.timers[nodeID] = timer
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
