//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// The attacks of issue 12, each sent as an attacker on the same network
// would: raw frames to a server's RPC port, with no credential but what
// the attacker made up. Each must fail with an error that says why and
// change nothing: Raft configuration and leader, node list, allocation
// status, the volume's data and the node's identity file.

// trustIntroToken is the node introduction credential of the trust
// cluster: its servers require it of new nodes, its client shows it.
const trustIntroToken = "e2e-intro-token-6b1f"

// trustEnv is a one-server, one-client cluster with a registered volume
// holding data and a running job whose task has a secret in its env.
type trustEnv struct {
	cc       *csiCluster
	server   *Agent
	client   *Agent
	nodeID   string
	extID    string
	volFile  string
	identity string
	jobID    string
}

// startTrustEnv starts the trust cluster; more, when given, changes its
// options (adds TLS).
func startTrustEnv(t *testing.T, more ...func(*csiOpts)) *trustEnv {
	opts := csiOpts{
		Servers: 1, Clients: 1,
		ServerConfigExtra: fmt.Sprintf("server {\n  client_intro_tokens = [%q]\n}\n", trustIntroToken),
		// The HTTP address the node reports is one where nothing answers:
		// log requests must not go there.
		ClientConfigExtra: fmt.Sprintf("client {\n  intro_token = %q\n}\nadvertise {\n  http = \"127.0.0.1:1\"\n}\n", trustIntroToken),
	}
	for _, f := range more {
		f(&opts)
	}
	cc := startCSICluster(t, opts)
	e := &trustEnv{
		cc:       cc,
		server:   cc.Servers[0],
		client:   cc.Clients[0],
		nodeID:   cc.NodeIDs["client-0"],
		identity: filepath.Join(cc.Clients[0].DataDir, "client", "identity.json"),
		jobID:    "trust-app",
	}
	ext := cc.createVolumes(t, "client-0", "trust-vol")
	e.extID = ext[0]
	cc.registerVolumeHTTP(t, "trust-vol", e.extID)
	e.volFile = filepath.Join(cc.StateDir, "volumes", e.extID, "precious.txt")
	must.NoError(t, os.WriteFile(e.volFile, []byte("do not delete\n"), 0o644))

	cc.RunJob(fmt.Sprintf(`job %q {
  type        = "service"
  datacenters = ["dc1"]
  group "g" {
    count = 1
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo app started; sleep 3600"]
      }
      env {
        DB_PASSWORD = "hunter2"
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
`, e.jobID))
	cc.WaitJobAllocs(e.jobID, csiSettle, func(list []*Alloc) error {
		if len(running(list)) != 1 {
			return fmt.Errorf("want 1 running allocation:\n%s", allocTable(list))
		}
		return nil
	})
	return e
}

// trustState is what an attack must leave as it was.
type trustState struct {
	Leader    string
	Raft      string
	Nodes     string
	Allocs    string
	Volume    string
	VolData   string
	Identity  string
	JobsIndex uint64
}

func (e *trustEnv) snapshot(t *testing.T) trustState {
	t.Helper()
	var s trustState
	var err error
	s.Leader, err = StatusLeader(e.server.HTTPAddr())
	must.NoError(t, err)
	rc, err := RaftConfig(e.server.HTTPAddr())
	must.NoError(t, err)
	var servers []string
	for _, srv := range rc.Servers {
		servers = append(servers, fmt.Sprintf("%s@%s voter=%v", srv.ID, srv.Address, srv.Voter))
	}
	sort.Strings(servers)
	s.Raft = strings.Join(servers, ", ")

	nodes, err := Nodes(e.server.HTTPAddr(), false)
	must.NoError(t, err)
	var ns []string
	for _, n := range nodes {
		ns = append(ns, fmt.Sprintf("%s %s %s", n.ID, n.Name, n.Status))
	}
	sort.Strings(ns)
	s.Nodes = strings.Join(ns, "; ")

	allocs, err := JobAllocs(e.server.HTTPAddr(), e.jobID)
	must.NoError(t, err)
	var as []string
	for _, a := range allocs {
		as = append(as, fmt.Sprintf("%s %s %s/%s", a.ID, a.NodeID, a.DesiredStatus, a.ClientStatus))
	}
	sort.Strings(as)
	s.Allocs = strings.Join(as, "; ")

	vol, err := e.cc.volume("trust-vol")
	must.NoError(t, err)
	s.Volume = vol.ID + " " + vol.ExternalID

	data, err := os.ReadFile(e.volFile)
	must.NoError(t, err, must.Sprint("the volume's data must still be there"))
	s.VolData = string(data)

	id, err := os.ReadFile(e.identity)
	must.NoError(t, err)
	sum := sha256.Sum256(id)
	s.Identity = hex.EncodeToString(sum[:])

	var jobs []map[string]any
	meta, err := GetJSONMeta(e.server.HTTPAddr(), "/v1/jobs", &jobs)
	must.NoError(t, err)
	s.JobsIndex = meta.Index
	return s
}

// mustUnchanged checks, for a while, that nothing moved since before.
// Some effects of an attack (a voter added by the leader's reconcile
// loop, a node marked down) land a moment after the reply, so the check
// keeps looking for about three join intervals.
func (e *trustEnv) mustUnchanged(t *testing.T, before trustState) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		after := e.snapshot(t)
		must.Eq(t, before, after, must.Sprint("an attack changed the cluster"))
		if time.Now().After(deadline) {
			return
		}
		select {
		case <-time.After(250 * time.Millisecond):
		case <-t.Context().Done():
			return
		}
	}
}

// rpcFrame is a msgpack RPC request: header, then body.
func rpcFrame(t *testing.T, method string, body any) []byte {
	t.Helper()
	b := rpcHeader(method, 1)
	var enc []byte
	must.NoError(t, codec.NewEncoderBytes(&enc, structs.MsgpackHandle).Encode(body))
	return append(b, enc...)
}

// mustRefused sends one raw RPC as the attacker and checks the reply is a
// refusal naming why.
func mustRefused(t *testing.T, addr, method string, body any, want string) {
	t.Helper()
	ans, err := rawRPC(attackerAddr(1), addr, rpcFrame(t, method, body), 10*time.Second)
	must.NoError(t, err)
	must.False(t, ans.Closed, must.Sprintf("%s: connection closed without an answer", method))
	must.StrContains(t, ans.Error, want, must.Sprintf("%s: the refusal must say why", method))
	t.Logf("%s refused: %s", method, ans.Error)
}

func TestTrust_Attacks(t *testing.T) {
	e := startTrustEnv(t)
	rpcAddr := e.server.RPCAddr()

	// Attack 3: an empty token deregisters a live node, and a new secret
	// takes its ID over.
	t.Run("deregister_node_without_token", func(t *testing.T) {
		before := e.snapshot(t)
		mustRefused(t, rpcAddr, "Node.Deregister",
			&structs.NodeDeregisterRequest{NodeIDs: []string{e.nodeID}}, "permission denied")
		mustRefused(t, rpcAddr, "Node.Deregister",
			&structs.NodeDeregisterRequest{NodeIDs: []string{e.nodeID},
				WriteRequest: structs.WriteRequest{AuthToken: uuid.NewString()}}, "permission denied")
		e.mustUnchanged(t, before)
	})
	t.Run("register_over_existing_node", func(t *testing.T) {
		before := e.snapshot(t)
		mustRefused(t, rpcAddr, "Node.Register", &structs.NodeRegisterRequest{
			Node: &structs.Node{ID: e.nodeID, SecretID: uuid.NewString(), Name: "client-0",
				Datacenter: "dc1", Status: structs.NodeStatusReady, HTTPAddr: "127.0.1.1:1"},
			IntroToken: trustIntroToken,
		}, "another secret")
		e.mustUnchanged(t, before)
	})

	// Attack 5: a rogue node with a fresh ID registers, to be handed
	// allocations and their secrets.
	t.Run("rogue_node_register", func(t *testing.T) {
		before := e.snapshot(t)
		rogue := func(intro string) *structs.NodeRegisterRequest {
			return &structs.NodeRegisterRequest{
				Node: &structs.Node{ID: uuid.NewString(), SecretID: uuid.NewString(), Name: "rogue",
					Datacenter: "dc1", Status: structs.NodeStatusReady, HTTPAddr: "127.0.1.1:1",
					Drivers: map[string]*structs.DriverInfo{"raw_exec": {Detected: true, Healthy: true}}},
				IntroToken: intro,
			}
		}
		mustRefused(t, rpcAddr, "Node.Register", rogue(""), "must show an intro token")
		mustRefused(t, rpcAddr, "Node.Register", rogue("guessed"), "intro token is not one the servers accept")
		e.mustUnchanged(t, before)
	})

	// Attack 5, second half: log requests went to the HTTPAddr the node
	// reported, with the caller's token. They now reach the node over its
	// session; the address it reports is never dialled.
	t.Run("logs_over_node_session", func(t *testing.T) {
		before := e.snapshot(t)
		allocs, err := JobAllocs(e.server.HTTPAddr(), e.jobID)
		must.NoError(t, err)
		must.SliceLen(t, 1, running(allocs))
		var body string
		WaitFor(t, settle, func() error {
			resp, err := httpClient.Get(e.server.HTTPAddr() + "/v1/client/fs/logs/" + running(allocs)[0].ID + "?task=t&type=stdout")
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var b bytes.Buffer
			if _, err := b.ReadFrom(resp.Body); err != nil {
				return err
			}
			if resp.StatusCode != 200 || !strings.Contains(b.String(), "app started") {
				return fmt.Errorf("logs through the server: %s: %q", resp.Status, b.String())
			}
			body = b.String()
			return nil
		})
		must.Eq(t, "app started\n", body)
		e.mustUnchanged(t, before)
	})

	// Attack 4: ClientRPC.Forward asks the node's controller plugin to
	// delete a volume Roam still lists.
	t.Run("forward_controller_delete", func(t *testing.T) {
		before := e.snapshot(t)
		var args []byte
		must.NoError(t, codec.NewEncoderBytes(&args, structs.MsgpackHandle).Encode(
			&structs.ClientCSIControllerDeleteVolumeRequest{PluginID: csiPluginID, ExternalVolumeID: e.extID}))
		req := &structs.ClientRPCForwardRequest{NodeID: e.nodeID, Method: "ClientCSI.ControllerDeleteVolume", Args: args}
		mustRefused(t, rpcAddr, "ClientRPC.Forward", req, "not a server")
		req.AuthToken = uuid.NewString()
		mustRefused(t, rpcAddr, "ClientRPC.Forward", req, "not a server")
		e.mustUnchanged(t, before)
	})

	// Attack 2: a Join naming a made-up server adds it as a voter (and a
	// one-server cluster loses quorum); a Join claiming a real server's
	// address under another ID replaces that voter.
	join := func(t *testing.T, addr string) {
		req := &structs.ServerJoinRequest{Member: structs.ServerMember{
			ID: uuid.NewString(), Name: "rogue-server", Addr: addr, Region: "global", Datacenter: "dc1",
			Status: structs.MemberAlive, Voter: true,
		}}
		ans, err := rawRPC(attackerAddr(1), rpcAddr, rpcFrame(t, "Status.Join", req), 10*time.Second)
		must.NoError(t, err)
		must.False(t, ans.Closed)
		t.Logf("Status.Join naming %s answered %q", addr, ans.Error)
	}
	t.Run("join_claims_real_address", func(t *testing.T) {
		before := e.snapshot(t)
		join(t, rpcAddr)
		e.mustUnchanged(t, before)
		must.SliceEmpty(t, logLines(e.server, "removing stale raft peer", "remove stale raft peer"),
			must.Sprint("a Join made the leader try to remove a live voter"))
	})
	t.Run("join_made_up_server", func(t *testing.T) {
		before := e.snapshot(t)
		join(t, "127.0.0.1:"+strconv.Itoa(FreePorts(t, 1)[0]))
		e.mustUnchanged(t, before)
		must.StrNotContains(t, strings.Join(logLines(e.server, "adding server as voter"), "\n"), "rogue")
	})

	// Attack 1: a Raft AppendEntries with a higher term, sent to the RPC
	// port, deposes the leader and truncates its log to plant an entry.
	t.Run("raft_append_entries", func(t *testing.T) {
		before := e.snapshot(t)
		stepDowns := len(logLines(e.server, "entering follower state"))
		job := &structs.Job{ID: "planted", Name: "planted", Type: "service", Datacenters: []string{"dc1"}}
		data, err := structs.Encode(structs.JobRegisterRequestType, &structs.JobRegisterRequest{Job: job})
		must.NoError(t, err)
		for _, who := range []struct{ id, addr string }{
			{uuid.NewString(), "127.0.1.1:4647"},
			{uuid.NewString(), rpcAddr}, // a made-up ID at the server's own address
		} {
			req := raft.AppendEntriesRequest{
				RPCHeader:         raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(who.id), Addr: []byte(who.addr)},
				Term:              1 << 40,
				Entries:           []*raft.Log{{Index: 1, Term: 1 << 40, Type: raft.LogCommand, Data: data}},
				LeaderCommitIndex: 1,
			}
			errStr := rawRaft(t, rpcAddr, &req)
			must.StrContains(t, errStr, "not a server", must.Sprintf("AppendEntries from %s@%s", who.id, who.addr))
			t.Logf("AppendEntries from %s refused: %s", who.addr, errStr)

			hb := raft.AppendEntriesRequest{
				RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(who.id), Addr: []byte(who.addr)},
				Term:      1<<40 + 1,
			}
			errStr = rawRaft(t, rpcAddr, &hb)
			must.StrContains(t, errStr, "not a server", must.Sprintf("heartbeat from %s@%s", who.id, who.addr))
		}
		e.mustUnchanged(t, before)
		must.Eq(t, stepDowns, len(logLines(e.server, "entering follower state")),
			must.Sprint("the leader stepped down for a forged term"))
		var got map[string]any
		must.Error(t, GetJSON(e.server.HTTPAddr(), "/v1/job/planted", &got))
	})
}

// rawRaft sends one AppendEntries on a Raft connection to the RPC port
// (protocol byte 0x02) and returns the error string of the answer.
func rawRaft(t *testing.T, addr string, req *raft.AppendEntriesRequest) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	must.NoError(t, err)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	var buf bytes.Buffer
	buf.WriteByte(structs.RPCRaft)
	buf.WriteByte(0) // raft's rpcAppendEntries
	h := &codec.MsgpackHandle{}
	must.NoError(t, codec.NewEncoder(&buf, h).Encode(req))
	_, err = conn.Write(buf.Bytes())
	must.NoError(t, err)
	dec := codec.NewDecoder(bufio.NewReader(conn), h)
	var errStr string
	must.NoError(t, dec.Decode(&errStr), must.Sprint("read the raft answer"))
	var resp raft.AppendEntriesResponse
	_ = dec.Decode(&resp)
	return errStr
}

// Attack 7: outside -dev an agent without TLS that binds a non-loopback
// address refuses to start, and says why.
func TestTrust_NonLoopbackBindNeedsTLS(t *testing.T) {
	dir := t.TempDir()
	p := FreePorts(t, 2)
	path := filepath.Join(dir, "agent.hcl")
	must.NoError(t, os.WriteFile(path, []byte(fmt.Sprintf(`data_dir  = %q
bind_addr = "0.0.0.0"
ports {
  http = %d
  rpc  = %d
}
server {
  enabled          = true
  bootstrap_expect = 1
}
`, filepath.Join(dir, "data"), p[0], p[1])), 0o644))
	_, errOut, code := RunRoam(t, 30*time.Second, "agent", "-config", path)
	must.NotEq(t, 0, code, must.Sprintf("agent started on 0.0.0.0 without TLS:\n%s", errOut))
	must.StrContains(t, errOut, "insecure_bind")
	must.StrContains(t, errOut, "not a loopback address")
	for _, port := range p {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err == nil {
			c.Close()
		}
		must.Error(t, err, must.Sprintf("port %d is listening", port))
	}
}

// Attack 6: a task reads the node's identity through its alloc dir, or a
// secret from the agent's environment. client-0 runs raw_exec (enabled in
// its config) and, when the test runs as root, runs tasks that name no
// user as nobody (default_user); client-1, in dc2, has a config that does
// not enable raw_exec.
func TestTrust_TaskCannotReachAgentSecrets(t *testing.T) {
	const agentSecret = "agent-env-secret-5e0c"
	// The agents inherit the test's environment.
	t.Setenv("ROAM_E2E_AGENT_SECRET", agentSecret)
	asRoot := os.Geteuid() == 0
	c := StartCluster(t, Opts{
		Servers: 1, Clients: 2,
		ClientConfigFor: func(name string) string {
			switch {
			case name == "client-1":
				return "datacenter = \"dc2\"\nplugin \"raw_exec\" {\n  config {\n    enabled = false\n  }\n}\n"
			case asRoot:
				return "plugin \"raw_exec\" {\n  config {\n    default_user = \"nobody\"\n  }\n}\n"
			}
			return ""
		},
	})
	if asRoot {
		// The test's own temp dirs are 0700; the client's data dir and
		// alloc dirs beneath them are the client's to lay out.
		for d := c.Dir; strings.HasPrefix(d, os.TempDir()+string(filepath.Separator)); d = filepath.Dir(d) {
			must.NoError(t, os.Chmod(d, 0o711))
		}
	}
	ids := c.NodeIDs()
	identity := filepath.Join(c.Clients[1].DataDir, "client", "identity.json")
	idBefore, err := os.ReadFile(identity)
	must.NoError(t, err)

	// The node without raw_exec does not offer it.
	var node struct{ Drivers map[string]any }
	must.NoError(t, GetJSON(c.API(), "/v1/node/"+ids["client-1"], &node))
	must.MapNotContainsKey(t, node.Drivers, "raw_exec")

	// A raw_exec job aimed at it is never placed, so its task never
	// runs to read the identity.
	steal := func(id, dc string) string {
		return fmt.Sprintf(`job %q {
  type        = "batch"
  datacenters = [%q]
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "id -u; env; cat ../../../client/identity.json; echo done"]
      }
      env {
        GIVEN_BY_JOB = "job-value"
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
`, id, dc)
	}
	c.RunJob(steal("steal-dc2", "dc2"))
	WaitFor(t, settle, func() error {
		evals, err := JobEvals(c.API(), "steal-dc2")
		if err != nil {
			return err
		}
		if len(evals) == 0 || !evals[0].Terminal() && evals[0].Status != "blocked" {
			return fmt.Errorf("evaluation not settled: %+v", evals)
		}
		return nil
	})
	allocs, err := JobAllocs(c.API(), "steal-dc2")
	must.NoError(t, err)
	must.SliceEmpty(t, allocs, must.Sprintf("a raw_exec task was placed on a node without raw_exec:\n%s", allocTable(allocs)))
	idAfter, err := os.ReadFile(identity)
	must.NoError(t, err)
	must.Eq(t, string(idBefore), string(idAfter))

	// On the node that runs raw_exec, the task's environment holds what
	// the job gave it and Roam's variables, not the agent's.
	c.RunJob(steal("env-dc1", "dc1"))
	list := c.WaitJobAllocs("env-dc1", settle, func(list []*Alloc) error {
		if len(list) != 1 || list[0].ClientStatus != "complete" {
			return fmt.Errorf("want 1 complete allocation:\n%s", allocTable(list))
		}
		return nil
	})
	var out string
	WaitFor(t, settle, func() error {
		resp, err := httpClient.Get(c.ClientHTTP(0) + "/v1/client/fs/logs/" + list[0].ID + "?task=t&type=stdout&plain=true")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		if _, err := b.ReadFrom(resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != 200 || !strings.Contains(b.String(), "done") {
			return fmt.Errorf("logs: %s: %q", resp.Status, b.String())
		}
		out = b.String()
		return nil
	})
	must.StrContains(t, out, "GIVEN_BY_JOB=job-value")
	must.StrContains(t, out, "ROAM_ALLOC_ID="+list[0].ID)
	must.StrNotContains(t, out, agentSecret, must.Sprint("the agent's environment reached the task"))
	must.StrNotContains(t, out, "ROAM_E2E_AGENT_SECRET")

	// A task that runs as another user cannot read the identity through
	// its alloc dir. (Run as the client's own user, root here, it could:
	// raw_exec has no isolation; see docs/trust.md.)
	if !asRoot {
		t.Log("not root: skipping the task user cases")
		return
	}
	identity0 := filepath.Join(c.Clients[0].DataDir, "client", "identity.json")
	id0, err := os.ReadFile(identity0)
	must.NoError(t, err)
	var ident struct{ SecretID string }
	must.NoError(t, json.Unmarshal(id0, &ident))
	must.NotEq(t, "", ident.SecretID)
	nobody, err := user.Lookup("nobody")
	must.NoError(t, err)

	// The job above named no user: on client-0 it ran as default_user,
	// and could not read the identity.
	must.True(t, strings.HasPrefix(out, nobody.Uid+"\n"), must.Sprintf("the task did not run as default_user nobody: %q", out))
	must.StrNotContains(t, out, ident.SecretID, must.Sprint("a task read the node's secret"))
	c.RunJob(`job "as-nobody" {
  type        = "batch"
  datacenters = ["dc1"]
  group "g" {
    task "t" {
      driver = "raw_exec"
      user   = "nobody"
      config {
        command = "/bin/sh"
        args    = ["-c", "id -u; cat ../../../client/identity.json; cat ` + identity0 + `; ls ../../../client; ls ../..; echo done"]
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
`)
	list = c.WaitJobAllocs("as-nobody", settle, func(list []*Alloc) error {
		if len(list) != 1 || !list[0].ClientTerminal() {
			return fmt.Errorf("want 1 finished allocation:\n%s", allocTable(list))
		}
		return nil
	})
	logs := func(stream string) string {
		resp, err := httpClient.Get(c.ClientHTTP(0) + "/v1/client/fs/logs/" + list[0].ID + "?task=t&type=" + stream + "&plain=true")
		must.NoError(t, err)
		defer resp.Body.Close()
		var b bytes.Buffer
		_, err = b.ReadFrom(resp.Body)
		must.NoError(t, err)
		must.EqOp(t, 200, resp.StatusCode, must.Sprintf("%s logs: %s", stream, b.String()))
		return b.String()
	}
	stdout, stderr := logs("stdout"), logs("stderr")
	t.Logf("task as nobody: stdout %q, stderr %q", stdout, stderr)
	must.StrContains(t, stdout, "done", must.Sprintf("the task did not run to its end; stderr: %s", stderr))
	must.True(t, strings.HasPrefix(stdout, nobody.Uid+"\n"), must.Sprintf("the task did not run as nobody: %q", stdout))
	must.StrNotContains(t, stdout+stderr, ident.SecretID, must.Sprint("a task running as nobody read the node's secret"))
	must.StrContains(t, stderr, "Permission denied")
	must.StrContains(t, stderr, "cannot open directory '../..'", must.Sprint("the task listed the node's allocations"))
	idAfter0, err := os.ReadFile(identity0)
	must.NoError(t, err)
	must.Eq(t, string(id0), string(idAfter0))
}
