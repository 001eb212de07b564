package nomad

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/structs"
)

// countingEcho is a client RPC service that counts the calls it runs.
type countingEcho struct{ calls atomic.Int64 }

func (e *countingEcho) Say(args string, reply *string) error {
	e.calls.Add(1)
	*reply = args
	return nil
}

// A server relaying a controller call refuses one stamped with a leader
// term below its own: it comes from a deposed leader and arrived late. The
// call from the current term goes through.
func TestClientRPC_RelayRefusesAStaleLeaderTerm(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	first := waitForLeader(t, servers...)
	// A second term, so that there is an earlier non-zero one.
	must.NoError(t, first.raft.LeadershipTransfer().Error())
	leader := waitForLeader(t, servers...)
	relay := followers(servers)[0]
	term := relay.raft.CurrentTerm()
	must.Greater(t, uint64(1), term)

	c := testAgentClient(t, relay.Addr())
	echo := &countingEcho{}
	must.NoError(t, c.RegisterRPC("Echo", echo))
	waitNodeSession(t, relay, c.NodeID(), true)
	_, ok := leader.nodeSession(c.NodeID())
	must.False(t, ok, must.Sprint("the call must go through the relay"))

	var out string
	current := context.WithValue(testCtx(t), leaderTermKey{}, term)
	must.NoError(t, leader.clientRPC(current, c.NodeID(), "Echo.Say", "now", &out))
	must.Eq(t, int64(1), echo.calls.Load())

	stale := context.WithValue(testCtx(t), leaderTermKey{}, term-1)
	err := leader.clientRPC(stale, c.NodeID(), "Echo.Say", "late", &out)
	must.ErrorIs(t, err, structs.ErrStaleLeaderTerm)
	must.True(t, structs.IsRetryable(err))
	must.StrContains(t, err.Error(), "not relayed")
	must.Eq(t, int64(1), echo.calls.Load(), must.Sprint("the relay passed on a deposed leader's call"))

	// A call from outside a lane carries no term and is not checked.
	must.NoError(t, leader.clientRPC(testCtx(t), c.NodeID(), "Echo.Say", "read", &out))
	must.Eq(t, int64(2), echo.calls.Load())
}

// The calls a leader's lanes make carry the Raft term it leads in.
func TestOnController_StampsTheLeaderTerm(t *testing.T) {
	s := testServer(t, nil)
	waitForLeaderDuties(t, s)
	healthy := true
	n := ctrlNode("node-a", structs.NodeStatusReady, &healthy)
	n.SecretID = "secret-node-a"
	_, _, err := s.raftApply(structs.NodeRegisterRequestType, &structs.NodeRegisterRequest{Node: n})
	must.NoError(t, err)

	var got structs.CSIControllerQuery
	must.NoError(t, s.onController(testCtx(t), testPlugin, "publish", laneadmit.Call{}, nil, func(ctx context.Context, cn *structs.Node) error {
		got = controllerQuery(ctx, cn)
		return nil
	}))
	must.Eq(t, "node-a", got.ControllerNodeID)
	must.Positive(t, got.LeaderTerm)
	must.Eq(t, s.raft.CurrentTerm(), got.LeaderTerm)
	must.Eq(t, uint64(0), controllerQuery(testCtx(t), n).LeaderTerm, must.Sprint("no term outside a lane"))
}

// A heartbeat answer carries the leader's term, so that a node back from an
// outage refuses a deposed leader's calls that were still on their way.
func TestNodeHeartbeat_CarriesTheLeaderTerm(t *testing.T) {
	s := testServer(t, nil)
	waitForLeaderDuties(t, s)
	resp := registerNode(t, s, testNode("n1"))
	must.Positive(t, resp.LeaderTerm)
	must.Eq(t, s.lanes.Load().term, resp.LeaderTerm)
}

// A node that remembers a leader term above the leader's own (its servers
// were rebuilt from a snapshot, and their terms started again) is told to
// start from the leader's term, once the leader has verified that it
// leads; a node whose term is not above gets no reset.
func TestNodeHeartbeat_ResetsATermFromRebuiltServers(t *testing.T) {
	s := testServer(t, nil)
	waitForLeaderDuties(t, s)
	term := s.lanes.Load().term
	n := testNode("n1")
	registerNode(t, s, n)

	beat := func(nodeTerm uint64) structs.NodeUpdateResponse {
		var resp structs.NodeUpdateResponse
		must.NoError(t, s.RPC("Node.UpdateStatus", &structs.NodeUpdateStatusRequest{
			NodeID: n.ID, Status: structs.NodeStatusReady, CSILeaderTerm: nodeTerm,
			WriteRequest: structs.WriteRequest{AuthToken: n.SecretID},
		}, &resp))
		return resp
	}
	resp := beat(term + 40)
	must.Eq(t, term, resp.LeaderTerm)
	must.Eq(t, term+40, resp.LeaderTermResetFrom)
	for _, nodeTerm := range []uint64{0, term} {
		resp = beat(nodeTerm)
		must.Eq(t, term, resp.LeaderTerm)
		must.Eq(t, uint64(0), resp.LeaderTermResetFrom)
	}
}

// The reset vouches only for the term the leader verified: lanes left from
// an earlier term (the leadership loop not yet caught up with Raft) give
// no reset, whatever the client reports.
func TestNodeHeartbeat_NoResetFromLanesOfAnEarlierTerm(t *testing.T) {
	s := testServer(t, nil)
	waitForLeaderDuties(t, s)
	n := testNode("n1")
	registerNode(t, s, n)
	current := s.raft.CurrentTerm()
	must.Greater(t, uint64(1), current)
	stale := newControllerLanes(testCtx(t), csiCallTimeout, nil)
	stale.term = current - 1
	s.lanes.Store(stale)

	var resp structs.NodeUpdateResponse
	err := s.RPC("Node.UpdateStatus", &structs.NodeUpdateStatusRequest{
		NodeID: n.ID, Status: structs.NodeStatusReady, CSILeaderTerm: current,
		WriteRequest: structs.WriteRequest{AuthToken: n.SecretID},
	}, &resp)
	must.ErrorIs(t, err, structs.ErrNoLeader)
	must.Eq(t, uint64(0), resp.LeaderTermResetFrom)
}
