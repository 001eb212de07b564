package nomad

import (
	"fmt"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// hasNode reports as an error whether s has applied the registration of
// the node with id.
func hasNode(s *Server, id string) error {
	n, err := s.State().NodeByID(nil, id)
	if err != nil {
		return err
	}
	if n == nil {
		return fmt.Errorf("server %s has not applied node %s", s.ID(), id)
	}
	return nil
}

// waitHasNode waits until every one of servers has applied node id.
func waitHasNode(t *testing.T, id string, servers ...*Server) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			for _, s := range servers {
				if err := hasNode(s, id); err != nil {
					return err
				}
			}
			return nil
		}),
		wait.Timeout(10*time.Second),
		wait.Gap(10*time.Millisecond),
	))
}

// waitNotLeader waits until s has stepped down.
func waitNotLeader(t *testing.T, s *Server) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return !s.IsLeader() }),
		wait.Timeout(10*time.Second),
		wait.Gap(10*time.Millisecond),
	), must.Sprintf("server %s still leads while cut off from the quorum", s.ID()))
}

func TestMemCluster_ElectsOneLeader(t *testing.T) {
	t.Parallel()
	c := testMemCluster(t, 3)
	leader := waitForLeader(t, c.servers...)
	future := leader.Raft().GetConfiguration()
	must.NoError(t, future.Error())
	must.Len(t, 3, future.Configuration().Servers)

	// A write through a follower is forwarded over the in-memory RPC
	// network and replicated over the in-memory Raft transport.
	n := testNode("mem-1")
	registerNode(t, followers(c.servers)[0], n)
	waitHasNode(t, n.ID, c.servers...)
}

// A leader cut off from both followers steps down; the two elect a new
// leader that takes writes, and the old one refuses writes rather than
// accepting what it cannot commit.
func TestMemCluster_PartitionedLeader(t *testing.T) {
	t.Parallel()
	c := testMemCluster(t, 3)
	old := waitForLeader(t, c.servers...)
	rest := c.others(old)

	c.Isolate(old)
	waitNotLeader(t, old)
	leader := waitForLeader(t, rest...)
	must.NotEq(t, old.ID(), leader.ID())

	n := testNode("majority-side")
	registerNodeRetry(t, rest[0], n)
	waitHasNode(t, n.ID, rest...)
	must.Error(t, hasNode(old, n.ID), must.Sprint("the cut-off server applied a write it could not have received"))

	// The minority side has no leader: a write there fails with a
	// retryable error once the hold timeout passes, and stores nothing.
	lost := testNode("minority-side")
	var resp structs.NodeUpdateResponse
	err := old.RPC("Node.Register", &structs.NodeRegisterRequest{Node: lost}, &resp)
	must.Error(t, err)
	must.True(t, structs.IsRetryable(err), must.Sprintf("write on the minority side: %v", err))
	for _, s := range c.servers {
		must.Error(t, hasNode(s, lost.ID), must.Sprintf("server %s stored a write from the minority side", s.ID()))
	}
}

// A follower cut off from the others: the two that still form a quorum
// take writes, the cut-off one never leads and never applies them, and it
// has no leader to forward its own writes to. Raft runs with the steady
// timers: on a loaded machine the 250 ms ones can make the remaining pair
// hold an election too, which is not what this test is about.
func TestMemCluster_PartitionedFollower(t *testing.T) {
	t.Parallel()
	c := testMemClusterWith(t, 3, withSteadyRaft)
	waitForLeader(t, c.servers...)
	cut := followers(c.servers)[0]
	other := c.others(cut)

	c.Isolate(cut)
	for i := range 5 {
		n := testNode(fmt.Sprintf("while-cut-%d", i))
		registerNodeRetry(t, other[i%2], n)
		waitHasNode(t, n.ID, other...)
		must.Error(t, hasNode(cut, n.ID))
		must.False(t, cut.IsLeader(), must.Sprint("a server cut off from the quorum leads"))
	}

	// The cut-off follower's own write cannot reach a leader.
	var resp structs.NodeUpdateResponse
	err := cut.RPC("Node.Register", &structs.NodeRegisterRequest{Node: testNode("from-cut")}, &resp)
	must.Error(t, err)
	must.True(t, structs.IsRetryable(err), must.Sprintf("write on the cut-off follower: %v", err))
}

// After a heal the cut-off server rejoins as a follower, catches up with
// every write made without it, and the cluster agrees on one leader.
func TestMemCluster_Heal(t *testing.T) {
	t.Parallel()
	c := testMemCluster(t, 3)
	old := waitForLeader(t, c.servers...)
	rest := c.others(old)

	c.Isolate(old)
	waitNotLeader(t, old)
	waitForLeader(t, rest...)
	var ids []string
	for i := range 5 {
		n := testNode(fmt.Sprintf("during-%d", i))
		registerNodeRetry(t, rest[i%2], n)
		ids = append(ids, n.ID)
	}

	c.HealAll()
	waitForLeader(t, c.servers...)
	for _, id := range ids {
		waitHasNode(t, id, c.servers...)
	}
	n := testNode("after-heal")
	registerNodeRetry(t, old, n)
	waitHasNode(t, n.ID, c.servers...)
}

// A one-way cut from the leader to one follower: the follower hears no
// heartbeats, but its own messages still reach the leader. The cluster
// must still end with one leader that all three accept once healed, and
// no write may be lost.
func TestMemCluster_OneWayCut(t *testing.T) {
	t.Parallel()
	c := testMemCluster(t, 3)
	leader := waitForLeader(t, c.servers...)
	follower := followers(c.servers)[0]

	c.Cut(leader, follower)
	var ids []string
	for i := range 3 {
		n := testNode(fmt.Sprintf("one-way-%d", i))
		// Whoever leads, the write is forwarded there or retried.
		registerNodeRetry(t, c.others(follower)[i%2], n)
		ids = append(ids, n.ID)
	}
	c.HealAll()
	waitForLeader(t, c.servers...)
	for _, id := range ids {
		waitHasNode(t, id, c.servers...)
	}
}

// A Raft transport whose address is not the advertised one would make
// peers send Raft to a server that is not there; NewServer refuses it.
func TestMemCluster_RaftTransportAddressMustMatch(t *testing.T) {
	c := startMemCluster(t, 1, nil)
	cfg := TestConfig(t)
	cfg.Listener = c.mem.Listen(t, "127.77.0.9:4647")
	cfg.Dial = c.mem.Dialer("127.77.0.9:4647")
	cfg.RaftTransport = c.mem.RaftTransport(c.servers[0].Addr())
	_, err := NewServer(cfg)
	must.ErrorContains(t, err, "is not the advertised rpc address")
}

// A server whose Raft travels on another transport refuses Raft on its
// RPC port: nothing there would ever take the connection, and it would
// stay open and counted against the caller's connections.
func TestMemCluster_RaftByteRefusedWhenRaftElsewhere(t *testing.T) {
	t.Parallel()
	c := testMemCluster(t, 1)
	conn := rawConn(t, c.servers[0], structs.RPCRaft)
	requireConnClosed(t, conn)
}
