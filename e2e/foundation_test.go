//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// settle bounds the waits for the cluster to reach a state it should reach
// on its own (a leader, members alive, nodes ready).
const settle = 45 * time.Second

// TestFoundation_ClusterFailover starts three servers and two clients from
// config files, checks what the CLI shows, kills the leader with SIGKILL,
// and restarts it on its data dir.
func TestFoundation_ClusterFailover(t *testing.T) {
	t.Parallel()
	// The node class comes from a second config file merged over the base.
	c := StartCluster(t, Opts{Servers: 3, Clients: 2, ClientConfigExtra: `client {
  node_class = "e2e"
}
`})
	serverNames := []string{"server-0", "server-1", "server-2"}
	clientNames := []string{"client-0", "client-1"}

	leader := c.Leader()
	t.Logf("leader: %s (%s)", c.Servers[leader].Name, c.Servers[leader].RPCAddr())

	// Every server is a voter and a peer, and the CLI agrees.
	WaitFor(t, settle, func() error { return checkRaft(c, c.ServerHTTP(leader), leader, -1) })
	peers, err := StatusPeers(c.ServerHTTP(leader))
	must.NoError(t, err)
	var rpcAddrs []string
	for _, s := range c.Servers {
		rpcAddrs = append(rpcAddrs, s.RPCAddr())
	}
	slices.Sort(rpcAddrs)
	slices.Sort(peers)
	must.Eq(t, rpcAddrs, peers, must.Sprint("/v1/status/peers"))
	WaitFor(t, settle, func() error { return checkListPeersCLI(t, c.ServerHTTP(leader), c.Servers[leader]) })

	// roam server members: three alive servers, exactly one leader; asked
	// of every server, since each keeps its own view.
	for i := range c.Servers {
		WaitFor(t, settle, func() error {
			return checkMembersCLI(t, c.ServerHTTP(i), serverNames, nil, c.Servers[leader].Name)
		})
		WaitFor(t, settle, func() error { return checkMembersHTTP(c.ServerHTTP(i), serverNames, nil) })
	}

	// roam node status: two ready nodes, through a server and through a
	// client agent.
	WaitFor(t, settle, func() error { return checkNodesCLI(t, c.ServerHTTP(leader), clientNames) })
	WaitFor(t, settle, func() error { return checkNodesCLI(t, c.ClientHTTP(0), clientNames) })
	nodes, err := Nodes(c.ServerHTTP(leader), false)
	must.NoError(t, err)
	must.Len(t, 2, nodes)
	out, errOut, code := c.RunCLI("node", "status")
	must.Eq(t, 0, code, must.Sprintf("roam node status: %s%s", out, errOut))
	tab, err := ParseTable(out)
	must.NoError(t, err)
	classes, err := tab.Column("Class")
	must.NoError(t, err)
	must.Eq(t, []string{"e2e", "e2e"}, classes, must.Sprintf("node_class from the second config file:\n%s", out))
	for _, n := range nodes {
		must.Eq(t, "e2e", n.NodeClass)
		out, errOut, code := c.RunCLI("node", "status", n.ID)
		must.Eq(t, 0, code, must.Sprintf("roam node status %s: %s%s", n.ID, out, errOut))
		must.StrContains(t, out, n.Name)
		must.StrContains(t, out, "ready")
	}
	out, errOut, code = c.RunCLI("status")
	must.Eq(t, 0, code, must.Sprintf("roam status: %s%s", out, errOut))
	logCLI(t, c.ServerHTTP(leader), "server", "members")
	logCLI(t, c.ServerHTTP(leader), "node", "status")
	logCLI(t, c.ServerHTTP(leader), "operator", "raft", "list-peers")
	logCLI(t, c.ServerHTTP(leader), "status")

	// kill -9 the leader: another server takes over.
	old := leader
	c.KillServer(old, syscall.SIGKILL)
	var newLeader int
	WaitFor(t, settle, func() error {
		idx, err := c.LeaderNow()
		if err != nil {
			return err
		}
		if idx == old {
			return fmt.Errorf("killed server %s still named leader", c.Servers[old].Name)
		}
		newLeader = idx
		return nil
	})
	t.Logf("new leader after SIGKILL of %s: %s", c.Servers[old].Name, c.Servers[newLeader].Name)
	must.NotEq(t, old, newLeader)

	// The nodes are still listed through a surviving server, and come back
	// to (or stay) ready once their heartbeats reach the new leader.
	must.NotEq(t, old, c.LiveServer())
	WaitFor(t, settle, func() error {
		out, errOut, code := c.RunCLI("node", "status")
		if code != 0 {
			return fmt.Errorf("roam node status: exit %d: %s%s", code, out, errOut)
		}
		for _, n := range clientNames {
			if !strings.Contains(out, n) {
				return fmt.Errorf("node %s not listed:\n%s", n, out)
			}
		}
		return nil
	})
	WaitFor(t, settle, func() error { return checkNodesCLI(t, c.ServerHTTP(newLeader), clientNames) })

	// The survivors see the killed server fail.
	WaitFor(t, settle, func() error {
		return checkMembersCLI(t, c.ServerHTTP(newLeader), serverNames, []string{c.Servers[old].Name}, c.Servers[newLeader].Name)
	})

	logCLI(t, c.ServerHTTP(newLeader), "server", "members")

	// Restarted on its data dir, the old leader rejoins as a follower.
	c.RestartServer(old)
	restarted := c.ServerHTTP(old)
	WaitFor(t, settle, func() error {
		idx, err := c.LeaderNow() // includes the restarted server's answer
		if err != nil {
			return err
		}
		if idx == old {
			return fmt.Errorf("restarted server %s is leader", c.Servers[old].Name)
		}
		newLeader = idx
		return nil
	})
	WaitFor(t, settle, func() error { return checkRaft(c, restarted, newLeader, old) })
	WaitFor(t, settle, func() error { return checkMembersHTTP(restarted, serverNames, nil) })
	WaitFor(t, settle, func() error { return checkMembersHTTP(c.ServerHTTP(newLeader), serverNames, nil) })
	WaitFor(t, settle, func() error {
		return checkMembersCLI(t, restarted, serverNames, nil, c.Servers[newLeader].Name)
	})
	// Its own copy of the state (a stale read is answered locally) has
	// caught up with the nodes.
	WaitFor(t, settle, func() error {
		nodes, meta, err := NodesMeta(restarted, true)
		if err != nil {
			return err
		}
		if len(nodes) != len(clientNames) {
			return fmt.Errorf("restarted server has %d nodes, want %d", len(nodes), len(clientNames))
		}
		// The index header covers what the answer shows.
		for _, n := range nodes {
			if meta.Index < n.ModifyIndex {
				return fmt.Errorf("X-Nomad-Index %d is below node %s's ModifyIndex %d", meta.Index, n.Name, n.ModifyIndex)
			}
		}
		if !meta.KnownLeader {
			return errors.New("X-Nomad-KnownLeader is not true on the restarted server")
		}
		return nil
	})
	idx, err := c.LeaderNow()
	must.NoError(t, err)
	must.NotEq(t, old, idx, must.Sprint("the restarted server must not take leadership"))
	logCLI(t, restarted, "server", "members")
	logCLI(t, restarted, "operator", "raft", "list-peers")
}

// logCLI runs the CLI against base and logs what it printed, so a -v run
// shows what the assertions looked at.
func logCLI(t testing.TB, base string, args ...string) {
	t.Helper()
	out, errOut, code := RunCLIAt(t, base, args...)
	t.Logf("$ roam %s   (exit %d)\n%s%s", strings.Join(args, " "), code, out, errOut)
}

// checkRaft checks the Raft configuration as the server at base reports
// it: every server a voter, exactly one leader, which is server leader;
// notLeader (if >= 0) is a server that must not lead.
func checkRaft(c *Cluster, base string, leader, notLeader int) error {
	cfg, err := RaftConfig(base)
	if err != nil {
		return err
	}
	if len(cfg.Servers) != len(c.Servers) {
		return fmt.Errorf("raft configuration has %d servers, want %d: %+v", len(cfg.Servers), len(c.Servers), cfg.Servers)
	}
	var leaders []string
	seen := map[string]bool{}
	for _, s := range cfg.Servers {
		if !s.Voter {
			return fmt.Errorf("raft server %s (%s) is not a voter", s.Node, s.Address)
		}
		if c.serverByRPC(s.Address) < 0 {
			return fmt.Errorf("raft server %s has unknown address %s", s.Node, s.Address)
		}
		seen[s.Address] = true
		if s.Leader {
			leaders = append(leaders, s.Address)
		}
	}
	if len(seen) != len(c.Servers) {
		return fmt.Errorf("raft configuration repeats an address: %+v", cfg.Servers)
	}
	if len(leaders) != 1 {
		return fmt.Errorf("raft configuration has leaders %v, want exactly one", leaders)
	}
	if leaders[0] != c.Servers[leader].RPCAddr() {
		return fmt.Errorf("raft configuration names leader %s, want %s", leaders[0], c.Servers[leader].RPCAddr())
	}
	if notLeader >= 0 && leaders[0] == c.Servers[notLeader].RPCAddr() {
		return fmt.Errorf("%s must not be leader", c.Servers[notLeader].Name)
	}
	return nil
}

// memberIs reports whether a member name denotes the agent name: Nomad
// shows servers as "name.region".
func memberIs(member, name string) bool {
	return member == name || strings.HasPrefix(member, name+".")
}

// checkMembersHTTP checks /v1/agent/members at base: exactly the servers
// in names, those in failed not alive, every other one alive.
func checkMembersHTTP(base string, names, failed []string) error {
	m, err := Members(base)
	if err != nil {
		return err
	}
	if len(m.Members) != len(names) {
		return fmt.Errorf("%s: %d members, want %d: %+v", base, len(m.Members), len(names), m.Members)
	}
	for _, name := range names {
		i := slices.IndexFunc(m.Members, func(mm AgentMember) bool { return memberIs(mm.Name, name) })
		if i < 0 {
			return fmt.Errorf("%s: %s missing from members %+v", base, name, m.Members)
		}
		wantAlive := !slices.Contains(failed, name)
		if alive := m.Members[i].Status == "alive"; alive != wantAlive {
			return fmt.Errorf("%s: member %s has status %q, want alive=%v", base, name, m.Members[i].Status, wantAlive)
		}
	}
	return nil
}

// checkMembersCLI runs roam server members against base and checks it
// lists exactly the servers in names, those in failed not alive and every
// other one alive, with exactly one leader, leaderName.
func checkMembersCLI(t testing.TB, base string, names, failed []string, leaderName string) error {
	out, errOut, code := RunCLIAt(t, base, "server", "members")
	if code != 0 {
		return fmt.Errorf("roam server members: exit %d: %s%s", code, out, errOut)
	}
	tab, err := ParseTable(out)
	if err != nil {
		return err
	}
	gotNames, err1 := tab.Column("Name")
	statuses, err2 := tab.Column("Status")
	leaders, err3 := tab.Column("Leader")
	if err := errors.Join(err1, err2, err3); err != nil {
		return err
	}
	if len(gotNames) != len(names) {
		return fmt.Errorf("roam server members lists %d servers, want %d:\n%s", len(gotNames), len(names), out)
	}
	var leaderRows []string
	for _, name := range names {
		i := slices.IndexFunc(gotNames, func(n string) bool { return memberIs(n, name) })
		if i < 0 {
			return fmt.Errorf("roam server members does not list %s:\n%s", name, out)
		}
		wantAlive := !slices.Contains(failed, name)
		if alive := statuses[i] == "alive"; alive != wantAlive {
			return fmt.Errorf("roam server members: %s has status %q, want alive=%v:\n%s", name, statuses[i], wantAlive, out)
		}
		if leaders[i] == "true" {
			leaderRows = append(leaderRows, name)
		}
	}
	if len(leaderRows) != 1 || leaderRows[0] != leaderName {
		return fmt.Errorf("roam server members shows leaders %v, want exactly %s:\n%s", leaderRows, leaderName, out)
	}
	return nil
}

// checkListPeersCLI runs roam operator raft list-peers against base: every
// server a voter, exactly one leader, the one given.
func checkListPeersCLI(t testing.TB, base string, leader *Agent) error {
	out, errOut, code := RunCLIAt(t, base, "operator", "raft", "list-peers")
	if code != 0 {
		return fmt.Errorf("roam operator raft list-peers: exit %d: %s%s", code, out, errOut)
	}
	tab, err := ParseTable(out)
	if err != nil {
		return err
	}
	addrs, err1 := tab.Column("Address")
	states, err2 := tab.Column("State")
	voters, err3 := tab.Column("Voter")
	if err := errors.Join(err1, err2, err3); err != nil {
		return err
	}
	if len(addrs) != 3 {
		return fmt.Errorf("list-peers shows %d peers, want 3:\n%s", len(addrs), out)
	}
	var leaders []string
	for i := range addrs {
		if voters[i] != "true" {
			return fmt.Errorf("list-peers: %s is not a voter:\n%s", addrs[i], out)
		}
		if states[i] == "leader" {
			leaders = append(leaders, addrs[i])
		}
	}
	if len(leaders) != 1 || leaders[0] != leader.RPCAddr() {
		return fmt.Errorf("list-peers shows leaders %v, want exactly %s:\n%s", leaders, leader.RPCAddr(), out)
	}
	return nil
}

// checkNodesCLI runs roam node status against base and checks it lists
// exactly the nodes in names, each ready.
func checkNodesCLI(t testing.TB, base string, names []string) error {
	out, errOut, code := RunCLIAt(t, base, "node", "status")
	if code != 0 {
		return fmt.Errorf("roam node status: exit %d: %s%s", code, out, errOut)
	}
	tab, err := ParseTable(out)
	if err != nil {
		return err
	}
	gotNames, err1 := tab.Column("Name")
	statuses, err2 := tab.Column("Status")
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	if len(gotNames) != len(names) {
		return fmt.Errorf("roam node status lists %d nodes, want %d:\n%s", len(gotNames), len(names), out)
	}
	for _, name := range names {
		i := slices.Index(gotNames, name)
		if i < 0 {
			return fmt.Errorf("roam node status does not list %s:\n%s", name, out)
		}
		if statuses[i] != "ready" {
			return fmt.Errorf("roam node status: %s is %q, want ready:\n%s", name, statuses[i], out)
		}
	}
	return nil
}

// TestFoundation_InvalidConfig checks that a bad config file stops the
// agent before it starts, with a message naming the file, the line and
// the reason.
func TestFoundation_InvalidConfig(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// src is the file; the line containing mark is the bad one (0 when
		// the error has no line).
		src    string
		mark   string
		reason *regexp.Regexp
	}{
		{
			name: "unknown attribute",
			src: `data_dir  = "DATA"
bind_addr = "127.0.0.1"
bogus = 1
ports {
  http = HTTP
  rpc  = RPC
}
server {
  enabled          = true
  bootstrap_expect = 1
}
`,
			mark:   "bogus",
			reason: regexp.MustCompile(`(?is)bogus.*(unsupported|not expected|unknown)|(unsupported|not expected|unknown).*bogus`),
		},
		{
			name: "bad syntax",
			src: `data_dir  = "DATA"
bind_addr = "127.0.0.1"
ports {
  http = = HTTP
  rpc  = RPC
}
server {
  enabled          = true
  bootstrap_expect = 1
}
`,
			mark:   "= =",
			reason: regexp.MustCompile(`(?i)invalid expression|expected|syntax`),
		},
		{
			name: "unclosed block",
			src: `data_dir  = "DATA"
bind_addr = "127.0.0.1"
ports {
  http = HTTP
  rpc  = RPC
server {
  enabled          = true
  bootstrap_expect = 1
}
`,
			mark:   "ports {",
			reason: regexp.MustCompile(`(?i)unclosed|missing|expected|brace`),
		},
		{
			name: "wrong type",
			src: `data_dir  = "DATA"
bind_addr = "127.0.0.1"
ports {
  http = HTTP
  rpc  = RPC
}
server {
  enabled          = true
  bootstrap_expect = "three"
}
`,
			mark:   `"three"`,
			reason: regexp.MustCompile(`(?i)number`),
		},
		{
			name: "bad duration",
			src: `data_dir  = "DATA"
bind_addr = "127.0.0.1"
ports {
  http = HTTP
  rpc  = RPC
}
server {
  enabled          = true
  bootstrap_expect = 1
  heartbeat_grace  = "soon"
}
`,
			mark:   `"soon"`,
			reason: regexp.MustCompile(`(?i)heartbeat_grace.*duration|duration.*heartbeat_grace`),
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			p := FreePorts(t, 2)
			src := strings.NewReplacer(
				"DATA", filepath.Join(dir, "data"),
				"HTTP", strconv.Itoa(p[0]),
				"RPC", strconv.Itoa(p[1]),
			).Replace(tc.src)
			base := strings.ReplaceAll(tc.name, " ", "_") + ".hcl"
			path := filepath.Join(dir, base)
			must.NoError(t, os.WriteFile(path, []byte(src), 0o644))
			line := slices.IndexFunc(strings.Split(src, "\n"), func(l string) bool {
				return strings.Contains(l, tc.mark)
			}) + 1
			must.Positive(t, line)
			if tc.name == "unknown attribute" {
				must.Eq(t, 3, line)
			}

			out, errOut, code := RunRoam(t, 20*time.Second, "agent", "-config", path)
			msg := out + errOut
			must.NotEq(t, 0, code, must.Sprintf("agent started with a bad config; output:\n%s", msg))
			must.NotEq(t, -1, code, must.Sprintf("agent kept running with a bad config; output:\n%s", msg))
			must.StrContains(t, msg, base, must.Sprint("the message names the file"))
			lineRe := regexp.MustCompile(regexp.QuoteMeta(base) + `:` + strconv.Itoa(line) + `\b|(?i)line ` + strconv.Itoa(line) + `\b`)
			must.True(t, lineRe.MatchString(msg), must.Sprintf("the message names line %d:\n%s", line, msg))
			must.True(t, tc.reason.MatchString(msg), must.Sprintf("the message gives the reason (%s):\n%s", tc.reason, msg))
		})
	}

	t.Run("missing file", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "absent.hcl")
		out, errOut, code := RunRoam(t, 20*time.Second, "agent", "-config", path)
		msg := out + errOut
		must.NotEq(t, 0, code, must.Sprintf("output:\n%s", msg))
		must.NotEq(t, -1, code, must.Sprintf("agent kept running; output:\n%s", msg))
		must.StrContains(t, msg, "absent.hcl")
		must.RegexMatch(t, regexp.MustCompile(`(?i)no such file|not found|does not exist`), msg)
	})
}

// TestFoundation_DevAgent is the core of make dev: one process that is a
// server and a client, which elects itself, registers its node, and exits
// 0 on SIGINT, removing its temporary data dir.
func TestFoundation_DevAgent(t *testing.T) {
	t.Parallel()
	p := FreePorts(t, 2)
	a := StartAgent(t, "dev", p[0], p[1],
		"agent", "-dev", "-http-port", strconv.Itoa(p[0]), "-rpc-port", strconv.Itoa(p[1]))

	WaitFor(t, settle, func() error {
		l, err := StatusLeader(a.HTTPAddr())
		switch {
		case err != nil:
			return err
		case l == "":
			return errors.New("no leader yet")
		case l != a.RPCAddr():
			return fmt.Errorf("leader is %q, want the dev agent's own RPC address %s", l, a.RPCAddr())
		}
		return nil
	})
	WaitFor(t, settle, func() error {
		out, errOut, code := RunCLIAt(t, a.HTTPAddr(), "node", "status")
		if code != 0 {
			return fmt.Errorf("roam node status: exit %d: %s%s", code, out, errOut)
		}
		tab, err := ParseTable(out)
		if err != nil {
			return err
		}
		statuses, err := tab.Column("Status")
		if err != nil {
			return err
		}
		if len(statuses) != 1 || statuses[0] != "ready" {
			return fmt.Errorf("want one ready node:\n%s", out)
		}
		return nil
	})

	must.NoError(t, a.Signal(syscall.SIGINT))
	code, err := a.Wait(stopTimeout)
	must.NoError(t, err)
	must.Eq(t, 0, code, must.Sprintf("exit after SIGINT (%s)", a.ExitState()))

	leftovers, err := filepath.Glob(filepath.Join(a.Dir, "tmp", "*"))
	must.NoError(t, err)
	must.SliceEmpty(t, leftovers, must.Sprint("the dev agent leaves its temporary data dir behind"))
}
