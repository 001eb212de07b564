package nomad

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/structs"
)

// A leader that loses leadership while a controller call it sent to node-b
// is still running there (cut off, paused): the new leader must keep the
// plugin's calls on node-b — whose client lane queues them behind the
// running one — although node-a comes first in the usual order, until a
// call on node-b is answered. Then the usual order applies again.
func TestControllerFence_SurvivesLeaderChange(t *testing.T) {
	t.Parallel()
	leader := leaderAfterCallOnNodeB(t)
	var called []string
	record := func(ctx context.Context, n *structs.Node) error {
		called = append(called, n.ID)
		return nil
	}
	must.NoError(t, leader.onController(context.Background(), testPlugin, "publish", laneadmit.Call{}, nil, record))
	must.Eq(t, []string{"node-b"}, called, must.Sprint("the new leader called another controller while node-b may still run the old leader's call"))

	// node-b answered: its lane is idle, and the usual order is back.
	must.NoError(t, leader.onController(context.Background(), testPlugin, "publish", laneadmit.Call{}, nil, record))
	must.Eq(t, []string{"node-b", "node-a"}, called)
	rec, err := leader.State().CSIControllerFence(nil, testPlugin)
	must.NoError(t, err)
	must.Eq(t, "node-a", rec.NodeID, must.Sprint("the fence follows the calls"))
}

// With a lane of several calls on node-b, an answer there while an
// earlier call still runs in that lane (LaneBusyBefore) is no sign the old
// leader's call has ended: the fence holds until an answer says no
// earlier call is left.
func TestControllerFence_HoldsWhileTheLaneSaysEarlierCallsRun(t *testing.T) {
	t.Parallel()
	leader := leaderAfterCallOnNodeB(t)
	var called []string
	answer := func(busy bool) (*structs.CSIControllerReply, func(context.Context, *structs.Node) error) {
		reply := &structs.CSIControllerReply{}
		return reply, func(ctx context.Context, n *structs.Node) error {
			called = append(called, n.ID)
			reply.LaneBusyBefore = busy
			return nil
		}
	}
	for range 2 {
		reply, call := answer(true)
		must.NoError(t, leader.onController(context.Background(), testPlugin, "publish", laneadmit.Call{Volume: "v"}, reply, call))
	}
	must.Eq(t, []string{"node-b", "node-b"}, called, must.Sprint("the fence lifted on an answer from a lane that still ran an earlier call"))

	reply, call := answer(false)
	must.NoError(t, leader.onController(context.Background(), testPlugin, "publish", laneadmit.Call{Volume: "v"}, reply, call))
	reply, call = answer(false)
	must.NoError(t, leader.onController(context.Background(), testPlugin, "publish", laneadmit.Call{Volume: "v"}, reply, call))
	must.Eq(t, []string{"node-b", "node-b", "node-b", "node-a"}, called, must.Sprint("node-b's lane drained: the usual order is back"))
}

// leaderAfterCallOnNodeB starts a 3-server cluster with controllers on
// node-a and node-b, has the leader send a call that node-a cannot take
// and that hangs on node-b until the test ends, moves leadership away, and
// returns the new leader, which holds the fence record naming node-b.
func leaderAfterCallOnNodeB(t *testing.T) *Server {
	t.Helper()
	servers := testMemClusterWith(t, 3, withLongHeartbeats).servers
	old := waitForLeaderDuties(t, servers...)
	healthy := true
	for _, id := range []string{"node-a", "node-b"} {
		n := ctrlNode(id, structs.NodeStatusReady, &healthy)
		n.SecretID = "secret-" + id
		_, _, err := old.raftApply(structs.NodeRegisterRequestType, &structs.NodeRegisterRequest{Node: n})
		must.NoError(t, err)
	}

	// The old leader's call: node-a's controller cannot be reached, so it
	// goes to node-b, where it hangs.
	started, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = old.onController(context.Background(), testPlugin, "publish", laneadmit.Call{}, nil, func(ctx context.Context, n *structs.Node) error {
			if n.ID == "node-a" {
				return structs.ErrCSIPluginNotFound
			}
			close(started)
			<-release
			return nil
		})
	}()
	t.Cleanup(func() { wg.Wait() })
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	<-started

	leader := transferLeadership(t, servers, old)
	rec, err := leader.State().CSIControllerFence(nil, testPlugin)
	must.NoError(t, err)
	must.NotNil(t, rec)
	must.Eq(t, "node-b", rec.NodeID)
	return leader
}

// The recorded fence pins to its node while the node is a candidate, tells
// callers to come back while it is not (and not down), and lifts once the
// node is down or gone.
func TestRecordedFenceCandidates(t *testing.T) {
	healthy := true
	a := ctrlNode("a", structs.NodeStatusReady, &healthy)
	b := ctrlNode("b", structs.NodeStatusReady, &healthy)
	rec := &structs.CSIControllerFence{PluginID: testPlugin, NodeID: "b"}

	got, err := recordedFenceCandidates(testPlugin, slices.Values([]*structs.Node{a, b}), rec, b)
	must.NoError(t, err)
	must.Eq(t, []string{"b"}, nodeIDs(slices.Collect(got)))

	_, err = recordedFenceCandidates(testPlugin, slices.Values([]*structs.Node{a}), rec, b)
	must.ErrorIs(t, err, structs.ErrClaimInProgress)
	must.True(t, structs.IsRetryable(err))
	must.StrContains(t, err.Error(), "node b")

	down := ctrlNode("b", structs.NodeStatusDown, &healthy)
	got, err = recordedFenceCandidates(testPlugin, slices.Values([]*structs.Node{a}), rec, down)
	must.NoError(t, err)
	must.Eq(t, []string{"a"}, nodeIDs(slices.Collect(got)))

	got, err = recordedFenceCandidates(testPlugin, slices.Values([]*structs.Node{a}), rec, nil)
	must.NoError(t, err)
	must.Eq(t, []string{"a"}, nodeIDs(slices.Collect(got)))
}

// transferLeadership moves leadership off old and returns the server that
// takes it, once its lanes are open.
func transferLeadership(t *testing.T, servers []*Server, old *Server) *Server {
	t.Helper()
	must.NoError(t, old.raft.LeadershipTransfer().Error())
	var leader *Server
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		for _, s := range servers {
			if s != old && s.IsLeader() && s.lanes.Load() != nil {
				leader = s
				return true
			}
		}
		return false
	}), wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond)))
	return leader
}
