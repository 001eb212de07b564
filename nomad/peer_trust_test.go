package nomad

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// An empty token is nobody: it deregisters no node. A node deregisters only
// itself; the operator token, when configured, any node.
func TestPeerTrust_DeregisterNeedsNodeSecretOrOperator(t *testing.T) {
	s := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.OperatorToken = "op-secret"
	})
	waitForLeaderDuties(t, s)
	a, b := testNode("a"), testNode("b")
	registerNodeRetry(t, s, a)
	registerNodeRetry(t, s, b)

	dereg := func(token string, ids ...string) error {
		var resp structs.GenericResponse
		return s.RPC("Node.Deregister", &structs.NodeDeregisterRequest{NodeIDs: ids,
			WriteRequest: structs.WriteRequest{AuthToken: token}}, &resp)
	}
	must.ErrorIs(t, dereg("", a.ID), structs.ErrPermissionDenied)
	must.ErrorIs(t, dereg("guess", a.ID), structs.ErrPermissionDenied)
	must.ErrorIs(t, dereg(b.SecretID, a.ID), structs.ErrPermissionDenied)
	for _, n := range []*structs.Node{a, b} {
		got, err := s.State().NodeByID(nil, n.ID)
		must.NoError(t, err)
		must.NotNil(t, got, must.Sprintf("node %s removed by a refused request", n.Name))
	}

	must.NoError(t, dereg(a.SecretID, a.ID))
	must.NoError(t, dereg("op-secret", b.ID))
	for _, n := range []*structs.Node{a, b} {
		got, err := s.State().NodeByID(nil, n.ID)
		must.NoError(t, err)
		must.Nil(t, got)
	}
}

// Without an operator token configured nobody is an operator, not even a
// caller that sends an empty one.
func TestPeerTrust_NoOperatorWithoutToken(t *testing.T) {
	s := testServer(t, nil)
	must.False(t, s.isOperator(""))
	must.False(t, s.isOperator("anything"))
	s.config.OperatorToken = "op"
	must.False(t, s.isOperator(""))
	must.False(t, s.isOperator("op2"))
	must.True(t, s.isOperator("op"))
}

// Servers that name client intro tokens take a new node only with one; a
// known node re-registers with its secret alone.
func TestPeerTrust_NewNodeNeedsIntroToken(t *testing.T) {
	s := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.ClientIntroTokens = []string{"intro-1", "intro-2"}
	})
	waitForLeaderDuties(t, s)
	reg := func(n *structs.Node, intro string) error {
		var resp structs.NodeUpdateResponse
		return s.RPC("Node.Register", &structs.NodeRegisterRequest{Node: n.Copy(), IntroToken: intro}, &resp)
	}
	n := testNode("new")
	err := reg(n, "")
	must.ErrorIs(t, err, structs.ErrPermissionDenied)
	must.ErrorContains(t, err, "intro token")
	must.ErrorIs(t, reg(n, "intro-3"), structs.ErrPermissionDenied)
	got, err := s.State().NodeByID(nil, n.ID)
	must.NoError(t, err)
	must.Nil(t, got)

	must.NoError(t, reg(n, "intro-2"))
	must.NoError(t, reg(n, ""), must.Sprint("a known node re-registers with its secret"))
	n.SecretID = uuid.NewString()
	must.ErrorIs(t, reg(n, "intro-1"), structs.ErrPermissionDenied)
}

// ClientRPC.Forward reaches a node only for a caller that shows the node's
// secret, as servers do.
func TestPeerTrust_ForwardNeedsNodeSecret(t *testing.T) {
	s := testServer(t, nil)
	waitForLeaderDuties(t, s)
	c := testAgentClient(t, s.Addr())
	waitNodeSession(t, s, c.NodeID(), true)

	var ping []byte
	must.NoError(t, codec.NewEncoderBytes(&ping, structs.MsgpackHandle).Encode(&structs.GenericRequest{}))
	fwd := func(token string) error {
		var resp structs.ClientRPCForwardResponse
		return s.RPC("ClientRPC.Forward", &structs.ClientRPCForwardRequest{NodeID: c.NodeID(), Method: "ClientStatus.Ping",
			Args: ping, Timeout: 10 * time.Second, WriteRequest: structs.WriteRequest{AuthToken: token}}, &resp)
	}
	for _, token := range []string{"", uuid.NewString()} {
		err := fwd(token)
		must.ErrorIs(t, err, structs.ErrPermissionDenied)
		must.ErrorContains(t, err, "not a server")
	}
	must.NoError(t, fwd(c.SecretID()))
}

// A Join names an address to probe; it makes nobody a member, so the
// leader adds no voter for it.
func TestPeerTrust_JoinAddsNoMemberUntilProbed(t *testing.T) {
	s := testServer(t, nil)
	waitForLeaderDuties(t, s)
	made := structs.ServerMember{ID: uuid.NewString(), Name: "made-up", Addr: "127.0.0.1:1", Region: s.config.Region}
	var resp structs.ServerJoinResponse
	must.NoError(t, s.RPC("Status.Join", &structs.ServerJoinRequest{Member: made}, &resp))
	for _, m := range s.members.list() {
		must.NotEq(t, made.ID, m.ID)
	}
	s.reconcileVoters()
	cfg, _, err := s.raftConfiguration()
	must.NoError(t, err)
	must.SliceLen(t, 1, cfg.Servers)
	must.Eq(t, raft.ServerID(s.ID()), cfg.Servers[0].ID)
}

// Raft RPCs are vetted by who the header says sent them.
func TestPeerTrust_RaftRPCFromStrangerRefused(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	leader := waitForLeader(t, servers...)
	f := followers(servers)[0]

	ok := f.callerIsServer(trustedPeer{raftID: leader.ID(), raftAddr: leader.Addr()})
	must.NoError(t, ok)
	must.ErrorIs(t, f.callerIsServer(trustedPeer{raftID: uuid.NewString(), raftAddr: leader.Addr()}), ErrNotAServer)
	must.ErrorIs(t, f.callerIsServer(trustedPeer{raftID: leader.ID(), raftAddr: "127.0.0.1:1"}), ErrNotAServer)
	must.ErrorIs(t, f.callerIsServer(trustedPeer{}), ErrNotAServer)

	term := f.raft.Stats()["term"]
	resp := make(chan raft.RPCResponse, 1)
	err := f.vetRaftRPC(raft.RPC{Command: &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ID: []byte(uuid.NewString()), Addr: []byte("127.0.0.1:1")},
		Term:      1 << 40,
	}, RespChan: resp})
	must.ErrorIs(t, err, ErrNotAServer)
	must.Eq(t, term, f.raft.Stats()["term"])
}

// A client agent passes on the caller's token (here none), never its own
// secret: a request without a token that arrives at a client agent's HTTP
// API is nobody, and cannot deregister that node.
func TestPeerTrust_ClientForwardsCallerTokenNotSecret(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	c := testAgentClient(t, s.Addr())
	waitNodeSession(t, s, c.NodeID(), true)

	var resp structs.GenericResponse
	err := c.ForwardContext(testCtx(t), "Node.Deregister", &structs.NodeDeregisterRequest{NodeIDs: []string{c.NodeID()}}, &resp)
	must.ErrorIs(t, err, structs.ErrPermissionDenied)
	node, err := s.State().NodeByID(nil, c.NodeID())
	must.NoError(t, err)
	must.NotNil(t, node)
}

// The leader never replaces a voter that still answers, even when another
// server ID is seen at its address (a restarted server with a new
// identity is replaced only once the old one has gone quiet).
func TestPeerTrust_LiveVoterNeverReplaced(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	leader := waitForLeader(t, servers...)
	f := followers(servers)[0]
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return leader.members.isAlive(f.ID()) }),
		wait.Timeout(10*time.Second),
		wait.Gap(10*time.Millisecond),
	), must.Sprint("the leader never heard from its follower"))

	impostor := structs.ServerMember{ID: uuid.NewString(), Name: "impostor", Addr: f.Addr(),
		Region: leader.config.Region, Status: structs.MemberAlive, Voter: true}
	leader.members.seen(impostor, true)
	leader.reconcileVoters()

	cfg, _, err := leader.raftConfiguration()
	must.NoError(t, err)
	ids := make(map[raft.ServerID]raft.ServerAddress)
	for _, srv := range cfg.Servers {
		ids[srv.ID] = srv.Address
	}
	must.MapContainsKey(t, ids, raft.ServerID(f.ID()), must.Sprint("a live voter was removed"))
	must.MapNotContainsKey(t, ids, raft.ServerID(impostor.ID))
}

// Addresses named by Joins are bounded in number and forgotten when
// nothing answers there; server_join addresses stay.
func TestPeerTrust_JoinedAddressesBoundedAndForgotten(t *testing.T) {
	l := newMemberList(&structs.ServerMember{ID: "self", Addr: "127.0.0.1:1"}, 10*time.Millisecond)
	l.learnPermanent("127.0.0.1:2")
	refused := 0
	for i := range maxProbeAddrs + 10 {
		if !l.learn(fmt.Sprintf("10.0.0.1:%d", i+1)) {
			refused++
		}
	}
	must.SliceLen(t, maxProbeAddrs, l.targets())
	must.EqOp(t, 11, refused)
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return len(l.targets()) == 1 }),
		wait.Timeout(5*time.Second),
		wait.Gap(20*time.Millisecond),
	))
	must.Eq(t, []string{"127.0.0.1:2"}, l.targets())
}
