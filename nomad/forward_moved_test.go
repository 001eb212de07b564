package nomad

import (
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// A blocking query a follower forwarded to the leader must not stay with
// that server once the leader has moved. Here the leader is cut off from
// Raft but its RPC connections stay open (as with packets dropped by a
// partition, where nothing closes the connection): the query it holds
// would hang until its own wait, minutes, while the new leader's writes go
// unseen. Scenario 4 of the partition suite hit this: clients whose
// allocation queries went through a follower to the old leader never heard
// their allocations were stopped.
func TestForward_QueryFollowsTheLeaderWhenItMoves(t *testing.T) {
	t.Parallel()
	countBlockedQueriesAlone(t)
	c := testMemClusterWith(t, 3, withLongHeartbeats)
	leader := waitForLeaderDuties(t, c.servers...)
	follower := followers(c.servers)[0]
	registerNodeRetry(t, leader, testNode("first"))

	var now structs.NodeListResponse
	must.NoError(t, leader.RPC("Node.List", &structs.NodeListRequest{}, &now))
	q := &structs.NodeListRequest{QueryOptions: structs.QueryOptions{MinQueryIndex: now.Index, MaxQueryTime: 10 * time.Minute}}
	type result struct {
		resp structs.NodeListResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = follower.RPCContext(t.Context(), "Node.List", q, &r.resp)
		done <- r
	}()
	waitForBlockedQueries(t, 1)
	must.Eq(t, 1, leader.queryCancels.len(), must.Sprint("the query is held by the leader"))

	// Cut Raft between the leader and the others, both ways; RPC stays up.
	for _, o := range c.others(leader) {
		c.mem.RaftTransport(leader.Addr()).Disconnect(raft.ServerAddress(o.Addr()))
		c.mem.RaftTransport(o.Addr()).Disconnect(raft.ServerAddress(leader.Addr()))
	}
	next := waitForLeaderDuties(t, c.others(leader)...)
	second := testNode("second")
	registerNodeRetry(t, next, second)

	select {
	case r := <-done:
		must.NoError(t, r.err)
		must.Greater(t, now.Index, r.resp.Index)
		var ids []string
		for _, n := range r.resp.Nodes {
			ids = append(ids, n.ID)
		}
		must.SliceContains(t, ids, second.ID, must.Sprint("the answer comes from the new leader's state"))
	case <-time.After(30 * time.Second):
		t.Fatal("the forwarded query stayed with the cut-off old leader after the leader moved")
	}
}
