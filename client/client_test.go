package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/nomad"
	"github.com/roamhq/roam/structs"
	"github.com/roamhq/roam/testutil"
)

// testClient starts a client on cfg and shuts it down when the test ends
// (before the servers it talks to, since cleanups run last-in first-out).
func testClient(t *testing.T, cfg *Config) *Client {
	t.Helper()
	c, err := NewClient(cfg)
	must.NoError(t, err)
	t.Cleanup(func() { must.NoError(t, c.Shutdown(context.Background())) })
	return c
}

// waitRegistered waits for the client's first registration.
func waitRegistered(t *testing.T, c *Client) {
	t.Helper()
	select {
	case <-c.Registered():
	case <-time.After(10 * time.Second):
		t.Fatalf("client %s did not register within 10s", c.NodeID())
	}
}

// waitForNode blocks on the server's state store until the node with id
// satisfies ok, and returns it. It wakes on every change to that node, so
// there is no polling interval to tune.
func waitForNode(t *testing.T, s *nomad.Server, id string, timeout time.Duration, desc string, ok func(*structs.Node) bool) *structs.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last *structs.Node
	for {
		store := s.State()
		ws := memdb.NewWatchSet()
		ws.Add(store.AbandonCh())
		node, err := store.NodeByID(ws, id)
		must.NoError(t, err)
		if ok(node) {
			return node
		}
		last = node
		if err := ws.WatchCtx(ctx); err != nil {
			t.Fatalf("node %s on server %s: not %s within %s; last seen %s", id, s.ID(), desc, timeout, describeNode(last))
		}
	}
}

func describeNode(n *structs.Node) string {
	if n == nil {
		return "<absent>"
	}
	return fmt.Sprintf("status=%q modify_index=%d", n.Status, n.ModifyIndex)
}

func isReady(n *structs.Node) bool { return n != nil && n.Status == structs.NodeStatusReady }

// holdReady asserts that the node stays ready on s for d: it blocks on the
// node's watch channel and checks every change until d has passed. Waiting
// out d is the point: the test asserts the absence of a transition.
func holdReady(t *testing.T, s *nomad.Server, id string, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		store := s.State()
		ws := memdb.NewWatchSet()
		ws.Add(store.AbandonCh())
		node, err := store.NodeByID(ws, id)
		must.NoError(t, err)
		must.True(t, isReady(node), must.Sprintf("node %s left ready: %s", id, describeNode(node)))
		if ws.WatchCtx(ctx) != nil {
			return
		}
	}
}

// heartbeatTTL returns the largest TTL a server with cfg hands out to a
// small cluster: MinHeartbeatTTL plus its jitter of up to a quarter.
func heartbeatTTL(cfg *nomad.Config) time.Duration {
	return cfg.MinHeartbeatTTL + cfg.MinHeartbeatTTL/4
}

func TestClient_RegistersWithFingerprint(t *testing.T) {
	srv := testServer(t, nil)
	cfg := TestConfig(t, srv.Addr())
	cfg.NodeName = "worker-1"
	cfg.NodeClass = "gpu"
	cfg.Meta = map[string]string{"rack": "r1"}
	c := testClient(t, cfg)
	waitRegistered(t, c)

	node := waitForNode(t, srv, c.NodeID(), 5*time.Second, "ready", isReady)
	must.Eq(t, "worker-1", node.Name)
	must.Eq(t, "dc1", node.Datacenter)
	must.Eq(t, "gpu", node.NodeClass)
	must.Eq(t, "r1", node.Meta["rack"])
	must.Eq(t, c.SecretID(), node.SecretID)
	must.UUIDv4(t, node.SecretID)

	must.Eq(t, runtime.GOOS, node.Attributes["os.name"])
	must.Eq(t, runtime.GOARCH, node.Attributes["cpu.arch"])
	must.Eq(t, strconv.Itoa(runtime.NumCPU()), node.Attributes["cpu.numcores"])
	mem, err := strconv.ParseUint(node.Attributes["memory.totalbytes"], 10, 64)
	must.NoError(t, err, must.Sprint("memory.totalbytes must be a byte count"))
	must.Positive(t, mem)
	must.Eq(t, "127.0.0.1", node.Attributes["unique.network.ip-address"])

	// The identity is on disk, so a restart comes back as this node.
	buf, err := os.ReadFile(filepath.Join(cfg.DataDir, "client", "identity.json"))
	must.NoError(t, err)
	var id identity
	must.NoError(t, json.Unmarshal(buf, &id))
	must.Eq(t, c.NodeID(), id.NodeID)
	must.Eq(t, c.SecretID(), id.SecretID)

	// The node reads itself, secret included, through its own RPC.
	var resp structs.SingleNodeResponse
	must.NoError(t, c.RPC("Node.GetNode", &structs.NodeSpecificRequest{NodeID: c.NodeID()}, &resp))
	must.NotNil(t, resp.Node)
	must.Eq(t, c.SecretID(), resp.Node.SecretID)
	must.Positive(t, resp.Index)
}

func TestClient_KeepsHeartbeating(t *testing.T) {
	srv := testServer(t, nil)
	c := testClient(t, TestConfig(t, srv.Addr()))
	waitRegistered(t, c)
	waitForNode(t, srv, c.NodeID(), 5*time.Second, "ready", isReady)

	// Without heartbeats the node would be marked down after one TTL plus
	// grace; hold it over three.
	ttl := heartbeatTTL(srv.Config())
	holdReady(t, srv, c.NodeID(), 3*(ttl+srv.Config().HeartbeatGrace))
}

func TestClient_FailsOverToLearnedServer(t *testing.T) {
	// Each case configures the client with one server only and then shuts
	// that server down: the client must carry on through a server it only
	// heard of in a heartbeat reply.
	for _, tc := range []struct {
		name       string
		killLeader bool
	}{
		{name: "follower", killLeader: false},
		{name: "leader", killLeader: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			servers := testCluster(t, 3)
			leader := testutil.WaitForLeader(t, servers...)
			target := leader
			if !tc.killLeader {
				for _, s := range servers {
					if s != leader {
						target = s
						break
					}
				}
			}

			c := testClient(t, TestConfig(t, target.Addr()))
			waitRegistered(t, c)
			waitForNode(t, leader, c.NodeID(), 5*time.Second, "ready", isReady)

			want := make([]string, 0, len(servers))
			for _, s := range servers {
				want = append(want, s.Addr())
			}
			must.Wait(t, wait.InitialSuccess(
				wait.BoolFunc(func() bool { return len(c.Servers()) == len(servers) }),
				wait.Timeout(5*time.Second),
				wait.Gap(10*time.Millisecond),
			), must.Sprintf("client knows %v, want all of %v", c.Servers(), want))
			must.SliceContainsAll(t, want, c.Servers())
			must.Eq(t, target.Addr(), c.Servers()[0], must.Sprint("the configured server stays first"))

			must.NoError(t, target.Shutdown(context.Background()))
			var rest []*nomad.Server
			for _, s := range servers {
				if s != target {
					rest = append(rest, s)
				}
			}
			newLeader := testutil.WaitForLeader(t, rest...)
			cfg := newLeader.Config()
			window := 3 * (heartbeatTTL(cfg) + cfg.HeartbeatGrace)

			if tc.killLeader {
				// The new leader re-arms every node with the failover TTL;
				// the node may not miss it, but is allowed to: what matters
				// is that it comes back and stays.
				waitForNode(t, newLeader, c.NodeID(), 10*time.Second, "ready", isReady)
			}
			// Only heartbeats through a surviving server keep the node ready
			// on the (new) leader over several TTLs.
			holdReady(t, newLeader, c.NodeID(), window)
		})
	}
}

func TestClient_ReregistersWhenServerForgetsNode(t *testing.T) {
	srv := testServer(t, func(c *nomad.Config) { c.OperatorToken = "operator-token" })
	c := testClient(t, TestConfig(t, srv.Addr()))
	waitRegistered(t, c)
	before := waitForNode(t, srv, c.NodeID(), 5*time.Second, "ready", isReady)

	// An operator removes the node (an empty token no longer may).
	var resp structs.GenericResponse
	must.NoError(t, srv.RPC("Node.Deregister", &structs.NodeDeregisterRequest{NodeIDs: []string{c.NodeID()},
		WriteRequest: structs.WriteRequest{AuthToken: "operator-token"}}, &resp))
	must.Greater(t, before.ModifyIndex, resp.Index)

	// The next heartbeat gets ErrUnknownNode and the client registers again
	// as the same node with the same secret.
	after := waitForNode(t, srv, c.NodeID(), 5*time.Second, "registered again and ready", func(n *structs.Node) bool {
		return isReady(n) && n.CreateIndex > resp.Index
	})
	must.Eq(t, c.SecretID(), after.SecretID)
	must.Eq(t, before.Name, after.Name)
	must.Eq(t, before.Attributes, after.Attributes)
	holdReady(t, srv, c.NodeID(), heartbeatTTL(srv.Config())+srv.Config().HeartbeatGrace)
}

func TestClient_RestartKeepsIdentity(t *testing.T) {
	srv := testServer(t, nil)
	cfg := TestConfig(t, srv.Addr())
	first := testClient(t, cfg)
	waitRegistered(t, first)
	before := waitForNode(t, srv, first.NodeID(), 5*time.Second, "ready", isReady)
	nodeID, secret := first.NodeID(), first.SecretID()

	must.NoError(t, first.Shutdown(context.Background()))
	must.NoError(t, first.Shutdown(context.Background()), must.Sprint("a second Shutdown is a no-op"))
	// Shutdown does not deregister: the node times out and goes down.
	waitForNode(t, srv, nodeID, 5*time.Second, "down", func(n *structs.Node) bool {
		return n != nil && n.Status == structs.NodeStatusDown
	})

	restartCfg := TestConfig(t, srv.Addr())
	restartCfg.DataDir = cfg.DataDir
	second := testClient(t, restartCfg)
	must.Eq(t, nodeID, second.NodeID())
	must.Eq(t, secret, second.SecretID())
	waitRegistered(t, second)

	after := waitForNode(t, srv, nodeID, 5*time.Second, "ready again", isReady)
	must.Eq(t, before.CreateIndex, after.CreateIndex, must.Sprint("same node, not a new one"))
	must.Eq(t, secret, after.SecretID)

	nodes, err := srv.State().Nodes(nil)
	must.NoError(t, err)
	must.Len(t, 1, nodes)
}

func TestClient_CorruptIdentity(t *testing.T) {
	for _, tc := range []struct {
		name     string
		contents string
		wantErr  string
	}{
		{name: "not json", contents: "{not json", wantErr: "is corrupt"},
		{name: "bad node id", contents: `{"NodeID":"node-1","SecretID":"s"}`, wantErr: "bad node ID"},
		{name: "missing secret", contents: `{"NodeID":"4c1b2a52-6d3c-4d5e-9f0a-1b2c3d4e5f60"}`, wantErr: "missing secret ID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := TestConfig(t, "127.0.0.1:1")
			path := filepath.Join(cfg.DataDir, "client", "identity.json")
			must.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
			must.NoError(t, os.WriteFile(path, []byte(tc.contents), 0o600))

			c, err := NewClient(cfg)
			must.Nil(t, c)
			must.ErrorContains(t, err, tc.wantErr)
			must.ErrorContains(t, err, path, must.Sprint("the error names the file"))

			// The corrupt file is left for the operator to inspect.
			buf, err := os.ReadFile(path)
			must.NoError(t, err)
			must.Eq(t, tc.contents, string(buf))
		})
	}
}

func TestConfig_Validate(t *testing.T) {
	valid := func() *Config {
		c := DefaultConfig()
		c.DataDir = "/var/lib/roam"
		c.Servers = []string{"127.0.0.1:4647"}
		return c
	}
	must.NoError(t, valid().Validate())

	for _, tc := range []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"missing data dir", func(c *Config) { c.DataDir = "" }, "data_dir"},
		{"no servers", func(c *Config) { c.Servers = nil }, "server"},
		{"no datacenter", func(c *Config) { c.Datacenter = "" }, "datacenter"},
		{"zero retry timeout", func(c *Config) { c.RPCRetryTimeout = 0 }, "retry timeout"},
		{"backoff range inverted", func(c *Config) { c.MaxRetryBackoff = c.MinRetryBackoff / 2 }, "backoff"},
		{"zero dial timeout", func(c *Config) { c.DialTimeout = 0 }, "dial timeout"},
		{"zero csi node call timeout", func(c *Config) { c.CSINodeCallTimeout = 0 }, "csi node call timeout"},
		{"node name with slash", func(c *Config) { c.NodeName = "a/b" }, `node name "a/b" holds '/'`},
		{"plugin ID traversal", func(c *Config) {
			c.CSIPlugins = map[string]*CSIPluginConfig{"../p": {ID: "../p", Type: CSIPluginTypeNode, Socket: "/run/p.sock"}}
		}, `plugin ID "../p"`},
		{"plugin controller_concurrency above 64", func(c *Config) {
			c.CSIPlugins = map[string]*CSIPluginConfig{"ebs": {ID: "ebs", Type: CSIPluginTypeController, Socket: "/run/p.sock", ControllerConcurrency: 65}}
		}, `csi plugin "ebs": controller_concurrency = 65 must be from 1 to 64`},
		{"plugin controller_concurrency negative", func(c *Config) {
			c.CSIPlugins = map[string]*CSIPluginConfig{"ebs": {ID: "ebs", Type: CSIPluginTypeController, Socket: "/run/p.sock", ControllerConcurrency: -1}}
		}, `controller_concurrency = -1`},
		{"plugin controller_concurrency on a node plugin", func(c *Config) {
			c.CSIPlugins = map[string]*CSIPluginConfig{"ebs": {ID: "ebs", Type: CSIPluginTypeNode, Socket: "/run/p.sock", ControllerConcurrency: 2}}
		}, `controller_concurrency is for a controller or monolith plugin, not type "node"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mutate(c)
			before := *c
			must.ErrorContains(t, c.Validate(), tc.wantErr)
			must.Eq(t, before, *c, must.Sprint("Validate changes nothing"))

			cl, err := NewClient(c)
			must.Nil(t, cl)
			must.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestClient_RPCErrors(t *testing.T) {
	srv := testServer(t, nil)
	c := testClient(t, TestConfig(t, srv.Addr()))
	waitRegistered(t, c)

	// A request for another region is answered, not retried.
	var resp structs.SingleNodeResponse
	err := c.RPC("Node.GetNode", &structs.NodeSpecificRequest{
		NodeID:       c.NodeID(),
		QueryOptions: structs.QueryOptions{Region: "mars"},
	}, &resp)
	must.ErrorIs(t, err, structs.ErrWrongRegion)
	must.ErrorContains(t, err, "mars")

	// An unknown method fails too, without retries.
	err = c.RPC("Node.NoSuchMethod", &structs.NodeSpecificRequest{NodeID: c.NodeID()}, &resp)
	must.Error(t, err)
	must.False(t, structs.IsRetryable(err))

	must.NoError(t, c.Shutdown(context.Background()))
	err = c.RPC("Node.GetNode", &structs.NodeSpecificRequest{NodeID: c.NodeID()}, &resp)
	must.ErrorIs(t, err, ErrShutdown)
}

func TestClient_RPCGivesUpWithoutServers(t *testing.T) {
	// Nothing listens on this address once the listener is closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	addr := ln.Addr().String()
	must.NoError(t, ln.Close())

	cfg := TestConfig(t, addr)
	cfg.RPCRetryTimeout = 200 * time.Millisecond
	c := testClient(t, cfg)

	var resp structs.SingleNodeResponse
	err = c.RPC("Node.GetNode", &structs.NodeSpecificRequest{NodeID: c.NodeID()}, &resp)
	must.ErrorContains(t, err, "gave up")
	must.ErrorContains(t, err, addr)
	var opErr *net.OpError
	must.True(t, errors.As(err, &opErr), must.Sprintf("want the dial error wrapped, got %v", err))

	select {
	case <-c.Registered():
		t.Fatal("client registered with no server running")
	default:
	}
}

// A client restarted while no server can be reached counts its outage from
// the last heartbeat before the restart, read back from its state DB, not
// from the restart: its tasks ran on while it was down.
func TestClient_RestartKeepsTheLastContact(t *testing.T) {
	srv := testServer(t, nil)
	cfg := TestConfig(t, srv.Addr())
	began := time.Now()
	first := testClient(t, cfg)
	waitRegistered(t, first)
	var last time.Time
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		first.mu.Lock()
		defer first.mu.Unlock()
		last = first.lastContact
		return !last.IsZero() && first.freeClaimsAfter > 0
	}), wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond)))
	must.NoError(t, first.Shutdown(context.Background()))
	first.mu.Lock()
	last, free := first.lastContact, first.freeClaimsAfter
	first.mu.Unlock()

	// Back up with no server to reach.
	restartCfg := TestConfig(t, "127.0.0.1:1")
	restartCfg.DataDir = cfg.DataDir
	second := testClient(t, restartCfg)
	second.mu.Lock()
	defer second.mu.Unlock()
	// The recorded heartbeat is the last one, or (when the client shut
	// down between a heartbeat and its record) the one before.
	must.True(t, second.lastContact.After(began) && !second.lastContact.After(last),
		must.Sprintf("last contact %s, want between %s and %s", second.lastContact, began, last))
	must.Eq(t, free, second.freeClaimsAfter)
	must.True(t, second.contactFromDisk)
}
