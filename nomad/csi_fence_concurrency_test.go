package nomad

import (
	"context"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/structs"
)

// wideControllers registers node-a and node-b as healthy controllers of
// testPlugin with controller_concurrency 4, on a 3-server cluster, has a
// call answered on node-a, and returns the servers and the leader.
func wideControllers(t *testing.T) ([]*Server, *Server) {
	t.Helper()
	servers := testMemClusterWith(t, 3, withLongHeartbeats).servers
	leader := waitForLeaderDuties(t, servers...)
	healthy := true
	for _, id := range []string{"node-a", "node-b"} {
		n := ctrlNode(id, structs.NodeStatusReady, &healthy)
		n.CSIControllerPlugins[testPlugin].ControllerConcurrency = 4
		n.SecretID = "secret-" + id
		_, _, err := leader.raftApply(structs.NodeRegisterRequestType, &structs.NodeRegisterRequest{Node: n})
		must.NoError(t, err)
	}
	p, err := leader.State().CSIPluginByID(nil, testPlugin)
	must.NoError(t, err)
	must.EqOp(t, 4, leader.laneLimit(leader.lanes.Load(), p), must.Sprint("the lane runs the plugin's 4"))
	// A call answered on node-a: the plugin's calls are free to move, as
	// in a cluster that has been running.
	must.NoError(t, leader.onController(context.Background(), testPlugin, "publish", laneadmit.Call{Volume: "v0", Node: "w"}, &structs.CSIControllerReply{},
		func(context.Context, *structs.Node) error { return nil }))
	return servers, leader
}

// hangOnNodeA sends a call on volume v1 that runs on node-a until the
// test ends or release is closed, and returns once it runs.
func hangOnNodeA(t *testing.T, s *Server, result func(ctx context.Context) error) (release chan struct{}, done chan error) {
	t.Helper()
	started, finished := make(chan struct{}), make(chan struct{})
	release, done = make(chan struct{}), make(chan error, 1)
	go func() {
		defer close(finished)
		done <- s.onController(context.Background(), testPlugin, "publish", laneadmit.Call{Volume: "v1", Node: "x"}, &structs.CSIControllerReply{},
			func(ctx context.Context, n *structs.Node) error {
				close(started)
				<-release
				return result(ctx)
			})
	}()
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
		<-finished
	})
	<-started
	return release, done
}

// With several calls at once, a call that cannot reach node-a while
// another call of the plugin runs there does not go to node-b: it is
// refused, retryable, and the fences keep naming the one node with calls
// in flight. Once none runs there, calls may move.
func TestControllerFence_ConcurrentCallsStayOnTheirNode(t *testing.T) {
	t.Parallel()
	_, s := wideControllers(t)
	release, done := hangOnNodeA(t, s, func(context.Context) error { return structs.ErrOutcomeUnknown })

	var called []string
	notOnA := func(ctx context.Context, n *structs.Node) error {
		called = append(called, n.ID)
		if n.ID == "node-a" {
			return structs.ErrNodeNotConnected
		}
		return nil
	}
	err := s.onController(context.Background(), testPlugin, "publish", laneadmit.Call{Volume: "v2", Node: "y"}, &structs.CSIControllerReply{}, notOnA)
	must.ErrorIs(t, err, structs.ErrClaimInProgress)
	must.True(t, structs.IsRetryable(err))
	must.Eq(t, []string{"node-a"}, called, must.Sprint("a call went to node-b while another ran on node-a"))
	rec, err := s.State().CSIControllerFence(nil, testPlugin)
	must.NoError(t, err)
	must.EqOp(t, "node-a", rec.NodeID)

	// node-a's call ends, outcome unknown: the plugin's calls stay there
	// until one succeeds there.
	close(release)
	must.ErrorIs(t, <-done, structs.ErrOutcomeUnknown)
	called = nil
	err = s.onController(context.Background(), testPlugin, "publish", laneadmit.Call{Volume: "v2", Node: "y"}, &structs.CSIControllerReply{}, notOnA)
	must.Error(t, err)
	must.Eq(t, []string{"node-a"}, called, must.Sprint("the fence on node-a did not hold"))

	// A success on node-a from a lane with nothing earlier left lifts it;
	// then a call node-a cannot take moves on.
	must.NoError(t, s.onController(context.Background(), testPlugin, "publish", laneadmit.Call{Volume: "v3", Node: "z"}, &structs.CSIControllerReply{},
		func(context.Context, *structs.Node) error { return nil }))
	called = nil
	must.NoError(t, s.onController(context.Background(), testPlugin, "publish", laneadmit.Call{Volume: "v2", Node: "y"}, &structs.CSIControllerReply{}, notOnA))
	must.Eq(t, []string{"node-a", "node-b"}, called)
}

// The same across a leader change: the old leader's call still runs on
// node-a, and the recorded fence must name node-a, not the node a
// concurrent call might have moved to.
func TestControllerFence_ConcurrentCallsRecordTheirNodeForTheNextLeader(t *testing.T) {
	t.Parallel()
	servers, old := wideControllers(t)
	hangOnNodeA(t, old, func(context.Context) error { return nil })
	err := old.onController(context.Background(), testPlugin, "publish", laneadmit.Call{Volume: "v2", Node: "y"}, &structs.CSIControllerReply{},
		func(ctx context.Context, n *structs.Node) error {
			if n.ID == "node-a" {
				return structs.ErrNodeNotConnected
			}
			return nil
		})
	must.ErrorIs(t, err, structs.ErrClaimInProgress)

	leader := transferLeadership(t, servers, old)
	var called []string
	must.NoError(t, leader.onController(context.Background(), testPlugin, "unpublish", laneadmit.Call{Volume: "v1", Node: "x"}, &structs.CSIControllerReply{},
		func(ctx context.Context, n *structs.Node) error {
			called = append(called, n.ID)
			return nil
		}))
	must.Eq(t, []string{"node-a"}, called, must.Sprint("the new leader sent v1 away from node-a, where the old leader's call on v1 still runs"))
}
