package command

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/roamhq/roam/api"
	"github.com/roamhq/roam/command/agent"
	"github.com/roamhq/roam/nomad"
	"github.com/roamhq/roam/structs"
	"github.com/roamhq/roam/testutil"
	"github.com/shoenig/test/must"
)

// startAgent starts an agent from agent.TestConfig, logging warnings and
// worse, with mutate (if set) applied to its config last. The agent is
// shut down when the test ends.
func startAgent(t *testing.T, mutate func(*agent.Config)) *agent.Agent {
	t.Helper()
	c := agent.TestConfig(t)
	c.LogLevel = "WARN"
	if mutate != nil {
		mutate(c)
	}
	return testutil.StartAgent(t, func(logs io.Writer) (*agent.Agent, error) { return agent.NewAgent(c, logs) })
}

// newTestAgent starts a dev agent and waits until it leads and its node
// is ready. It returns the agent's HTTP address for -address.
func newTestAgent(t *testing.T) (*agent.Agent, string) {
	t.Helper()
	a := startAgent(t, nil)
	testutil.WaitForLeader(t, a.Server())
	testutil.WaitForNodeReady(t, a, a.Client().NodeID())
	return a, "http://" + a.HTTPAddr()
}

// registerFakeNode registers a ready node with the given ID.
func registerFakeNode(t *testing.T, a *agent.Agent, id, name string) {
	t.Helper()
	var reply structs.NodeUpdateResponse
	must.NoError(t, a.RPC("Node.Register", &structs.NodeRegisterRequest{Node: &structs.Node{
		ID: id, SecretID: "secret-" + id, Name: name, Datacenter: "dc2",
		NodeClass: "big", Status: structs.NodeStatusReady,
	}}, &reply))
}

// run runs the CLI and returns its exit code and outputs.
func run(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := Run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// lines splits output into lines with runs of spaces collapsed, so table
// assertions do not depend on column widths.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		out = append(out, strings.Join(strings.Fields(l), " "))
	}
	return out
}

func TestCLI_NodeStatus(t *testing.T) {
	t.Parallel()
	a, addr := newTestAgent(t)
	nodeID := a.Client().NodeID()
	name := a.Config().Name

	t.Run("list", func(t *testing.T) {
		code, out, errOut := run("node", "status", "-address", addr)
		must.EqOp(t, 0, code, must.Sprint(errOut))
		must.Eq(t, []string{
			"ID DC Name Class Drain Eligibility Status",
			nodeID[:8] + " dc1 " + name + " <none> false eligible ready",
		}, lines(out))
		// Columns line up: each header starts where its values start.
		raw := strings.Split(out, "\n")
		must.EqOp(t, strings.Index(raw[0], "Status"), strings.Index(raw[1], "ready"))
	})

	t.Run("list verbose", func(t *testing.T) {
		code, out, _ := run("node", "status", "-verbose", "-address", addr)
		must.EqOp(t, 0, code)
		must.StrContains(t, out, nodeID)
		must.StrContains(t, lines(out)[0], "Address Version Status")
	})

	t.Run("list json", func(t *testing.T) {
		code, out, _ := run("node", "status", "-json", "-address", addr)
		must.EqOp(t, 0, code)
		var nodes []*api.NodeListStub
		must.NoError(t, json.Unmarshal([]byte(out), &nodes))
		must.SliceLen(t, 1, nodes)
		must.EqOp(t, nodeID, nodes[0].ID)
	})

	t.Run("one node by prefix", func(t *testing.T) {
		code, out, errOut := run("node", "status", "-address", addr, nodeID[:6])
		must.EqOp(t, 0, code, must.Sprint(errOut))
		got := lines(out)
		must.SliceContains(t, got, "ID = "+nodeID[:8])
		must.SliceContains(t, got, "Name = "+name)
		must.SliceContains(t, got, "Class = <none>")
		must.SliceContains(t, got, "DC = dc1")
		must.SliceContains(t, got, "Drain = false")
		must.SliceContains(t, got, "Eligibility = eligible")
		must.SliceContains(t, got, "Status = ready")
		must.StrNotContains(t, out, "Attributes")
	})

	t.Run("one node verbose, flags after the ID", func(t *testing.T) {
		code, out, _ := run("node", "status", "-address", addr, nodeID, "-verbose")
		must.EqOp(t, 0, code)
		got := lines(out)
		must.SliceContains(t, got, "ID = "+nodeID)
		must.SliceContains(t, got, "Attributes")
		must.SliceContains(t, got, "roam.version = "+structs.Version)
		must.SliceContains(t, got, "Drivers")
		must.SliceContains(t, got, "Driver Detected Healthy Message")
		must.SliceContains(t, got, "exec true true Healthy")
		must.SliceContains(t, got, "raw_exec true true Healthy")
	})

	t.Run("one node json", func(t *testing.T) {
		code, out, _ := run("node", "status", "-json", "-address", addr, nodeID)
		must.EqOp(t, 0, code)
		var node api.Node
		must.NoError(t, json.Unmarshal([]byte(out), &node))
		must.EqOp(t, nodeID, node.ID)
		must.EqOp(t, name, node.Name)
	})

	t.Run("unknown ID", func(t *testing.T) {
		code, out, errOut := run("node", "status", "-address", addr, "ffffffff-0000")
		must.EqOp(t, 1, code)
		must.EqOp(t, "", out)
		must.StrContains(t, errOut, `No node(s) with prefix or ID "ffffffff-0000" found`)
	})

	t.Run("ambiguous prefix", func(t *testing.T) {
		registerFakeNode(t, a, "0123abcd-0000-4000-8000-000000000001", "fake-1")
		registerFakeNode(t, a, "0123abcd-0000-4000-8000-000000000002", "fake-2")
		code, out, errOut := run("node", "status", "-address", addr, "0123")
		must.EqOp(t, 1, code)
		must.EqOp(t, "", out)
		must.StrContains(t, errOut, "matched multiple nodes")
		got := lines(errOut)
		must.SliceContains(t, got, "0123abcd-0000-4000-8000-000000000001 dc2 fake-1 big false eligible ready")
		must.SliceContains(t, got, "0123abcd-0000-4000-8000-000000000002 dc2 fake-2 big false eligible ready")
	})

	t.Run("too many arguments", func(t *testing.T) {
		code, _, errOut := run("node", "status", "-address", addr, "a", "b")
		must.EqOp(t, 1, code)
		must.StrContains(t, errOut, "Usage: roam node status")
	})
}

func TestCLI_ServerMembers(t *testing.T) {
	t.Parallel()
	a, addr := newTestAgent(t)

	code, out, errOut := run("server", "members", "-address", addr)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	host, port, _ := strings.Cut(a.Server().Addr(), ":")
	must.Eq(t, []string{
		"Name Address Port Status Leader Raft Version Build Datacenter Region",
		a.Config().Name + " " + host + " " + port + " alive true 3 " + structs.Version + " dc1 global",
	}, lines(out))

	code, out, _ = run("server", "members", "-json", "-address", addr)
	must.EqOp(t, 0, code)
	var members api.ServerMembers
	must.NoError(t, json.Unmarshal([]byte(out), &members))
	must.SliceLen(t, 1, members.Members)
	must.EqOp(t, "alive", members.Members[0].Status)

	code, out, _ = run("server", "members", "-detailed", "-address", addr)
	must.EqOp(t, 0, code)
	must.StrContains(t, out, "role=nomad")
}

func TestCLI_OperatorRaft(t *testing.T) {
	t.Parallel()
	a, addr := newTestAgent(t)

	code, out, errOut := run("operator", "raft", "list-peers", "-address", addr)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.Eq(t, []string{
		"Node ID Address State Voter RaftProtocol Health LastContact",
		a.Config().Name + " " + a.Server().ID() + " " + a.Server().Addr() + " leader true 3 healthy -",
	}, lines(out))

	code, out, _ = run("operator", "raft", "list-peers", "-stale", "-json", "-address", addr)
	must.EqOp(t, 0, code)
	var cfg api.RaftConfiguration
	must.NoError(t, json.Unmarshal([]byte(out), &cfg))
	must.SliceLen(t, 1, cfg.Servers)

	// A single server cannot hand leadership to anyone.
	code, _, errOut = run("operator", "raft", "transfer-leadership", "-address", addr, "-peer-id", a.Server().ID())
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "Error transferring leadership")
	must.StrContains(t, errOut, "no other voter")

	code, _, errOut = run("operator", "raft", "transfer-leadership", "-address", addr, "-peer-id", "x", "-peer-address", "y")
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "at most one")

	code, _, errOut = run("operator", "raft", "remove-peer", "-address", addr, "-peer-id", "no-such-peer")
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "404")
}

func TestCLI_Status(t *testing.T) {
	t.Parallel()
	a, addr := newTestAgent(t)

	code, out, errOut := run("status", "-address", addr)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	got := lines(out)
	must.SliceContains(t, got, "Region = global")
	must.SliceContains(t, got, fmt.Sprintf("Leader = %s (%s)", a.Config().Name, a.Server().Addr()))
	must.SliceContains(t, got, "Raft Peers = 1")
	must.SliceContains(t, got, "Servers = 1 (1 alive, 0 failed)")
	must.SliceContains(t, got, "Nodes = 1 (1 ready, 0 down, 0 initializing)")
	must.StrContains(t, out, a.Client().NodeID()[:8])

	code, out, _ = run("status", "-json", "-address", addr)
	must.EqOp(t, 0, code)
	var st struct {
		Leader string
		Nodes  []*api.NodeListStub
	}
	must.NoError(t, json.Unmarshal([]byte(out), &st))
	must.EqOp(t, a.Server().Addr(), st.Leader)
	must.SliceLen(t, 1, st.Nodes)
}

func TestCLI_AddressFromEnv(t *testing.T) {
	_, addr := newTestAgent(t)
	t.Setenv(api.AddressEnv, addr)
	code, out, errOut := run("server", "members")
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.StrContains(t, out, "alive")
}

func TestCLI_Unreachable(t *testing.T) {
	t.Parallel()
	code, _, errOut := run("node", "status", "-address", "http://127.0.0.1:1")
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "Error listing nodes")
}

func TestCLI_Groups(t *testing.T) {
	t.Parallel()
	code, out, _ := run("operator", "raft")
	must.EqOp(t, 0, code)
	must.StrContains(t, out, "operator raft list-peers")
	must.StrContains(t, out, "operator raft transfer-leadership")

	code, _, errOut := run("node", "bogus")
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, `unknown subcommand "bogus"`)

	code, _, errOut = run("node", "status", "-nope")
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "flag provided but not defined")

	code, _, _ = run("node", "status", "-h")
	must.EqOp(t, 0, code)
}

func TestFormatColumns(t *testing.T) {
	t.Parallel()
	got := formatColumns([][]string{
		{"ID", "Name", "Status"},
		{"1", "long-name", "ready"},
		{"22", "x", ""},
	})
	must.EqOp(t, "ID  Name       Status\n1   long-name  ready\n22  x\n", got)
	must.EqOp(t, "A    = 1\nLong = 2\n", formatKV([][2]string{{"A", "1"}, {"Long", "2"}}))
}

// startServers starts n server-only agents with enable_debug, joined into
// one cluster, and waits for a leader.
func startServers(t *testing.T, n int) []*agent.Agent {
	t.Helper()
	agents := make([]*agent.Agent, n)
	var join []string
	for i := range agents {
		agents[i] = startAgent(t, func(c *agent.Config) {
			c.Name = fmt.Sprintf("%s-%d", c.Name, i)
			c.Client.Enabled = false
			c.EnableDebug = true
			c.RaftTimers = nil
			c.Server.BootstrapExpect = n
			c.Server.ServerJoin = &agent.ServerJoin{RetryJoin: join, RetryInterval: "50ms"}
		})
		if i == 0 {
			join = []string{agents[0].Server().Addr()}
		}
	}
	servers := make([]*nomad.Server, n)
	for i, a := range agents {
		servers[i] = a.Server()
	}
	testutil.WaitForLeader(t, servers...)
	return agents
}
