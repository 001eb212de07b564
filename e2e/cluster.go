//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Opts shapes a cluster.
type Opts struct {
	// Binary is the roam binary every agent starts on (Agent.Bin); the one
	// under test when empty.
	Binary  string
	Servers int
	Clients int
	// ServerConfigExtra and ClientConfigExtra are HCL written to a second
	// config file that each server (client) loads after its base file, so
	// they may repeat blocks of the base file (server { ... }) to override
	// or add settings.
	ServerConfigExtra string
	ClientConfigExtra string
	// ClientConfigFor, if set, returns more HCL for the client named name
	// (client-0, client-1, ...), appended to ClientConfigExtra: settings
	// that differ per client, such as a CSI plugin socket.
	ClientConfigFor func(name string) string
	// LogLevel of every agent; DEBUG when empty.
	LogLevel string
	// OwnAddrs gives every agent a loopback address of its own
	// (127.X.Y.N, see loopbackIP), which it binds and dials from, so
	// that a netFaults can cut the links between agents.
	OwnAddrs bool
	// StopOnClientAfter is the clients' stop_on_client_after. Empty turns
	// it off ("0s"): the suites' short heartbeat timers leave no room for
	// it, and a client that stopped its writers during a leader election
	// would break tests about other things. Suites about partitions set
	// it together with server timers it nests in.
	StopOnClientAfter string
	// NoRawExec leaves raw_exec off on every client, as a client config
	// that does not enable it has it. Suites run their workloads with it
	// on.
	NoRawExec bool
}

// Cluster is a set of roam agents started as real processes.
type Cluster struct {
	t       testing.TB
	Dir     string
	Servers []*Agent
	Clients []*Agent
}

// serverTimers keep failure detection fast enough for tests: Raft's LAN
// timers unscaled, short client heartbeat TTLs, frequent join probes.
const serverTimers = `  raft_multiplier        = 1
  heartbeat_grace        = "2s"
  min_heartbeat_ttl      = "2s"
  failover_heartbeat_ttl = "4s"
`

// StartCluster writes one config file per agent, starts the servers and the
// clients, waits for every HTTP API to answer and, if there are servers,
// for them to agree on a leader. Every process is stopped when the test
// ends; if the test failed, every agent's log tail is printed.
func StartCluster(t testing.TB, opts Opts) *Cluster {
	t.Helper()
	if opts.Servers == 0 && opts.Clients > 0 {
		t.Fatalf("e2e: a cluster with clients needs at least one server")
	}
	if opts.LogLevel == "" {
		opts.LogLevel = "DEBUG"
	}
	roamBinary(t) // build before the clock of any wait starts
	c := &Cluster{t: t, Dir: t.TempDir()}
	t.Cleanup(func() {
		stopAndReport(t, c.agents())
		// Tasks outlive their clients (executors detach); stop them too.
		killStrays(t, c.Dir)
	})

	p := FreePorts(t, 2*(opts.Servers+opts.Clients))
	next := func() int { n := p[0]; p = p[1:]; return n }

	var serverRPC []string
	for i := 0; i < opts.Servers; i++ {
		name := fmt.Sprintf("server-%d", i)
		a := NewAgent(t, name, filepath.Join(c.Dir, name), next(), next())
		a.Bin = opts.Binary
		if opts.OwnAddrs {
			a.IP = loopbackIP(t)
		}
		serverRPC = append(serverRPC, a.RPCAddr())
		c.Servers = append(c.Servers, a)
	}
	for _, a := range c.Servers {
		hcl := fmt.Sprintf(`name      = %q
data_dir  = %q
bind_addr = %q
log_level = %q

ports {
  http = %d
  rpc  = %d
}

server {
  enabled          = true
  bootstrap_expect = %d
%s
  server_join {
    retry_join     = %s
    retry_interval = "500ms"
  }
}
`, a.Name, a.DataDir, a.ip(), opts.LogLevel, a.HTTPPort, a.RPCPort, opts.Servers, serverTimers, hclList(serverRPC))
		a.Args = c.writeConfigs(t, a, hcl, opts.ServerConfigExtra)
	}
	for i := 0; i < opts.Clients; i++ {
		name := fmt.Sprintf("client-%d", i)
		a := NewAgent(t, name, filepath.Join(c.Dir, name), next(), next())
		a.Bin = opts.Binary
		if opts.OwnAddrs {
			a.IP = loopbackIP(t)
		}
		stopAfter := opts.StopOnClientAfter
		if stopAfter == "" {
			stopAfter = "0s"
		}
		hcl := fmt.Sprintf(`name      = %q
data_dir  = %q
bind_addr = %q
log_level = %q

ports {
  http = %d
  rpc  = %d
}

client {
  enabled              = true
  servers              = %s
  stop_on_client_after = %q
}
%s`, a.Name, a.DataDir, a.ip(), opts.LogLevel, a.HTTPPort, a.RPCPort, hclList(serverRPC), stopAfter, rawExecHCL(opts))
		extra := opts.ClientConfigExtra
		if opts.ClientConfigFor != nil {
			extra += "\n" + opts.ClientConfigFor(name)
		}
		a.Args = c.writeConfigs(t, a, hcl, extra)
		c.Clients = append(c.Clients, a)
	}

	for _, a := range c.agents() {
		if err := a.Start(); err != nil {
			t.Fatalf("e2e: %v", err)
		}
	}
	for _, a := range c.agents() {
		if err := a.WaitHTTP(startTimeout); err != nil {
			t.Fatalf("e2e: %v", err)
		}
	}
	if opts.Servers > 0 {
		c.WaitForLeader(leaderTimeout)
	}
	return c
}

// writeConfigs writes the agent's base config (and extra, if any) and
// returns the arguments that start it.
func (c *Cluster) writeConfigs(t testing.TB, a *Agent, base, extra string) []string {
	t.Helper()
	path := filepath.Join(a.Dir, "agent.hcl")
	if err := os.WriteFile(path, []byte(base), 0o644); err != nil {
		t.Fatalf("e2e: %v", err)
	}
	args := []string{"agent", "-config", path}
	if strings.TrimSpace(extra) != "" {
		xpath := filepath.Join(a.Dir, "extra.hcl")
		if err := os.WriteFile(xpath, []byte(extra), 0o644); err != nil {
			t.Fatalf("e2e: %v", err)
		}
		args = append(args, "-config", xpath)
	}
	return args
}

// rawExecHCL enables raw_exec, which is off unless a client's config
// turns it on; every suite runs its workloads (and the CSI plugin) with
// it, unless opts say not to.
func rawExecHCL(opts Opts) string {
	if opts.NoRawExec {
		return ""
	}
	return `
plugin "raw_exec" {
  config {
    enabled = true
  }
}
`
}

func hclList(items []string) string {
	q := make([]string, len(items))
	for i, s := range items {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func (c *Cluster) agents() []*Agent {
	return append(append([]*Agent(nil), c.Servers...), c.Clients...)
}

// ServerHTTP is server i's HTTP API base URL.
func (c *Cluster) ServerHTTP(i int) string { return c.Servers[i].HTTPAddr() }

// ClientHTTP is client j's HTTP API base URL.
func (c *Cluster) ClientHTTP(j int) string { return c.Clients[j].HTTPAddr() }

// LiveServer returns the index of the first running server, -1 if none.
func (c *Cluster) LiveServer() int {
	for i, s := range c.Servers {
		if s.Running() {
			return i
		}
	}
	return -1
}

// serverByRPC returns the index of the server advertising addr, -1 if none.
func (c *Cluster) serverByRPC(addr string) int {
	for i, s := range c.Servers {
		if s.RPCAddr() == addr {
			return i
		}
	}
	return -1
}

// LeaderNow asks every running server for the leader once and returns the
// index of the running server they all name.
func (c *Cluster) LeaderNow() (int, error) {
	leader, asked := "", 0
	for i, s := range c.Servers {
		if !s.Running() {
			continue
		}
		asked++
		l, err := StatusLeader(s.HTTPAddr())
		switch {
		case err != nil:
			return -1, fmt.Errorf("%s: %w", s.Name, err)
		case l == "":
			return -1, fmt.Errorf("%s knows no leader", s.Name)
		case leader != "" && l != leader:
			return -1, fmt.Errorf("servers disagree on the leader: %s says %s, an earlier server said %s", c.Servers[i].Name, l, leader)
		}
		leader = l
	}
	if asked == 0 {
		return -1, errors.New("no server is running")
	}
	idx := c.serverByRPC(leader)
	switch {
	case idx < 0:
		return -1, fmt.Errorf("leader %q is not a server of this cluster", leader)
	case !c.Servers[idx].Running():
		return -1, fmt.Errorf("leader %s (%s) is not running", c.Servers[idx].Name, leader)
	}
	return idx, nil
}

// WaitForLeader polls until every running server names the same running
// leader, and returns its index.
func (c *Cluster) WaitForLeader(timeout time.Duration) int {
	c.t.Helper()
	var idx int
	WaitFor(c.t, timeout, func() error {
		var err error
		idx, err = c.LeaderNow()
		return err
	})
	return idx
}

// Leader waits (with the default bound) for the servers to agree on a
// leader and returns its index.
func (c *Cluster) Leader() int {
	c.t.Helper()
	return c.WaitForLeader(leaderTimeout)
}

// KillServer sends sig (usually SIGKILL or SIGTERM) to server i and waits
// for the process to exit. It returns the exit code (-1 if killed by the
// signal).
func (c *Cluster) KillServer(i int, sig syscall.Signal) int {
	c.t.Helper()
	return c.kill(c.Servers[i], sig)
}

// KillClient is KillServer for client j.
func (c *Cluster) KillClient(j int, sig syscall.Signal) int {
	c.t.Helper()
	return c.kill(c.Clients[j], sig)
}

func (c *Cluster) kill(a *Agent, sig syscall.Signal) int {
	c.t.Helper()
	if err := a.Signal(sig); err != nil {
		c.t.Fatalf("e2e: signal %s: %v", a.Name, err)
	}
	timeout := stopTimeout
	if sig == syscall.SIGKILL {
		timeout = killTimeout
	}
	code, err := a.Wait(timeout)
	if err != nil {
		c.t.Fatalf("e2e: after %s: %v", sig, err)
	}
	return code
}

// RestartServer starts server i again on the same config, data dir and
// ports, and waits for its HTTP API. It must have been stopped first.
func (c *Cluster) RestartServer(i int) {
	c.t.Helper()
	c.restart(c.Servers[i])
}

// RestartClient is RestartServer for client j.
func (c *Cluster) RestartClient(j int) {
	c.t.Helper()
	c.restart(c.Clients[j])
}

func (c *Cluster) restart(a *Agent) {
	c.t.Helper()
	if err := a.Start(); err != nil {
		c.t.Fatalf("e2e: restart: %v", err)
	}
	if err := a.WaitHTTP(startTimeout); err != nil {
		c.t.Fatalf("e2e: restart: %v", err)
	}
}

// RunCLI runs the roam CLI against the first running server and returns
// stdout, stderr and the exit code.
func (c *Cluster) RunCLI(args ...string) (stdout, stderr string, code int) {
	c.t.Helper()
	i := c.LiveServer()
	if i < 0 {
		c.t.Fatalf("e2e: RunCLI %v: no server is running", args)
	}
	return RunCLIAt(c.t, c.Servers[i].HTTPAddr(), args...)
}

// RunCLIAt runs the roam CLI with -address addr placed right after the
// subcommand words (roam node status -address ADDR [args...]).
func RunCLIAt(t testing.TB, addr string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	roamBinary(t)
	return RunRoam(t, cliTimeout, withAddress(build.commands, addr, args)...)
}

// withAddress inserts -address after the longest prefix of args that names
// a subcommand; failing that, before the first flag or at the end.
func withAddress(commands map[string]bool, addr string, args []string) []string {
	at := -1
	for n := len(args); n > 0 && at < 0; n-- {
		if commands[strings.Join(args[:n], " ")] {
			at = n
		}
	}
	if at < 0 {
		at = len(args)
		for i, a := range args {
			if strings.HasPrefix(a, "-") {
				at = i
				break
			}
		}
	}
	out := make([]string, 0, len(args)+2)
	out = append(out, args[:at]...)
	out = append(out, "-address", addr)
	return append(out, args[at:]...)
}
