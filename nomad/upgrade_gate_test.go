package nomad

import (
	"testing"

	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func TestServerBuilds(t *testing.T) {
	member := func(id, build, status string) *structs.ServerMember {
		return &structs.ServerMember{ID: id, Status: status, Tags: map[string]string{"build": build}}
	}
	voter := func(id string) raft.Server { return raft.Server{ID: raft.ServerID(id), Suffrage: raft.Voter} }
	cases := []struct {
		name    string
		members []*structs.ServerMember
		voters  []raft.Server
		want    []string
	}{
		{"every voter heard from",
			[]*structs.ServerMember{member("a", "0.2.0", structs.MemberAlive), member("b", "0.2.0", structs.MemberAlive)},
			[]raft.Server{voter("a"), voter("b")}, []string{"0.2.0", "0.2.0"}},
		{"a failed member counts",
			[]*structs.ServerMember{member("a", "0.2.0", structs.MemberAlive), member("b", "0.1.0", structs.MemberFailed)},
			[]raft.Server{voter("a"), voter("b")}, []string{"0.2.0", "0.1.0"}},
		{"a member that left does not",
			[]*structs.ServerMember{member("a", "0.2.0", structs.MemberAlive), member("b", "0.1.0", structs.MemberLeft)},
			[]raft.Server{voter("a")}, []string{"0.2.0"}},
		{"a voter never heard from is the oldest",
			[]*structs.ServerMember{member("a", "0.2.0", structs.MemberAlive)},
			[]raft.Server{voter("a"), voter("c")}, []string{"0.2.0", ""}},
		{"a member without a build tag",
			[]*structs.ServerMember{{ID: "a", Status: structs.MemberAlive}},
			nil, []string{""}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { must.Eq(t, c.want, serverBuilds(c.members, c.voters)) })
	}
}

// The leader tells clients the oldest server build in its heartbeat
// answers: its three servers' own, and an older one once it is a member.
func TestHeartbeat_ReportsMinServerVersion(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	leader := waitForLeader(t, servers...)
	n := testNode("gate")
	registerNode(t, leader, n)
	beat := func() string {
		var reply structs.NodeUpdateResponse
		must.NoError(t, leader.RPC("Node.UpdateStatus", &structs.NodeUpdateStatusRequest{NodeID: n.ID, Status: structs.NodeStatusReady,
			WriteRequest: structs.WriteRequest{Region: leader.config.Region, AuthToken: n.SecretID}}, &reply))
		return reply.MinServerVersion
	}
	must.Eq(t, structs.Version, beat())

	leader.members.seen(structs.ServerMember{ID: "old", Name: "old", Addr: "127.0.0.1:1", Region: leader.config.Region,
		Status: structs.MemberAlive, Voter: true, Tags: map[string]string{"build": "0.1.0"}}, true)
	must.Eq(t, "0.1.0", beat())
}
