package nomad

import (
	"context"
	"errors"
	"fmt"
	"time"

	metrics "github.com/hashicorp/go-metrics"
)

// handoff ends this server's term on purpose: it stops admitting new
// destructive controller calls (their callers get a retryable
// ErrNoLeader), waits for the ones in flight, bounded by
// LeaveDrainTimeout, then transfers leadership to an up-to-date voter and
// waits until a new leader is known. A single server, or a follower, has
// nothing to hand over.
func (s *Server) handoff(ctx context.Context) error {
	if !s.IsLeader() {
		return nil
	}
	start := time.Now()
	s.logger.Info("leadership handoff started")
	metrics.IncrCounter([]string{"leader", "handoff", "started"}, 1)

	// Ending the leader's term ends its duties and closes the lanes to new
	// callers; calls already running keep their own deadline and finish.
	lanes := s.lanes.Load()
	s.revokeLeadership()
	if lanes != nil {
		dctx, cancel := context.WithTimeout(ctx, s.config.LeaveDrainTimeout)
		n, err := lanes.waitIdle(dctx)
		cancel()
		took := time.Since(start)
		metrics.SetGauge([]string{"leader", "handoff", "drained_calls"}, float32(n))
		metrics.MeasureSince([]string{"leader", "handoff", "drain"}, start)
		if err != nil {
			s.logger.Warn("in-flight controller calls did not finish before the drain timeout; handing over anyway",
				"calls", n, "waited", took, "error", err)
		} else {
			s.logger.Info("in-flight controller calls drained", "calls", n, "took", took)
		}
	}

	tctx, cancel := context.WithTimeout(ctx, s.config.RPCHoldTimeout)
	defer cancel()
	id, addr, err := s.transferLeadership(tctx, "", "")
	if errors.Is(err, errNoTransferTarget) {
		s.logger.Info("no other voter to hand leadership to")
		return nil
	}
	if err != nil {
		return fmt.Errorf("leadership handoff: %w", err)
	}
	metrics.MeasureSince([]string{"leader", "handoff", "total"}, start)
	s.logger.Info("leadership handed over", "new_leader_id", id, "new_leader_addr", addr, "took", time.Since(start))
	return nil
}
