package nomad

import (
	"context"
	"errors"
	"fmt"
	"time"

	metrics "github.com/hashicorp/go-metrics"
	"github.com/hashicorp/raft"
)

// monitorLeadership starts the leader's duties when this server gains
// leadership and stops them when it loses it, and wakes requests waiting
// for a leader whenever the observed leader changes.
func (s *Server) monitorLeadership() {
	obsCh := make(chan raft.Observation, 16)
	observer := raft.NewObserver(obsCh, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	s.raft.RegisterObserver(observer)
	defer s.raft.DeregisterObserver(observer)

	for {
		select {
		case isLeader := <-s.raftNotifyCh:
			if isLeader {
				s.establishLeadership(true)
			} else {
				s.revokeLeadership()
			}
			s.notifyLeaderChange()
		case obs := <-obsCh:
			lo := obs.Data.(raft.LeaderObservation)
			s.logger.Debug("leader observed", "leader", lo.LeaderAddr, "leader_id", lo.LeaderID)
			s.leadership.observe(string(lo.LeaderID), string(lo.LeaderAddr), time.Now())
			s.notifyLeaderChange()
		case <-s.shutdownCtx.Done():
			return
		}
	}
}

// establishLeadership waits until the FSM has applied everything the
// previous leader committed, then opens the leader's duties under a
// context that revokeLeadership cancels. newTerm is set when Raft has just
// made this server leader (and not when duties resume after a failed
// handoff), which is when a leaderless gap ended. It does nothing while a
// handoff runs, or once this server no longer leads.
//
// Until the duties are open the cluster has no serving leader, so only
// what callers need goes first, and nothing on that path reads all of the
// state: one barrier, then the lanes (claims and controller calls), the
// heartbeat loop, the watcher, the broker and the drainer. Arming a timer
// for every known node and queueing the pending evaluations again follow
// in finishTakeover, once callers are served. Each step is a gauge (see
// leader_metrics.go).
func (s *Server) establishLeadership(newTerm bool) {
	// Raft stops updating the last contact once this server campaigns, so
	// it is the last time the previous leader was heard from.
	lastContact := s.raft.LastContact()
	start := time.Now()
	clock := newStepClock(takeoverGauge, start)
	s.logger.Info("cluster leadership acquired")
	if err := s.leaderBarrier(); err != nil {
		// Without the barrier this leader's view may be stale, and a leader
		// without duties would refuse every client: hand over instead.
		if s.shutdownCtx.Err() == nil {
			s.stepDown(fmt.Errorf("barrier after election: %w", err))
		}
		return
	}
	clock.step(stepBarrier)
	// Before any duty starts, and outside leaderMu. Once a leader serves,
	// its cluster has an ID: a read, except on a new cluster, where it is
	// a Raft apply; should that write fail, a duty below retries it.
	// Recording a known ID in the data dir (a file written and synced)
	// waits until the duties are open.
	var clusterIDErr error
	hasID := s.hasClusterID()
	if !hasID {
		clusterIDErr = s.writeClusterID()
	}
	clock.step(stepClusterID)

	s.leaderMu.Lock()
	defer s.leaderMu.Unlock()
	if s.leaderCancel != nil {
		return // already leading
	}
	if s.handingOff.Load() || !s.IsLeader() {
		// Checked under leaderMu: a handoff revokes under it too, and a
		// lost leadership's revoke waits for it.
		return
	}
	ctx, cancel := context.WithCancel(s.shutdownCtx)
	s.leaderCancel = cancel
	switch {
	case hasID:
		s.leaderWG.Add(1)
		go func() {
			defer s.leaderWG.Done()
			s.syncClusterID()
		}()
	case clusterIDErr != nil:
		s.leaderWG.Add(1)
		go func() {
			defer s.leaderWG.Done()
			s.ensureClusterID(ctx)
		}()
	}

	s.lanes.Store(newControllerLanes(ctx, csiCallTimeout, s.logger))
	clock.step(stepLanes)
	s.heartbeats.start(ctx, &s.leaderWG)
	clock.step(stepHeartbeats)
	s.leaderWG.Add(1)
	go func() {
		defer s.leaderWG.Done()
		s.runVolumeWatcher(ctx)
	}()
	if s.reconcileRestored.Swap(false) {
		s.leaderWG.Add(1)
		go func() {
			defer s.leaderWG.Done()
			s.runRestoreReconcile(ctx)
		}()
	}
	clock.step(stepWatcher)
	s.broker.setEnabled(true)
	clock.step(stepBroker)
	s.leaderWG.Add(1)
	go func() {
		defer s.leaderWG.Done()
		s.runDrainer(ctx)
	}()
	s.leaderWG.Add(1)
	go func() {
		defer s.leaderWG.Done()
		s.reconcileLoop(ctx)
	}()
	clock.step(stepDrainer)
	if f := s.config.leaderDutyFault; f != nil {
		if err := f(); err != nil {
			s.stepDown(err)
		}
	}
	opened := time.Now()
	setMillis(takeoverGauge(stepDutiesOpen), opened.Sub(start))
	if newTerm {
		s.reportLeaderlessGap(lastContact, opened)
	} else {
		s.logger.Info("leader duties started")
	}
	// Last, so that whoever sees the count move reads this takeover's gauges.
	metrics.IncrCounter(metricDutiesStarted, 1)

	s.leaderWG.Add(1)
	go func() {
		defer s.leaderWG.Done()
		s.finishTakeover(ctx, opened)
	}()
}

// finishTakeover does the part of a takeover that reads all of the state,
// after the duties are open: it arms the failover TTL for every known node
// (a client that died while there was no leader still loses its claims in
// bounded time), queues every pending evaluation again, and then starts the
// scheduler workers, so an evaluation queued meanwhile is not scheduled
// twice.
func (s *Server) finishTakeover(ctx context.Context, opened time.Time) {
	clock := newStepClock(takeoverGauge, opened)
	if err := s.heartbeats.armKnown(ctx); err != nil {
		if ctx.Err() == nil {
			// A leader that cannot watch its nodes would never free a dead
			// node's claims: hand over to one that can.
			s.stepDown(fmt.Errorf("arm heartbeat timers: %w", err))
		}
		return
	}
	clock.step(stepTimers)
	if err := s.restoreEvals(); err != nil {
		if ctx.Err() == nil {
			s.stepDown(fmt.Errorf("queue pending evaluations: %w", err))
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
	// leaderWG counts this goroutine, so adding to it here cannot race
	// revokeLeadership's Wait.
	s.leaderWG.Add(1)
	go func() {
		defer s.leaderWG.Done()
		s.runPlanApplier(ctx)
	}()
	for range schedulerWorkers {
		s.leaderWG.Add(1)
		go func() {
			defer s.leaderWG.Done()
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

// leaderBarrier waits until the FSM has applied every committed entry.
// Raft refuses a barrier while a leadership transfer is in progress, and
// still says so for a moment after a transfer has failed, so that refusal
// is tried again until this server either can write or no longer leads.
func (s *Server) leaderBarrier() error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := s.waitFuture(s.raft.Barrier(time.Until(deadline)))
		if !errors.Is(err, raft.ErrLeadershipTransferInProgress) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-s.shutdownCtx.Done():
			return err
		}
	}
}

// revokeLeadership stops every leader duty, waits for them to return, and
// returns the lanes it closed (nil if none) for a handoff to drain. Safe to
// call when not leading.
func (s *Server) revokeLeadership() *controllerLanes {
	s.leaderMu.Lock()
	defer s.leaderMu.Unlock()
	if s.leaderCancel == nil {
		return nil
	}
	lanes := s.lanes.Load()
	s.logger.Info("cluster leadership lost")
	s.leaderCancel()
	s.leaderCancel = nil
	s.leaderWG.Wait()
	s.heartbeats.stop()
	s.broker.setEnabled(false)
	s.lanes.Store(nil)
	return lanes
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
