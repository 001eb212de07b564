package agent

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
)

// These tests drive the agent with Nomad's own Go client, which is how
// existing Nomad tooling would talk to Roam.

func newNomadClient(t *testing.T, a *Agent) *nomadapi.Client {
	t.Helper()
	c, err := nomadapi.NewClient(&nomadapi.Config{Address: "http://" + a.HTTPAddr()})
	must.NoError(t, err)
	return c
}

func TestNomadAPI_StatusLeader(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	leader, err := newNomadClient(t, a).Status().Leader()
	must.NoError(t, err)
	must.EqOp(t, a.Server().Addr(), leader)
}

func TestNomadAPI_StatusPeers(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	peers, err := newNomadClient(t, a).Status().Peers()
	must.NoError(t, err)
	must.Eq(t, []string{a.Server().Addr()}, peers)
}

func TestNomadAPI_AgentSelf(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	c := newNomadClient(t, a)
	self, err := c.Agent().Self()
	must.NoError(t, err)
	must.EqOp(t, a.Config().Name, self.Member.Name)
	must.EqOp(t, "nomad", self.Member.Tags["role"])
	must.EqOp(t, structs.MemberAlive, self.Member.Status)
	must.EqOp(t, "true", self.Stats["nomad"]["leader"])

	// The client caches what it learned from /v1/agent/self.
	dc, err := c.Agent().Datacenter()
	must.NoError(t, err)
	must.EqOp(t, "dc1", dc)
	region, err := c.Agent().Region()
	must.NoError(t, err)
	must.EqOp(t, "global", region)
	name, err := c.Agent().NodeName()
	must.NoError(t, err)
	must.EqOp(t, a.Config().Name, name)
}

func TestNomadAPI_AgentMembers(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	members, err := newNomadClient(t, a).Agent().Members()
	must.NoError(t, err)
	must.EqOp(t, "global", members.ServerRegion)
	must.EqOp(t, "dc1", members.ServerDC)
	must.SliceLen(t, 1, members.Members)
	m := members.Members[0]
	host, port, err := net.SplitHostPort(a.Server().Addr())
	must.NoError(t, err)
	must.EqOp(t, host, m.Addr)
	must.EqOp(t, port, strconv.Itoa(int(m.Port)))
	must.EqOp(t, "alive", m.Status)
	must.EqOp(t, "true", m.Tags["leader"])
	must.EqOp(t, "3", m.Tags["raft_vsn"])
}

func TestNomadAPI_NodesList(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	c := newNomadClient(t, a)

	nodes, meta, err := c.Nodes().List(nil)
	must.NoError(t, err)
	must.SliceLen(t, 1, nodes)
	must.EqOp(t, a.Client().NodeID(), nodes[0].ID)
	must.EqOp(t, "ready", nodes[0].Status)
	must.EqOp(t, "eligible", nodes[0].SchedulingEligibility)
	must.False(t, nodes[0].Drain)
	must.Positive(t, meta.LastIndex)
	must.True(t, meta.KnownLeader)

	nodes, _, err = c.Nodes().PrefixList(a.Client().NodeID()[:5])
	must.NoError(t, err)
	must.SliceLen(t, 1, nodes)

	// A blocking query through Nomad's client wakes on a change.
	done := make(chan *nomadapi.QueryMeta, 1)
	go func() {
		_, qm, err := c.Nodes().List(&nomadapi.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: time.Minute})
		if err != nil {
			t.Errorf("blocking list: %v", err)
		}
		done <- qm
	}()
	registerFakeNode(t, a, uuid.NewString())
	qm := <-done
	must.NotNil(t, qm)
	must.Greater(t, meta.LastIndex, qm.LastIndex)
}

func TestNomadAPI_NodesInfo(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	c := newNomadClient(t, a)
	nodeID := a.Client().NodeID()

	node, meta, err := c.Nodes().Info(nodeID, nil)
	must.NoError(t, err)
	must.EqOp(t, nodeID, node.ID)
	must.EqOp(t, a.Config().Name, node.Name)
	must.EqOp(t, "dc1", node.Datacenter)
	must.EqOp(t, "ready", node.Status)
	must.EqOp(t, a.HTTPAddr(), node.HTTPAddr)
	must.MapContainsKey(t, node.Attributes, "os.name")
	must.EqOp(t, node.ModifyIndex, meta.LastIndex)

	_, _, err = c.Nodes().Info(uuid.NewString(), nil)
	must.Error(t, err)
	must.StrContains(t, err.Error(), "404")
	must.StrContains(t, err.Error(), "node not found")
}

func TestNomadAPI_OperatorRaftGetConfiguration(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	cfg, err := newNomadClient(t, a).Operator().RaftGetConfiguration(nil)
	must.NoError(t, err)
	must.SliceLen(t, 1, cfg.Servers)
	must.Eq(t, &nomadapi.RaftServer{
		ID: a.Server().ID(), Node: a.Config().Name, Address: a.Server().Addr(),
		Leader: true, Voter: true, RaftProtocol: "3",
	}, cfg.Servers[0])
}

func TestNomadAPI_OperatorRaftTransferLeadershipByID(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	c := newNomadClient(t, a)

	// With one server there is no voter to hand over to.
	err := c.Operator().RaftTransferLeadershipByID(a.Server().ID(), nil)
	must.Error(t, err)
	must.StrContains(t, err.Error(), "no other voter")
	err = c.Operator().RaftTransferLeadershipByAddress("127.0.0.1:1", nil)
	must.Error(t, err)
	must.True(t, a.Server().IsLeader())

	err = c.Operator().RaftRemovePeerByID("no-such-peer", nil)
	must.Error(t, err)
	must.StrContains(t, err.Error(), "404")
}

func TestNomadAPI_Metrics(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	c := newNomadClient(t, a)

	summary, _, err := c.Operator().MetricsSummary(nil)
	must.NoError(t, err)
	must.NotEq(t, "", summary.Timestamp)

	text, err := c.Operator().Metrics(&nomadapi.QueryOptions{Params: map[string]string{"format": "prometheus"}})
	must.NoError(t, err)
	must.StrContains(t, string(text), "# TYPE ")
}
