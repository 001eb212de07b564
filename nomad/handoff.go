package nomad

import (
	"context"
	"errors"
	"fmt"
	"time"

	metrics "github.com/hashicorp/go-metrics"
	"github.com/hashicorp/raft"

	"github.com/roamhq/roam/structs"
)

// handoff ends this server's term on purpose. Every such path goes through
// it: a signal (Shutdown), `operator raft transfer-leadership`, an
// embedding program's Shutdown, a leader duty that cannot run. It stops
// admitting new destructive controller calls (their callers get a
// retryable ErrNoLeader), waits for the ones in flight, bounded by
// LeaveDrainTimeout, then transfers leadership to the named voter (or the
// most up-to-date one) and waits until a new leader is known.
//
// When the transfer fails and this server still leads, its duties start
// again if resume is set (the operator command: the server stays up), so a
// failed handoff never leaves a leader without its duties. A follower has
// nothing to hand over and gets ErrNoLeader; a lone voter gets
// errNoTransferTarget before anything is stopped.
//
// It runs in the caller's goroutine, never in the leadership owner's: it
// claims the duties from the owner, asks it to stop them, and releases
// them when done, and Raft's notifications are read meanwhile.
func (s *Server) handoff(ctx context.Context, peerID, peerAddr string, resume bool) (h handedOver, err error) {
	// A second handoff (a signal during the operator's) waits for the
	// first, then finds this server a follower.
	if err := s.claimLeadership(ctx); err != nil {
		return h, err
	}
	if !s.IsLeader() {
		s.releaseLeadership(ctx, false, false)
		return h, structs.ErrNoLeader
	}
	target, err := s.transferTarget(peerID, peerAddr)
	if err != nil {
		s.releaseLeadership(ctx, false, false)
		return h, err
	}
	start := time.Now()
	s.logger.Info("leadership handoff started", "target", transferTargetName(target))
	metrics.IncrCounter([]string{"leader", "handoff", "started"}, 1)

	// Ending the leader's duties closes the lanes to new callers (and holds
	// new requests until the next leader is known); calls already running
	// keep their own deadline and finish, and so do the claim transitions
	// around them, up to their Raft checkpoint. A checkpoint left for after
	// the transfer would be refused, and the next leader would redo a
	// publish that already happened.
	clock := newStepClock(handoffGauge, start)
	t, err := s.stopDuties(ctx)
	if err != nil {
		s.releaseLeadership(ctx, false, false)
		return h, fmt.Errorf("leadership handoff: %w", err)
	}
	s.stopAndDrain(ctx, start, t, clock)
	// Followers learn of the last write now rather than at the next
	// heartbeat, so the new leader's leaderless gap starts when this
	// leader stopped, not up to a heartbeat earlier.
	if err := s.waitFuture(s.raft.Barrier(s.config.RPCHoldTimeout)); err != nil {
		s.logger.Warn("barrier before transfer failed", "error", err)
	}
	clock.step(stepBarrier)

	tctx, cancel := context.WithTimeout(ctx, s.config.RPCHoldTimeout)
	defer cancel()
	h.LastIndex = s.raft.LastIndex()
	h.ID, h.Addr, err = s.transferLeadership(tctx, target)
	clock.step(stepTransfer)
	if err != nil {
		err = fmt.Errorf("leadership handoff: %w", err)
		restart := resume && s.IsLeader()
		if restart {
			s.logger.Error("handoff failed; this server still leads and resumes its duties", "error", err)
		}
		s.releaseLeadership(ctx, restart, false)
		return h, err
	}
	// Should Raft have made this server leader again meanwhile, its duties
	// start: a leader is never left without them.
	s.releaseLeadership(ctx, true, false)
	metrics.MeasureSince([]string{"leader", "handoff", "total"}, start)
	setMillis(handoffGauge(stepTotal), time.Since(start))
	// Last, so that whoever sees the count move reads this handoff's gauges.
	metrics.IncrCounter(metricHandoffDone, 1)
	s.logger.Info("leadership handed over", "new_leader_id", h.ID, "new_leader_addr", h.Addr, "took", time.Since(start))
	return h, nil
}

// lingerAfterHandoff bounds how long a server shutting down after a
// handoff keeps Raft running for the new leader's first commit: a few of
// Raft's commit timeouts (50 to 100 ms each).
const lingerAfterHandoff = 500 * time.Millisecond

// handedOver is what a handoff that succeeded leaves: the new leader, and
// the last index of this server's log when it asked for the transfer, so
// every later entry is the new leader's.
type handedOver struct {
	ID, Addr  string
	LastIndex uint64
}

// awaitNextTermCommit keeps a server that has just handed leadership over
// in the cluster until it learns that an entry after its own last one is
// committed, that is, until the new leader has committed its first
// writes, or until bound passes. The server that just voted for the new
// leader is the one whose vote and connections are warm: if it shut Raft
// down at once, the new leader's first write (its barrier before duties)
// would have to wait for the third server, which may still be voting and
// has no connection from it yet. It reports whether the commit was seen.
//
// Raft tells a follower of commits only in the leader's next message, so
// this returns up to a commit timeout after the new leader's barrier; it
// delays the old server's exit by that much, not the new leader's duties.
func (s *Server) awaitNextTermCommit(ctx context.Context, after uint64, bound time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		if s.raft.CommitIndex() > after {
			return true
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return false
		}
	}
}

// stopAndDrain waits, bounded by LeaveDrainTimeout, for term t (stopped by
// the caller; nil if none) to end its goroutines, then for the controller
// calls in its lanes and the claim transitions around them to finish.
// clock, if set, times the two waits as the handoff's revoke and drain.
func (s *Server) stopAndDrain(ctx context.Context, start time.Time, t *leaderTerm, clock *stepClock) {
	dctx, cancel := context.WithTimeout(ctx, s.config.LeaveDrainTimeout)
	defer cancel()
	if err := waitStopped(dctx, t); err != nil {
		s.logger.Warn("leader duties did not all stop before the drain timeout; draining anyway", "error", err)
	}
	if clock != nil {
		clock.step(stepRevoke)
	}
	var lanes *controllerLanes
	if t != nil {
		lanes = t.lanes
	}
	s.drainInFlight(dctx, start, lanes)
	if clock != nil {
		clock.step(stepDrain)
	}
}

// drainInFlight waits, bounded by dctx, for the controller calls in lanes
// and the claim transitions around them to finish.
func (s *Server) drainInFlight(dctx context.Context, start time.Time, lanes *controllerLanes) {
	var calls int
	var err error
	if lanes != nil {
		calls, err = lanes.waitIdle(dctx)
	}
	transitions, cerr := s.claims.waitIdle(dctx)
	err = errors.Join(err, cerr)
	took := time.Since(start)
	metrics.SetGauge([]string{"leader", "handoff", "drained_calls"}, float32(calls))
	metrics.SetGauge([]string{"leader", "handoff", "drained_claims"}, float32(transitions))
	metrics.MeasureSince([]string{"leader", "handoff", "drain"}, start)
	if err != nil {
		s.logger.Warn("in-flight controller calls did not finish before the drain timeout; handing over anyway",
			"calls", calls, "claim_transitions", transitions, "waited", took, "error", err)
		return
	}
	s.logger.Info("in-flight controller calls drained", "calls", calls, "claim_transitions", transitions, "took", took)
}

// errNoTransferTarget means there is no other voter to hand leadership to.
var errNoTransferTarget = fmt.Errorf("%w: no other voter to transfer leadership to", structs.ErrInvalidRequest)

// transferTarget checks that there is a voter to hand leadership to and
// returns the one named by ID or address, or nil to let Raft pick the most
// up-to-date voter.
func (s *Server) transferTarget(peerID, peerAddr string) (*raft.Server, error) {
	cfg, _, err := s.raftConfiguration()
	if err != nil {
		return nil, err
	}
	var target *raft.Server
	voters := 0
	for i := range cfg.Servers {
		srv := &cfg.Servers[i]
		if srv.ID == raft.ServerID(s.config.NodeID) || srv.Suffrage != raft.Voter {
			continue
		}
		voters++
		if (peerID != "" && string(srv.ID) == peerID) || (peerID == "" && peerAddr != "" && string(srv.Address) == peerAddr) {
			target = srv
		}
	}
	if voters == 0 {
		return nil, errNoTransferTarget
	}
	if (peerID != "" || peerAddr != "") && target == nil {
		return nil, fmt.Errorf("%w: no other voter with id %q address %q", structs.ErrNotFound, peerID, peerAddr)
	}
	return target, nil
}

func transferTargetName(target *raft.Server) string {
	if target == nil {
		return "most up-to-date voter"
	}
	return string(target.ID)
}

// transferLeadership asks Raft to hand over to target (nil: the best
// voter) and waits until this server sees another leader.
func (s *Server) transferLeadership(ctx context.Context, target *raft.Server) (string, string, error) {
	var f raft.Future
	if target != nil {
		f = s.raft.LeadershipTransferToServer(target.ID, target.Address)
	} else {
		f = s.raft.LeadershipTransfer()
	}
	// A transfer already under way (a duty that failed as the operator
	// asked) ends the same way: wait for the new leader.
	if err := f.Error(); err != nil && !errors.Is(err, raft.ErrLeadershipTransferInProgress) {
		return "", "", fmt.Errorf("leadership transfer: %w", err)
	}
	for {
		changed := s.leaderChanged()
		addr, id := s.Leader()
		if id != "" && id != s.config.NodeID {
			return id, addr, nil
		}
		// Leader observations are not guaranteed (Raft drops them when no
		// one is reading), so look again now and then as well.
		select {
		case <-changed:
		case <-time.After(25 * time.Millisecond):
		case <-ctx.Done():
			return "", "", fmt.Errorf("waiting for the new leader: %w", ctx.Err())
		}
	}
}

// leave removes this server from the Raft configuration by asking the
// leader, which after a handoff is another server. Used on shutdown when
// leave_on_terminate is set.
func (s *Server) leave(ctx context.Context) error {
	if s.IsLeader() {
		return errors.New("leave: this server still leads; hand leadership over first")
	}
	req := structs.RaftPeerRequest{ID: s.config.NodeID}
	req.Region = s.config.Region
	var resp structs.GenericResponse
	for {
		done, err := s.forward("Operator.RaftRemovePeerByID", &req, &req, &resp)
		if !done {
			return errors.New("leave: this server still leads; hand leadership over first")
		}
		if err == nil {
			s.logger.Info("left the raft configuration")
			return nil
		}
		if !structs.IsRetryable(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("leave: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
