package nomad

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

func others(servers []*Server, not *Server) []*Server {
	var out []*Server
	for _, s := range servers {
		if s != not {
			out = append(out, s)
		}
	}
	return out
}

// A leader that shuts down hands leadership over before it goes: when
// Shutdown returns, another server already leads, without an election
// timeout in between.
func TestHandoff_ShutdownTransfersLeadership(t *testing.T) {
	t.Parallel()
	// Steady timers: an election contested at the start (seen under load)
	// made the transfer time out, which is not what this test is about.
	servers := testClusterWith(t, 3, withSteadyRaft)
	leader := waitForLeaderDuties(t, servers...)
	must.NoError(t, leader.Shutdown(context.Background()))

	rest := others(servers, leader)
	leaders := 0
	for _, s := range rest {
		if s.IsLeader() {
			leaders++
		}
	}
	must.Eq(t, 1, leaders, must.Sprint("a new leader exists the moment Shutdown returns"))
	waitForLeader(t, rest...)
}

// The departing leader refuses new controller calls (retryable) but lets
// the one in flight finish before it hands over and shuts down.
func TestHandoff_WaitsForInFlightControllerCall(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	leader := waitForLeaderDuties(t, servers...)
	lanes := leader.lanes.Load()
	must.NotNil(t, lanes)

	started, release, finished := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		_ = lanes.Do(context.Background(), "hostpath", "publish", func(ctx context.Context) error {
			close(started)
			<-release
			close(finished)
			return nil
		})
	}()
	<-started

	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- leader.Shutdown(context.Background()) }()

	// The handoff has begun once the leader's duties (and lanes) are gone.
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return leader.lanes.Load() == nil }),
		wait.Timeout(5*time.Second), wait.Gap(5*time.Millisecond)))
	err := lanes.Do(context.Background(), "hostpath", "publish", func(context.Context) error {
		t.Error("a new controller call started during the handoff")
		return nil
	})
	must.ErrorIs(t, err, structs.ErrNoLeader)
	must.True(t, structs.IsRetryable(err))
	select {
	case err := <-shutdownDone:
		t.Fatalf("shutdown finished while a controller call was in flight: %v", err)
	default:
	}

	close(release)
	<-finished
	must.NoError(t, <-shutdownDone)
	waitForLeader(t, others(servers, leader)...)
}

// holdControllerCall starts a controller call in the leader's lane that
// runs until release is closed, and returns once it is running.
func holdControllerCall(t *testing.T, leader *Server) (release chan struct{}, finished chan struct{}) {
	t.Helper()
	lanes := leader.lanes.Load()
	must.NotNil(t, lanes)
	started, refused := make(chan struct{}), make(chan error, 1)
	release, finished = make(chan struct{}), make(chan struct{})
	go func() {
		err := lanes.Do(context.Background(), "hostpath", "publish", func(ctx context.Context) error {
			close(started)
			<-release
			close(finished)
			return nil
		})
		if err != nil {
			refused <- err
		}
	}()
	// A lane that refuses the call (leadership moved on a loaded machine)
	// fails the test rather than hanging it.
	select {
	case <-started:
	case err := <-refused:
		t.Fatalf("controller call refused before it started: %v", err)
	}
	return release, finished
}

// `operator raft transfer-leadership` drains like a shutdown does, and the
// server stays up as a follower of the new leader.
func TestHandoff_OperatorTransferDrainsFirst(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	leader := waitForLeaderDuties(t, servers...)
	release, finished := holdControllerCall(t, leader)

	done := make(chan error, 1)
	var reply structs.TransferLeadershipResponse
	go func() {
		done <- leader.RPC("Operator.TransferLeadership", &structs.TransferLeadershipRequest{}, &reply)
	}()
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return leader.lanes.Load() == nil }),
		wait.Timeout(5*time.Second), wait.Gap(5*time.Millisecond)))
	select {
	case err := <-done:
		t.Fatalf("transfer finished while a controller call was in flight: %v", err)
	default:
	}
	must.True(t, leader.IsLeader(), must.Sprint("leadership moved before the in-flight call finished"))

	close(release)
	<-finished
	must.NoError(t, <-done)
	must.NotEq(t, leader.ID(), reply.NewLeaderID)
	must.False(t, leader.IsLeader())
	newLeader := waitForLeaderDuties(t, others(servers, leader)...)
	must.Eq(t, reply.NewLeaderID, newLeader.ID())
	// The old leader still serves, as a follower.
	var resp structs.NodeListResponse
	must.NoError(t, leader.RPC("Node.List", &structs.NodeListRequest{}, &resp))
}

// A transfer that fails leaves the server leading with its duties running
// again, not a leader that refuses every client.
func TestHandoff_FailedTransferResumesDuties(t *testing.T) {
	t.Parallel()
	// Raft's transfer times out after an election timeout; with the test
	// defaults the remaining follower can time out at the same moment and
	// take leadership, which is not what this test is about.
	servers := testClusterWith(t, 3, withSteadyRaft)
	leader := waitForLeaderDuties(t, servers...)
	gone := others(servers, leader)[0]
	must.NoError(t, gone.Shutdown(context.Background()))

	var reply structs.TransferLeadershipResponse
	err := leader.RPC("Operator.TransferLeadership", &structs.TransferLeadershipRequest{PeerID: gone.ID()}, &reply)
	must.Error(t, err)
	must.True(t, leader.IsLeader(), must.Sprint("the remaining quorum should keep this server leading"))
	must.NotNil(t, leader.lanes.Load(), must.Sprint("duties did not resume after a failed transfer"))
	must.True(t, leader.heartbeats.running())
	var resp structs.NodeListResponse
	must.NoError(t, leader.RPC("Node.List", &structs.NodeListRequest{}, &resp))
}

// A transfer to a peer that does not exist, or from a lone server, is
// refused before any duty stops.
func TestHandoff_BadTargetChangesNothing(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	leader := waitForLeaderDuties(t, servers...)
	lanes := leader.lanes.Load()
	var reply structs.TransferLeadershipResponse
	err := leader.RPC("Operator.TransferLeadership", &structs.TransferLeadershipRequest{PeerID: "no-such-server"}, &reply)
	must.ErrorIs(t, err, structs.ErrNotFound)
	must.StrContains(t, err.Error(), "no-such-server")
	must.True(t, leader.IsLeader())
	must.True(t, lanes == leader.lanes.Load(), must.Sprint("duties were restarted for a refused transfer"))

	solo := testServer(t, nil)
	waitForLeaderDuties(t, solo)
	err = solo.RPC("Operator.TransferLeadership", &structs.TransferLeadershipRequest{}, &reply)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.True(t, solo.IsLeader())
	must.True(t, solo.heartbeats.running())
}

// A leader whose duties cannot run hands over through the same handoff.
func TestHandoff_FailedLeaderDutyHandsOver(t *testing.T) {
	t.Parallel()
	var bad atomic.Value // server ID whose duties fail
	servers := testClusterWith(t, 3, func(c *Config) {
		c.leaderDutyFault = func() error {
			// c.NodeID is filled in after this function runs.
			if v, _ := bad.Load().(string); v != "" && v == c.NodeID {
				return errors.New("injected leader duty failure")
			}
			return nil
		}
	})
	leader := waitForLeaderDuties(t, servers...)
	bad.Store(leader.ID())
	// Force a new term on the same server: step it down, then transfer
	// back to it. Its duties now fail, so it must hand over at once.
	var reply structs.TransferLeadershipResponse
	must.NoError(t, leader.RPC("Operator.TransferLeadership", &structs.TransferLeadershipRequest{}, &reply))
	other := waitForLeaderDuties(t, others(servers, leader)...)
	must.NoError(t, other.RPC("Operator.TransferLeadership", &structs.TransferLeadershipRequest{PeerID: leader.ID()}, &reply))

	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		_, id := other.Leader()
		if id == "" || id == leader.ID() {
			return fmt.Errorf("leader is %q; want a server other than %s", id, leader.ID())
		}
		if leader.lanes.Load() != nil {
			return errors.New("the failed leader still has lanes")
		}
		return nil
	}), wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond)))
	waitForLeaderDuties(t, others(servers, leader)...)
}

// With leave_on_terminate a server leaves the Raft configuration on
// shutdown, after handing leadership over, and is not added back.
func TestHandoff_LeaveOnTerminate(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	leader := waitForLeaderDuties(t, servers...)
	leader.config.LeaveOnTerminate = true
	must.NoError(t, leader.Shutdown(context.Background()))

	rest := others(servers, leader)
	newLeader := waitForLeaderDuties(t, rest...)
	cfg, _, err := newLeader.raftConfiguration()
	must.NoError(t, err)
	must.Len(t, 2, cfg.Servers, must.Sprintf("configuration: %+v", cfg.Servers))
	for _, srv := range cfg.Servers {
		must.NotEq(t, leader.ID(), string(srv.ID))
	}
	// A follower without the option keeps its seat.
	follower := others(rest, newLeader)[0]
	must.NoError(t, follower.Shutdown(context.Background()))
	cfg, _, err = newLeader.raftConfiguration()
	must.NoError(t, err)
	must.Len(t, 2, cfg.Servers)
}

// Requests that reach the departing leader while it drains, directly or
// forwarded by a follower, are held and then served by the new leader:
// none fails, none is applied twice.
func TestHandoff_RequestsDuringDrainReachNewLeader(t *testing.T) {
	// Not parallel: its writes wait out an election inside the hold
	// timeout, which a test running beside it on 2 cores can stretch.
	// The departing leader holds the writes for up to the hold timeout
	// while the next leader is elected and opens its duties; the test
	// default (2 s) is shorter than that takes on a loaded 2-core machine,
	// where the writes then got a retryable error instead.
	servers := testClusterWith(t, 3, func(c *Config) { c.RPCHoldTimeout = 15 * time.Second })
	leader := waitForLeaderDuties(t, servers...)
	follower := others(servers, leader)[0]
	release, finished := holdControllerCall(t, leader)

	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- leader.Shutdown(context.Background()) }()
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return leader.lanes.Load() == nil }),
		wait.Timeout(5*time.Second), wait.Gap(5*time.Millisecond)))

	viaLeader, viaFollower := testNode("via-leader"), testNode("via-follower")
	results := make(chan error, 2)
	for _, c := range []struct {
		srv  *Server
		node *structs.Node
	}{{leader, viaLeader}, {follower, viaFollower}} {
		go func() {
			var resp structs.NodeUpdateResponse
			results <- c.srv.RPC("Node.Register", &structs.NodeRegisterRequest{Node: c.node}, &resp)
		}()
	}
	// Both are held while the drain lasts.
	select {
	case err := <-results:
		t.Fatalf("a request finished while the old leader was draining: %v", err)
	default:
	}

	close(release)
	<-finished
	for range 2 {
		must.NoError(t, <-results)
	}
	must.NoError(t, <-shutdownDone)
	newLeader := waitForLeaderDuties(t, others(servers, leader)...)
	for _, n := range []*structs.Node{viaLeader, viaFollower} {
		got, err := newLeader.State().NodeByID(nil, n.ID)
		must.NoError(t, err)
		must.NotNil(t, got, must.Sprintf("node %s missing on the new leader", n.Name))
		must.Eq(t, got.CreateIndex, got.ModifyIndex, must.Sprintf("node %s written more than once", n.Name))
	}
}

// A lone server has nobody to hand over to, but still lets its in-flight
// controller call finish (and reach its checkpoint) before Raft stops.
func TestHandoff_LoneServerDrainsOnShutdown(t *testing.T) {
	s := testServer(t, nil)
	waitForLeaderDuties(t, s)
	release, finished := holdControllerCall(t, s)

	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return s.lanes.Load() == nil }),
		wait.Timeout(5*time.Second), wait.Gap(5*time.Millisecond)))
	select {
	case err := <-done:
		t.Fatalf("shutdown finished while a controller call was in flight: %v", err)
	default:
	}
	close(release)
	<-finished
	must.NoError(t, <-done)
}

// One handoff at a time: a second waits for the first (as long as its
// context allows) instead of running alongside it. The leadership owner
// serializes them; it goes on answering (here, a third caller's claim
// that gives up) while one waits.
func TestHandoff_OneAtATime(t *testing.T) {
	s := testServer(t, nil)
	waitForLeaderDuties(t, s)
	must.NoError(t, s.claimLeadership(context.Background()))

	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	t.Cleanup(cancel)
	err := s.claimLeadership(short)
	must.ErrorIs(t, err, context.DeadlineExceeded, must.Sprint("a second handoff ran alongside the first"))

	second := make(chan error, 1)
	go func() { second <- s.claimLeadership(context.Background()) }()
	select {
	case err := <-second:
		t.Fatalf("second handoff started while the first ran: %v", err)
	default:
	}
	// The owner still answers while the second waits.
	short2, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	t.Cleanup(cancel2)
	must.ErrorIs(t, s.claimLeadership(short2), context.DeadlineExceeded)
	must.Eq(t, stateLeading, s.currentLeaderState(), must.Sprint("a claim alone must not stop the duties"))

	s.releaseLeadership(context.Background(), false, false)
	select {
	case err := <-second:
		must.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("second handoff still waiting after the first ended")
	}
	s.releaseLeadership(context.Background(), false, false)
	must.NotNil(t, s.lanes.Load(), must.Sprint("claims that stopped nothing changed the duties"))
}
