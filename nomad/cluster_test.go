package nomad

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

func testNode(name string) *structs.Node {
	return &structs.Node{
		ID:         uuid.NewString(),
		SecretID:   uuid.NewString(),
		Name:       name,
		Datacenter: "dc1",
		Status:     structs.NodeStatusReady,
		Attributes: map[string]string{"os.name": "linux"},
	}
}

func registerNode(t *testing.T, s *Server, n *structs.Node) *structs.NodeUpdateResponse {
	t.Helper()
	var resp structs.NodeUpdateResponse
	must.NoError(t, s.RPC("Node.Register", &structs.NodeRegisterRequest{Node: n}, &resp))
	return &resp
}

func TestCluster_ElectsOneLeader(t *testing.T) {
	t.Parallel()
	servers := testMemCluster(t, 3).servers
	leader := waitForLeader(t, servers...)
	must.Len(t, 2, followers(servers))

	var peers []string
	must.NoError(t, leader.RPC("Status.Peers", &structs.GenericRequest{}, &peers))
	must.Len(t, 3, peers)

	var members structs.ServerMembersResponse
	must.NoError(t, servers[0].RPC("Status.Members", &structs.GenericRequest{}, &members))
	must.Len(t, 3, members.Members)
	leaders := 0
	for _, m := range members.Members {
		must.Eq(t, structs.MemberAlive, m.Status)
		if m.Leader {
			leaders++
		}
	}
	must.Eq(t, 1, leaders)
}

func TestCluster_FollowerForwardsWrites(t *testing.T) {
	t.Parallel()
	servers := testMemCluster(t, 3).servers
	follower := followers(servers)[0]
	leader := waitForLeader(t, servers...)

	node := testNode("forwarded")
	resp := registerNode(t, follower, node)
	must.Positive(t, resp.Index)
	must.Positive(t, resp.HeartbeatTTL)

	got, err := leader.State().NodeByID(nil, node.ID)
	must.NoError(t, err)
	must.NotNil(t, got)
	must.Eq(t, node.Name, got.Name)

	// A non-stale read on the follower goes to the leader and sees the write.
	var list structs.NodeListResponse
	must.NoError(t, follower.RPC("Node.List", &structs.NodeListRequest{}, &list))
	must.Len(t, 1, list.Nodes)
	must.True(t, list.KnownLeader)
	must.GreaterEq(t, resp.Index, list.Index)
}

func TestCluster_NewLeaderKeepsCommittedWrites(t *testing.T) {
	t.Parallel()
	servers := testMemCluster(t, 3).servers
	leader := waitForLeader(t, servers...)
	var ids []string
	for i := range 20 {
		n := testNode(fmt.Sprintf("n%d", i))
		registerNode(t, servers[i%3], n)
		ids = append(ids, n.ID)
	}

	must.NoError(t, leader.Shutdown(context.Background()))
	var rest []*Server
	for _, s := range servers {
		if s != leader {
			rest = append(rest, s)
		}
	}
	newLeader := waitForLeader(t, rest...)
	must.NotEq(t, leader.ID(), newLeader.ID())

	for _, s := range rest {
		// Followers may apply a little behind the leader: wait for them.
		must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
			for _, id := range ids {
				n, err := s.State().NodeByID(nil, id)
				if err != nil || n == nil {
					return fmt.Errorf("server %s is missing node %s (%v)", s.ID(), id, err)
				}
			}
			return nil
		}), wait.Timeout(5*time.Second), wait.Gap(10*time.Millisecond)))
	}

	// The cluster still takes writes.
	registerNode(t, rest[0], testNode("after-failover"))
}

func TestCluster_RestartedFollowerCatchesUp(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	follower := followers(servers)[0]
	cfg := follower.Config()
	addr := follower.Addr()
	must.NoError(t, follower.Shutdown(context.Background()))

	var ids []string
	live := []*Server{}
	for _, s := range servers {
		if s != follower {
			live = append(live, s)
		}
	}
	for i := range 10 {
		n := testNode(fmt.Sprintf("while-down-%d", i))
		registerNode(t, live[i%2], n)
		ids = append(ids, n.ID)
	}

	// Restart on the same data dir and address.
	ln, err := net.Listen("tcp", addr)
	must.NoError(t, err)
	restarted := testServer(t, func(c *Config) {
		*c = *cfg
		c.Listener = ln
	})
	must.Eq(t, follower.ID(), restarted.ID())

	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		for _, id := range ids {
			n, err := restarted.State().NodeByID(nil, id)
			if err != nil || n == nil {
				return fmt.Errorf("restarted server is missing node %s (%v)", id, err)
			}
		}
		return nil
	}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))
	must.False(t, restarted.IsLeader())
	waitForLeader(t, append(live, restarted)...)
}
