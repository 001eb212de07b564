package nomad

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// A leader that loses Raft leadership while a scheduler worker is inside a
// long pass (one that does not look at its context) stops its duties at
// once and keeps reading Raft's notifications: the cluster elects another
// leader, and should leadership come back to this server while the pass
// still runs, it hands over rather than lead without duties. Before the
// leadership owner, losing leadership waited for the worker while holding
// the goroutine that reads Raft's notifications.
func TestLeadership_LostDuringLongSchedulerPass(t *testing.T) {
	t.Parallel()
	var blocked atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	c := testMemClusterWith(t, 3, func(cfg *Config) {
		withSteadyRaft(cfg)
		cfg.schedulerPassHook = func() {
			if blocked.CompareAndSwap(false, true) {
				close(entered)
				<-release
			}
		}
	})
	// Registered after the cluster, so it runs before the servers stop.
	t.Cleanup(func() { close(release) })

	old := waitForLeaderDuties(t, c.servers...)
	registerNodeRetry(t, old, workNode("long-pass-node"))
	registerJob(t, old, serviceJob("long-pass", 1))
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no scheduler pass started on the leader")
	}

	c.Isolate(old)
	rest := c.others(old)
	newLeader := waitForLeaderDuties(t, rest...)
	// Generous for a loaded machine: the leader lease is 500 ms here.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		switch {
		case old.IsLeader():
			return errors.New("the cut-off server still leads")
		case old.lanes.Load() != nil:
			return errors.New("the cut-off server still has its controller lanes")
		case old.heartbeats.running():
			return errors.New("the cut-off server still runs heartbeat timers")
		}
		return nil
	}), wait.Timeout(15*time.Second), wait.Gap(10*time.Millisecond)),
		must.Sprint("the old leader did not step down while its worker was in a long pass"))

	// Leadership comes back to the old server while its pass still runs.
	c.HealAll()
	var reply structs.TransferLeadershipResponse
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		return newLeader.RPC("Operator.TransferLeadership", &structs.TransferLeadershipRequest{PeerID: old.ID()}, &reply)
	}), wait.Timeout(15*time.Second), wait.Gap(50*time.Millisecond)))

	// Some server leads with its duties open within a bound that is
	// generous for a loaded machine, and it is not the old one: its
	// previous term has not ended, so it cannot open duties.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		for _, s := range c.servers {
			if s.IsLeader() {
				if s.lanes.Load() == nil || !s.heartbeats.running() {
					return fmt.Errorf("server %s leads without its duties", s.ID())
				}
				if s == old {
					return errors.New("the old server opened duties while its previous term's worker still runs")
				}
				return nil
			}
		}
		return errors.New("no leader")
	}), wait.Timeout(30*time.Second), wait.Gap(20*time.Millisecond)),
		must.Sprint("no server led with its duties after leadership went back to the server with the stuck worker"))
	select {
	case <-release:
		t.Fatal("the long pass ended early; the test proves nothing")
	default:
	}
}

// A new leader opens its duties only once its FSM has applied every entry
// committed before its term: here the follower that becomes leader cannot
// apply the old leader's last write (its FSM is held on it), and must not
// open its duties until it can. Raft's applied index does not show this
// (it counts entries handed to the FSM, not applied); the barrier does.
func TestLeadership_DutiesWaitForEarlierEntriesApplied(t *testing.T) {
	t.Parallel()
	c := testMemClusterWith(t, 3, withSteadyRaft)
	old := waitForLeaderDuties(t, c.servers...)
	next := c.others(old)[0]

	var holding atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	var releaseOnce atomic.Bool
	unhold := func() {
		if releaseOnce.CompareAndSwap(false, true) {
			close(release)
		}
	}
	t.Cleanup(unhold)
	next.fsm.SetApplyHook(func(mt structs.MessageType, evals []*structs.Evaluation) {
		if mt == structs.NodeRegisterRequestType && holding.CompareAndSwap(false, true) {
			close(held)
			<-release
		}
		next.onApply(mt, evals)
	})
	node := workNode("held-entry")
	registerNodeRetry(t, old, node)
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the follower never applied the old leader's write")
	}
	heldAt := next.raft.AppliedIndex()

	must.NoError(t, old.raft.LeadershipTransferToServer(raft.ServerID(next.config.NodeID), raft.ServerAddress(next.Addr())).Error())
	// next leads and has committed an entry of its term, but its FSM is
	// still held on the old leader's write: no duties yet.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		if !next.IsLeader() {
			return errors.New("the transfer target does not lead yet")
		}
		if next.raft.CommitIndex() <= heldAt+1 {
			return fmt.Errorf("no entry of the new term committed yet (commit index %d)", next.raft.CommitIndex())
		}
		return nil
	}), wait.Timeout(10*time.Second), wait.Gap(time.Millisecond)))
	must.Wait(t, wait.ContinualSuccess(wait.ErrorFunc(func() error {
		if next.heartbeats.running() || next.lanes.Load() != nil {
			return fmt.Errorf("duties opened with the FSM held after index %d (Raft has handed it up to %d)", heldAt, next.raft.AppliedIndex())
		}
		return nil
	}), wait.Timeout(500*time.Millisecond), wait.Gap(5*time.Millisecond)))

	unhold()
	waitForLeaderDuties(t, next)
	n, err := next.State().NodeByID(nil, node.ID)
	must.NoError(t, err)
	must.NotNil(t, n, must.Sprint("duties opened without the old leader's write in the state"))
}
