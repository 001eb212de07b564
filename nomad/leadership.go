package nomad

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/roamhq/roam/structs"
)

// leaderState is where this server stands in leading the cluster, as the
// leadership owner (runLeadership) sees it.
type leaderState int32

const (
	// stateFollower: no duties run. Raft may still call this server leader
	// (a failed step-down waiting to retry), but it serves nothing a
	// leader serves.
	stateFollower leaderState = iota
	// stateEstablishing: Raft made this server leader; the barrier (and
	// the wait for the previous term's duties to end) runs.
	stateEstablishing
	// stateLeading: the duties are open.
	stateLeading
	// stateHandingOff: a handoff (or a snapshot restore) stopped the
	// duties on purpose and decides, when it ends, whether they start
	// again.
	stateHandingOff
)

func (st leaderState) String() string {
	switch st {
	case stateFollower:
		return "follower"
	case stateEstablishing:
		return "establishing"
	case stateLeading:
		return "leading"
	case stateHandingOff:
		return "handing-off"
	}
	return fmt.Sprintf("leaderState(%d)", int32(st))
}

// leaderTerm is one run of the leader's duties, from the moment Raft makes
// this server leader (or a handoff resumes) until the owner ends it. Its
// fields are written by the owner only, before the goroutines that read
// them start, except wg.
type leaderTerm struct {
	id     uint64
	ctx    context.Context
	cancel context.CancelFunc
	// newTerm is set when Raft has just made this server leader (not when
	// duties resume after a failed handoff): the leaderless gap ends then.
	newTerm     bool
	lastContact time.Time
	// start is when the term began; clock times its takeover steps, in
	// the establishing goroutine and then in the owner.
	start time.Time
	clock *stepClock
	// reconcile makes the duties check the provider's attachments against
	// restored claims (set by a snapshot restore).
	reconcile bool
	// wg counts the term's goroutines: the establishing step, then every
	// duty.
	wg sync.WaitGroup
	// lanes are the controller lanes this term opened, nil until then.
	lanes *controllerLanes
	// raftTerm is the Raft term this leadership holds, set by the
	// establishing step before the duties open; the lanes stamp it on
	// their calls.
	raftTerm uint64
	// opened is closed once the duties are open, or the term ended first.
	opened     chan struct{}
	openedDone bool
	// stopped is closed once every goroutine of this term has returned;
	// done once stopped is, and every earlier term is done too. A new
	// term opens its duties only after the previous one is done, so two
	// terms' duties never run at once.
	stopped, done chan struct{}
}

// markOpened closes opened once; owner only.
func (t *leaderTerm) markOpened() {
	if !t.openedDone {
		t.openedDone = true
		close(t.opened)
	}
}

// leaderEventKind names a message to the leadership owner.
type leaderEventKind int

const (
	// evEstablished: a term's establishing step ended (err says how).
	evEstablished leaderEventKind = iota
	// evDutyFailed: a duty of a term cannot run; the leader hands over.
	evDutyFailed
	// evClaim: a handoff (or restore) asks to be the only one running.
	evClaim
	// evStop: the claim holder stops the duties.
	evStop
	// evRelease: the claim holder is done; restart says whether duties
	// start again if this server still leads.
	evRelease
	// evRetryDuties: a step-down that failed tries the duties again.
	evRetryDuties
)

// leaderEvent is a message to the leadership owner. Raft's own
// notifications and observations come on their channels.
type leaderEvent struct {
	kind leaderEventKind
	term *leaderTerm
	err  error
	// hasID and clusterIDErr carry the cluster ID's state out of the
	// establishing step.
	hasID        bool
	clusterIDErr error
	// restart and reconcile go with evRelease.
	restart, reconcile bool
	// reply receives the owner's answer to evClaim, evStop and
	// evRelease; buffered, so the owner never waits on it.
	reply chan leaderReply
}

// leaderReply is the owner's answer to a claim holder.
type leaderReply struct {
	// busy is set when another claim is held: closed when it ends.
	busy <-chan struct{}
	// term is the term stopped (evStop) or started (evRelease), or nil.
	term *leaderTerm
}

// errPreviousTermRunning means a new term could not open its duties
// because the previous term's have not all returned.
var errPreviousTermRunning = errors.New("the previous term's leader duties have not stopped")

// leadershipOwner is the state runLeadership owns. Nothing else reads or
// writes it; other goroutines see s.leaderState and s.lanes, which only
// the owner stores.
type leadershipOwner struct {
	s     *Server
	state leaderState
	// raftLeader is what Raft's latest notification said.
	raftLeader bool
	// term is the current term (establishing, leading), nil if none;
	// last is the latest term, ended or not, whose done a new term waits
	// for.
	term, last *leaderTerm
	nextID     uint64
	// claim is closed when the claim held now ends; nil if none.
	// claimStopped says whether its holder stopped the duties.
	claim        chan struct{}
	claimStopped bool
	// reconcilePending is set by a restore until duties open.
	reconcilePending bool
}

// runLeadership is the leadership owner: the one goroutine that decides
// when this server's leader duties start and stop. Raft's leadership
// notifications, the end of a term's establishing step, a failed duty, and
// a handoff's requests all reach it as messages, and it never waits on
// anything slow: a Raft future, an RPC, or a term's goroutines are waited
// for elsewhere, and their outcome comes back as a message. So Raft's
// notifications are always read at once, whatever a duty is doing.
func (s *Server) runLeadership() {
	obsCh := make(chan raft.Observation, 16)
	observer := raft.NewObserver(obsCh, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	s.raft.RegisterObserver(observer)
	defer s.raft.DeregisterObserver(observer)

	o := &leadershipOwner{s: s}
	for {
		select {
		case isLeader := <-s.raftNotifyCh:
			o.raftLeader = isLeader
			if isLeader {
				o.onGained()
			} else {
				o.onLost()
			}
			s.notifyLeaderChange()
		case obs := <-obsCh:
			lo := obs.Data.(raft.LeaderObservation)
			s.logger.Debug("leader observed", "leader", lo.LeaderAddr, "leader_id", lo.LeaderID)
			s.leadership.observe(string(lo.LeaderID), string(lo.LeaderAddr), time.Now())
			s.notifyLeaderChange()
		case ev := <-s.leaderEvents:
			o.handle(ev)
		case <-s.shutdownCtx.Done():
			// The duties' contexts derive from the shutdown context, so
			// they are ending; Shutdown waits for them through s.wg.
			if o.term != nil {
				o.endTerm()
			}
			return
		}
	}
}

// sendLeaderEvent hands ev to the owner; false once the server shuts down.
func (s *Server) sendLeaderEvent(ev leaderEvent) bool {
	select {
	case s.leaderEvents <- ev:
		return true
	case <-s.shutdownCtx.Done():
		return false
	}
}

// askLeadership sends ev with a reply channel and waits for the answer.
func (s *Server) askLeadership(ctx context.Context, ev leaderEvent) (leaderReply, error) {
	ev.reply = make(chan leaderReply, 1)
	select {
	case s.leaderEvents <- ev:
	case <-ctx.Done():
		return leaderReply{}, ctx.Err()
	case <-s.shutdownCtx.Done():
		return leaderReply{}, ErrServerClosed
	}
	select {
	case r := <-ev.reply:
		return r, nil
	case <-s.shutdownCtx.Done():
		return leaderReply{}, ErrServerClosed
	}
}

// currentLeaderState returns the owner's state as last published.
func (s *Server) currentLeaderState() leaderState { return leaderState(s.leaderState.Load()) }

func (o *leadershipOwner) setState(st leaderState) {
	o.state = st
	o.s.leaderState.Store(int32(st))
}

func (o *leadershipOwner) handle(ev leaderEvent) {
	switch ev.kind {
	case evEstablished:
		o.onEstablished(ev)
	case evDutyFailed:
		if ev.term == o.term && ev.term != nil {
			o.stepDown(ev.err)
		}
	case evClaim:
		if o.claim != nil {
			ev.reply <- leaderReply{busy: o.claim}
			return
		}
		o.claim, o.claimStopped = make(chan struct{}), false
		ev.reply <- leaderReply{}
	case evStop:
		var t *leaderTerm
		if o.term != nil {
			t = o.term
			o.endTerm()
			o.s.notifyLeaderChange()
		}
		o.claimStopped = true
		o.setState(stateHandingOff)
		ev.reply <- leaderReply{term: t}
	case evRelease:
		var t *leaderTerm
		if ev.reconcile {
			o.reconcilePending = true
		}
		if o.claimStopped {
			o.setState(stateFollower)
			if ev.restart && o.raftLeader && o.s.IsLeader() {
				t = o.startTerm(false)
			}
		}
		if o.claim != nil {
			close(o.claim)
			o.claim, o.claimStopped = nil, false
		}
		ev.reply <- leaderReply{term: t}
	case evRetryDuties:
		if o.term == nil && o.claim == nil && o.raftLeader && o.s.IsLeader() {
			o.startTerm(false)
		}
	}
}

// onGained starts a term unless one runs or a handoff has the duties
// stopped (it decides, when it ends, whether they start again).
func (o *leadershipOwner) onGained() {
	if o.term != nil || o.claimStopped {
		return
	}
	o.startTerm(true)
}

// onLost ends the current term at once: its context is cancelled, its
// lanes closed, and its goroutines are waited for elsewhere.
func (o *leadershipOwner) onLost() {
	if o.term == nil {
		return
	}
	o.s.logger.Info("cluster leadership lost")
	o.endTerm()
	if !o.claimStopped {
		o.setState(stateFollower)
	}
}

// startTerm begins a term: the establishing step runs in the term's own
// goroutine and reports back with evEstablished.
func (o *leadershipOwner) startTerm(newTerm bool) *leaderTerm {
	s := o.s
	ctx, cancel := context.WithCancel(s.shutdownCtx)
	o.nextID++
	t := &leaderTerm{
		id:        o.nextID,
		ctx:       ctx,
		cancel:    cancel,
		newTerm:   newTerm,
		opened:    make(chan struct{}),
		stopped:   make(chan struct{}),
		done:      make(chan struct{}),
		reconcile: o.reconcilePending,
		start:     time.Now(),
	}
	t.clock = newStepClock(takeoverGauge, t.start)
	if newTerm {
		// Raft stops updating the last contact once this server
		// campaigns, so it is the last time the previous leader was heard
		// from.
		t.lastContact = s.raft.LastContact()
	}
	var prev <-chan struct{}
	if o.last != nil {
		prev = o.last.done
	}
	o.term, o.last = t, t
	o.setState(stateEstablishing)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		s.establishTerm(t, prev)
	}()
	// Closes t.done only after prev's: the chain makes a term's done mean
	// that no earlier term has a goroutine left either.
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		<-ctx.Done()
		t.wg.Wait()
		close(t.stopped)
		if prev != nil {
			<-prev
		}
		close(t.done)
	}()
	return t
}

// endTerm cancels the current term and stops what other goroutines could
// still reach through it (lanes, heartbeat timers, the broker); its
// goroutines end on their context and are not waited for here.
func (o *leadershipOwner) endTerm() {
	t := o.term
	o.term = nil
	t.cancel()
	t.markOpened()
	o.s.lanes.Store(nil)
	o.s.heartbeats.stop()
	o.s.broker.setEnabled(false)
}

// onEstablished opens the duties of the term whose establishing step
// succeeded, if it is still the current term and this server still leads.
func (o *leadershipOwner) onEstablished(ev leaderEvent) {
	t := ev.term
	if t != o.term || t == nil {
		return // ended meanwhile; its context is cancelled
	}
	if ev.err != nil {
		// The term opened nothing (no lanes, no calls to drain): end it, so
		// that a retry after a failed step-down starts afresh.
		o.endTerm()
		o.setState(stateFollower)
		o.s.notifyLeaderChange()
		// Without the barrier this leader's view may be stale, and a
		// leader without duties would refuse every client: hand over.
		o.stepDown(ev.err)
		return
	}
	if !o.raftLeader || !o.s.IsLeader() {
		o.endTerm()
		o.setState(stateFollower)
		return
	}
	o.reconcilePending = false
	o.s.openDuties(t, ev.hasID, ev.clusterIDErr)
	t.markOpened()
	o.setState(stateLeading)
	o.s.notifyLeaderChange()
	if f := o.s.config.leaderDutyFault; f != nil {
		if err := f(); err != nil {
			o.stepDown(err)
		}
	}
}

// stepDown hands leadership over because a duty of the current term cannot
// run. The handoff runs in its own goroutine: it waits for a new leader,
// and the owner must go on reading Raft's notifications meanwhile. Should
// the handoff fail while this server still leads, the duties are tried
// again after a pause, so a lasting fault cannot spin.
func (o *leadershipOwner) stepDown(reason error) {
	s := o.s
	s.logger.Error("leader duty failed; handing leadership over", "error", reason)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_, err := s.handoff(s.shutdownCtx, "", "", false)
		if err == nil || errors.Is(err, structs.ErrNoLeader) || errors.Is(err, ErrServerClosed) {
			return
		}
		s.logger.Error("step down after a failed leader duty", "error", err)
		select {
		case <-time.After(jitter(time.Second, 2)):
		case <-s.shutdownCtx.Done():
			return
		}
		s.sendLeaderEvent(leaderEvent{kind: evRetryDuties})
	}()
}

// dutyFailed tells the owner that a duty of term t cannot run.
func (s *Server) dutyFailed(t *leaderTerm, err error) {
	s.sendLeaderEvent(leaderEvent{kind: evDutyFailed, term: t, err: err})
}

// claimLeadership waits until no other handoff or restore holds the
// duties, or ctx ends, and makes the caller the holder; releaseLeadership
// ends the claim. Nothing is locked while it waits.
func (s *Server) claimLeadership(ctx context.Context) error {
	for {
		r, err := s.askLeadership(ctx, leaderEvent{kind: evClaim})
		if err != nil {
			return fmt.Errorf("waiting for the handoff under way: %w", err)
		}
		if r.busy == nil {
			return nil
		}
		select {
		case <-r.busy:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the handoff under way: %w", ctx.Err())
		case <-s.shutdownCtx.Done():
			return fmt.Errorf("waiting for the handoff under way: %w", ErrServerClosed)
		}
	}
}

// stopDuties, by the claim holder, ends the current term and returns it
// (nil if there was none); its goroutines may still be returning.
func (s *Server) stopDuties(ctx context.Context) (*leaderTerm, error) {
	r, err := s.askLeadership(ctx, leaderEvent{kind: evStop})
	return r.term, err
}

// releaseLeadership ends the caller's claim. With restart, duties the
// caller stopped start again if this server still leads, and it waits
// (bounded by ctx) until they are open. reconcile makes the next duties
// check restored claims.
func (s *Server) releaseLeadership(ctx context.Context, restart, reconcile bool) {
	// Not bound to ctx: a claim must always be released.
	r, err := s.askLeadership(context.Background(), leaderEvent{kind: evRelease, restart: restart, reconcile: reconcile})
	if err != nil || r.term == nil {
		return
	}
	select {
	case <-r.term.opened:
	case <-ctx.Done():
	case <-s.shutdownCtx.Done():
	}
}

// waitStopped waits, bounded by ctx, until t's goroutines have returned.
func waitStopped(ctx context.Context, t *leaderTerm) error {
	if t == nil {
		return nil
	}
	select {
	case <-t.stopped:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the leader duties to stop: %w", ctx.Err())
	}
}
