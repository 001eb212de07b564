package nomad

import (
	"context"
	"errors"
	"fmt"
	"time"

	metrics "github.com/hashicorp/go-metrics"
	"github.com/hashicorp/raft"
)

// establishTerm is a new term's first step, run in the term's own
// goroutine: it waits until the previous term's duties have all returned
// (normally long since), then until the FSM has applied everything the
// previous leader committed, and reads (or, on a new cluster, writes) the
// cluster ID. It reports to the leadership owner, which opens the duties
// (openDuties). Nothing here holds a lock.
//
// Until the duties are open the cluster has no serving leader, so only
// what callers need goes first, and nothing on that path reads all of the
// state: the catch-up (at most one barrier), then the lanes (claims and
// controller calls), the heartbeat loop, the watcher, the broker and the
// drainer. Arming a timer
// for every known node and queueing the pending evaluations again follow
// in finishTakeover, once callers are served. Each step is a gauge (see
// leader_metrics.go).
func (s *Server) establishTerm(t *leaderTerm, prev <-chan struct{}) {
	s.logger.Info("cluster leadership acquired")
	ev := leaderEvent{kind: evEstablished, term: t}
	if prev != nil {
		// Two terms' duties never run at once. A duty of the previous term
		// that ignores its context (a long scheduler pass) must not keep
		// this server leading without duties: after the hold timeout, the
		// time a request waits for a leader, it hands over instead.
		hold := time.NewTimer(s.config.RPCHoldTimeout)
		select {
		case <-prev:
			hold.Stop()
		case <-hold.C:
			ev.err = fmt.Errorf("%w after %s", errPreviousTermRunning, s.config.RPCHoldTimeout)
			s.sendLeaderEvent(ev)
			return
		case <-t.ctx.Done():
			hold.Stop()
			return
		}
	}
	// The term this server leads in, read as the leadership starts: a
	// later term, should one begin, ends this one's context and its lanes.
	raftTerm := s.raft.CurrentTerm()
	if err := s.catchUp(t.ctx); err != nil {
		ev.err = fmt.Errorf("catching up after election: %w", err)
		s.sendLeaderEvent(ev)
		return
	}
	t.raftTerm = raftTerm
	t.clock.step(stepCaughtUp)
	// Before any duty starts. Once a leader serves, its cluster has an ID:
	// a read, except on a new cluster, where it is a Raft apply; should
	// that write fail, a duty retries it. Recording a known ID in the data
	// dir (a file written and synced) waits until the duties are open.
	ev.hasID = s.hasClusterID()
	if !ev.hasID {
		ev.clusterIDErr = s.writeClusterID()
	}
	t.clock.step(stepClusterID)
	s.sendLeaderEvent(ev)
}

// openDuties starts term t's duties under its context. Only the leadership
// owner calls it, once t's establishing step succeeded: it starts
// goroutines and stores the lanes, and waits on nothing.
func (s *Server) openDuties(t *leaderTerm, hasID bool, clusterIDErr error) {
	ctx, clock := t.ctx, t.clock
	switch {
	case hasID:
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			s.syncClusterID()
		}()
	case clusterIDErr != nil:
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			s.ensureClusterID(ctx)
		}()
	}

	t.lanes = newControllerLanes(ctx, csiCallTimeout, s.logger)
	t.lanes.term = t.raftTerm
	s.lanes.Store(t.lanes)
	clock.step(stepLanes)
	s.heartbeats.start(ctx, &t.wg)
	clock.step(stepHeartbeats)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		s.runVolumeWatcher(ctx)
	}()
	if t.reconcile {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			s.runRestoreReconcile(ctx)
		}()
	}
	clock.step(stepWatcher)
	s.broker.setEnabled(true)
	clock.step(stepBroker)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		s.runDrainer(ctx)
	}()
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		s.reconcileLoop(ctx)
	}()
	clock.step(stepDrainer)
	opened := time.Now()
	setMillis(takeoverGauge(stepDutiesOpen), opened.Sub(t.start))
	if t.newTerm {
		s.reportLeaderlessGap(t.lastContact, opened)
	} else {
		s.logger.Info("leader duties started")
	}
	// Last, so that whoever sees the count move reads this takeover's gauges.
	metrics.IncrCounter(metricDutiesStarted, 1)

	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		s.finishTakeover(t, opened)
	}()
}

// finishTakeover does the part of a takeover that reads all of the state,
// after the duties are open: it arms the failover TTL for every known node
// (a client that died while there was no leader still loses its claims in
// bounded time), queues every pending evaluation again, and then starts the
// scheduler workers, so an evaluation queued meanwhile is not scheduled
// twice.
func (s *Server) finishTakeover(t *leaderTerm, opened time.Time) {
	ctx := t.ctx
	clock := newStepClock(takeoverGauge, opened)
	if err := s.heartbeats.armKnown(ctx); err != nil {
		if ctx.Err() == nil {
			// A leader that cannot watch its nodes would never free a dead
			// node's claims: hand over to one that can.
			s.dutyFailed(t, fmt.Errorf("arm heartbeat timers: %w", err))
		}
		return
	}
	clock.step(stepTimers)
	if err := s.restoreEvals(); err != nil {
		if ctx.Err() == nil {
			s.dutyFailed(t, fmt.Errorf("queue pending evaluations: %w", err))
		}
		return
	}
	// Whatever freed capacity under the previous leader (a volume claim
	// released just before the change) woke only that leader's broker:
	// evaluate every blocked evaluation once again.
	s.broker.unblock()
	clock.step(stepEvals)
	if ctx.Err() != nil {
		return
	}
	// t.wg counts this goroutine, so adding to it here cannot race the
	// Wait that ends the term.
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		s.runPlanApplier(ctx)
	}()
	for range schedulerWorkers {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			s.runWorker(ctx)
		}()
	}
	clock.step(stepWorkers)
	setMillis(takeoverGauge(stepFinished), time.Since(opened))
	metrics.IncrCounter(metricTakeoverDone, 1)
}

// reportLeaderlessGap logs and records how long the cluster went without a
// leader able to serve: from the last time this server heard from the
// previous leader until its own duties started. A server that never had a
// leader before (first bootstrap) has nothing to report.
func (s *Server) reportLeaderlessGap(lastContact, opened time.Time) {
	if lastContact.IsZero() {
		s.logger.Info("leader duties started")
		return
	}
	gap := opened.Sub(lastContact)
	s.leadership.leaderGap(s.ID(), s.advertise, gap, opened)
	metrics.AddSample([]string{"leader", "leaderless_gap"}, float32(gap.Seconds()*1000))
	setMillis(takeoverGauge(stepGap), gap)
	s.logger.Info("leader duties started", "leaderless_gap", gap)
}

// catchUp waits until the FSM has applied every entry of an earlier term
// that this leader's log holds: everything any earlier leader committed
// (Raft elects only a server whose log holds every committed entry), and
// what this leader will commit on their behalf. The duties read that
// state; they need nothing of this term. The entries that matter are
// commands, the only ones the FSM applies, so it waits for the last
// command of an earlier term in the log (the log store keeps where the
// newest are: commandIndex), and the FSM says when it has applied it. A
// handoff ends with a barrier, so a follower has normally applied the old
// leader's last command before it wins, and the wait ends at once;
// otherwise it ends when this leader's first entry commits.
//
// A Raft barrier proves the same one replication round later. It runs
// alongside when the FSM has not caught up yet, and decides when the index
// cannot tell (the command is older than those it lists) or the FSM's count
// is behind its state (a snapshot installed on this server while it
// followed, which Raft does not number to the FSM).
func (s *Server) catchUp(ctx context.Context) error {
	target, known := s.commands.lastEarlierCommand(s.raft.CurrentTerm(), s.fsm.Applied())
	if known && target == 0 {
		return nil
	}
	metrics.IncrCounter(metricCatchUpWaited, 1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan error, 2)
	waiting := 1
	go func() { results <- s.leaderBarrier(ctx) }()
	if known {
		waiting++
		go func() { results <- s.fsm.waitApplied(ctx, target) }()
	}
	// The first answer decides: the FSM's wait fails only when ctx ends,
	// and a barrier that fails means this server cannot commit, so the FSM
	// would not catch up either. The other is cancelled and waited for.
	err := <-results
	cancel()
	for waiting--; waiting > 0; waiting-- {
		<-results
	}
	return err
}

// leaderBarrier waits until the FSM has applied every committed entry, or
// ctx (the term) ends. Raft refuses a barrier while a leadership transfer
// is in progress, and still says so for a moment after a transfer has
// failed, so that refusal is tried again until this server either can
// write or no longer leads.
func (s *Server) leaderBarrier(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := s.waitFutureCtx(ctx, s.raft.Barrier(time.Until(deadline)))
		if !errors.Is(err, raft.ErrLeadershipTransferInProgress) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return err
		}
	}
}

// reconcileLoop keeps the Raft configuration in step with the servers that
// have joined: a new server becomes a voter as soon as the leader hears of
// it, and one unreachable past DeadServerCleanupAfter is removed.
func (s *Server) reconcileLoop(ctx context.Context) {
	ticker := time.NewTicker(s.config.JoinInterval)
	defer ticker.Stop()
	leaderSince := time.Now()
	for {
		s.reconcileVoters()
		s.pruneDeadServers(leaderSince)
		select {
		case <-ticker.C:
		case <-ctx.Done():
			return
		}
	}
}

func (s *Server) reconcileVoters() {
	future := s.raft.GetConfiguration()
	if err := future.Error(); err != nil {
		s.logger.Warn("read raft configuration", "error", err)
		return
	}
	inConfig := make(map[raft.ServerID]raft.ServerAddress)
	for _, srv := range future.Configuration().Servers {
		inConfig[srv.ID] = srv.Address
	}
members:
	for _, m := range s.members.alive() {
		id, addr := raft.ServerID(m.ID), raft.ServerAddress(m.Addr)
		if got, ok := inConfig[id]; ok && got == addr {
			continue
		}
		// A server that came back with a new identity on an old address
		// replaces its stale entry.
		for oldID, oldAddr := range inConfig {
			if oldAddr == addr && oldID != id {
				if s.members.isAlive(string(oldID)) {
					// Never replace a voter that still answers: two
					// servers cannot both answer at one address, so one of
					// the claims is stale or false; wait until it fails.
					s.logger.Warn("server answers at a live voter's address; not replacing the voter",
						"id", m.ID, "address", m.Addr, "voter_id", oldID)
					continue members
				}
				s.logger.Info("removing stale raft peer", "id", oldID, "address", oldAddr)
				if err := s.raft.RemoveServer(oldID, 0, 0).Error(); err != nil {
					s.logger.Warn("remove stale raft peer", "id", oldID, "error", err)
					return
				}
			}
		}
		s.logger.Info("adding server as voter", "id", m.ID, "name", m.Name, "address", m.Addr)
		if err := s.raft.AddVoter(id, addr, 0, 0).Error(); err != nil {
			s.logger.Warn("add voter", "id", m.ID, "error", err)
		}
	}
}
