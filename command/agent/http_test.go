package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/rpc"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/roamhq/roam/nomad"
	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

func TestHTTP_StatusLeader(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	var leader string
	res := get(t, a, "/v1/status/leader", &leader)
	must.EqOp(t, a.Server().Addr(), leader)
	requireReadHeaders(t, res.header)
	must.EqOp(t, "true", res.header.Get("X-Nomad-KnownLeader"))
	must.EqOp(t, "0", res.header.Get("X-Nomad-LastContact"))

	// The agent's own region is accepted; another one is bad input.
	get(t, a, "/v1/status/leader?region=global", &leader)
	res = do(t, a, http.MethodGet, "/v1/status/leader?region=mars")
	must.EqOp(t, http.StatusBadRequest, res.code)
	must.StrContains(t, string(res.body), "region")
}

func TestHTTP_StatusPeers(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	var peers []string
	res := get(t, a, "/v1/status/peers", &peers)
	must.Eq(t, []string{a.Server().Addr()}, peers)
	requireReadHeaders(t, res.header)
}

func TestHTTP_AgentSelf(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	var self struct {
		Config map[string]any               `json:"config"`
		Member agentMember                  `json:"member"`
		Stats  map[string]map[string]string `json:"stats"`
	}
	res := get(t, a, "/v1/agent/self", &self)
	requireReadHeaders(t, res.header)

	must.EqOp(t, "global", self.Config["Region"])
	must.EqOp(t, "dc1", self.Config["Datacenter"])
	must.Eq[any](t, a.Config().Name, self.Config["NodeName"])

	host, port, err := net.SplitHostPort(a.Server().Addr())
	must.NoError(t, err)
	must.EqOp(t, a.Config().Name, self.Member.Name)
	must.EqOp(t, host, self.Member.Addr)
	must.EqOp(t, port, strconv.Itoa(int(self.Member.Port)))
	must.EqOp(t, structs.MemberAlive, self.Member.Status)
	must.EqOp(t, "nomad", self.Member.Tags["role"])
	must.EqOp(t, "global", self.Member.Tags["region"])
	must.EqOp(t, "dc1", self.Member.Tags["dc"])
	must.EqOp(t, a.Server().ID(), self.Member.Tags["id"])
	must.EqOp(t, "true", self.Member.Tags["leader"])

	must.EqOp(t, "true", self.Stats["nomad"]["server"])
	must.EqOp(t, "true", self.Stats["nomad"]["leader"])
	must.EqOp(t, a.Server().Addr(), self.Stats["nomad"]["leader_addr"])
	must.EqOp(t, "Leader", self.Stats["raft"]["state"])
	must.EqOp(t, a.Client().NodeID(), self.Stats["client"]["node_id"])
	must.MapContainsKey(t, self.Stats, "runtime")
}

func TestHTTP_AgentMembers(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	var members serverMembers
	res := get(t, a, "/v1/agent/members", &members)
	requireReadHeaders(t, res.header)
	must.EqOp(t, "true", res.header.Get("X-Nomad-KnownLeader"))

	must.EqOp(t, a.Config().Name, members.ServerName)
	must.EqOp(t, "global", members.ServerRegion)
	must.EqOp(t, "dc1", members.ServerDC)
	must.SliceLen(t, 1, members.Members)
	m := members.Members[0]
	host, port, err := net.SplitHostPort(a.Server().Addr())
	must.NoError(t, err)
	must.EqOp(t, a.Config().Name, m.Name)
	must.EqOp(t, host, m.Addr)
	must.EqOp(t, port, strconv.Itoa(int(m.Port)))
	must.EqOp(t, structs.MemberAlive, m.Status)
	must.Eq(t, map[string]string{
		"role": "nomad", "region": "global", "dc": "dc1", "id": a.Server().ID(),
		"rpc_addr": host, "port": port, "raft_vsn": "3", "leader": "true", "voter": "true",
		"build": structs.Version, "expect": "1",
	}, m.Tags)
}

func TestHTTP_NodesList(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	nodeID := a.Client().NodeID()

	var nodes []*structs.NodeListStub
	res := get(t, a, "/v1/nodes", &nodes)
	requireReadHeaders(t, res.header)
	must.EqOp(t, "true", res.header.Get("X-Nomad-KnownLeader"))
	must.SliceLen(t, 1, nodes)
	must.EqOp(t, nodeID, nodes[0].ID)
	must.EqOp(t, structs.NodeStatusReady, nodes[0].Status)
	must.EqOp(t, "dc1", nodes[0].Datacenter)
	must.EqOp(t, structs.NodeSchedulingEligible, nodes[0].SchedulingEligibility)
	index, err := strconv.ParseUint(res.header.Get("X-Nomad-Index"), 10, 64)
	must.NoError(t, err)
	must.GreaterEq(t, nodes[0].ModifyIndex, index)

	// The raw JSON uses Nomad's field names.
	var raw []map[string]any
	must.NoError(t, json.Unmarshal(res.body, &raw))
	for _, key := range []string{"ID", "Name", "Datacenter", "NodeClass", "Drain", "SchedulingEligibility", "Status", "CreateIndex", "ModifyIndex"} {
		must.MapContainsKey(t, raw[0], key)
	}

	get(t, a, "/v1/nodes?prefix="+nodeID[:4], &nodes)
	must.SliceLen(t, 1, nodes)
	res = get(t, a, "/v1/nodes?prefix=zzzz", &nodes)
	must.SliceEmpty(t, nodes)
	must.EqOp(t, "[]\n", string(res.body))

	// A stale read is answered too.
	get(t, a, "/v1/nodes?stale", &nodes)
	must.SliceLen(t, 1, nodes)
}

func TestHTTP_NodesBlockingQuery(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	var nodes []*structs.NodeListStub
	res := get(t, a, "/v1/nodes", &nodes)
	index, err := strconv.ParseUint(res.header.Get("X-Nomad-Index"), 10, 64)
	must.NoError(t, err)

	t.Run("returns after a change", func(t *testing.T) {
		type answer struct {
			res   httpResult
			nodes []*structs.NodeListStub
		}
		done := make(chan answer, 1)
		go func() {
			var nodes []*structs.NodeListStub
			res := get(t, a, fmt.Sprintf("/v1/nodes?index=%d&wait=5m", index), &nodes)
			done <- answer{res, nodes}
		}()
		fakeID := uuid.NewString()
		writeIndex := registerFakeNode(t, a, fakeID)
		must.Greater(t, index, writeIndex)

		// A write by the agent's own client (its node settling) may end
		// the wait first, with an index below the fake node's: ask again
		// from there, as a watcher would, until the fake node is listed.
		for attempt := 0; ; attempt++ {
			must.Less(t, 20, attempt, must.Sprint("the fake node never appeared in a blocking answer"))
			ans := <-done
			requireReadHeaders(t, ans.res.header)
			got, err := strconv.ParseUint(ans.res.header.Get("X-Nomad-Index"), 10, 64)
			must.NoError(t, err)
			must.Greater(t, index, got)
			ids := make([]string, 0, len(ans.nodes))
			for _, n := range ans.nodes {
				ids = append(ids, n.ID)
			}
			if slices.Contains(ids, fakeID) {
				return
			}
			must.Less(t, writeIndex, got, must.Sprintf("index %d is past the fake node's write %d but the node is not listed", got, writeIndex))
			index = got
			go func() {
				var nodes []*structs.NodeListStub
				res := get(t, a, fmt.Sprintf("/v1/nodes?index=%d&wait=5m", index), &nodes)
				done <- answer{res, nodes}
			}()
		}
	})

	t.Run("returns the same index after the wait", func(t *testing.T) {
		// A write elsewhere (the agent's own client may still be settling)
		// legitimately ends a wait early with a newer index; try until a
		// wait passes without one.
		const waitFor = 200 * time.Millisecond
		for attempt := 0; ; attempt++ {
			must.Less(t, 20, attempt, must.Sprint("the nodes table never stayed quiet for one wait"))
			res := get(t, a, "/v1/nodes", &nodes)
			current := res.header.Get("X-Nomad-Index")
			start := time.Now()
			res = get(t, a, "/v1/nodes?index="+current+"&wait=200ms", &nodes)
			requireReadHeaders(t, res.header)
			if res.header.Get("X-Nomad-Index") != current {
				continue
			}
			must.GreaterEq(t, waitFor, time.Since(start))
			return
		}
	})

	t.Run("bad parameters", func(t *testing.T) {
		for _, q := range []string{"index=abc", "index=-1", "wait=5", "wait=soon", "wait=-5s"} {
			res := do(t, a, http.MethodGet, "/v1/nodes?"+q)
			must.EqOp(t, http.StatusBadRequest, res.code, must.Sprintf("query %s", q))
		}
	})
}

func TestHTTP_NodeGet(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	nodeID := a.Client().NodeID()

	t.Run("by ID", func(t *testing.T) {
		var node structs.Node
		res := get(t, a, "/v1/node/"+nodeID, &node)
		requireReadHeaders(t, res.header)
		must.EqOp(t, nodeID, node.ID)
		must.EqOp(t, a.Config().Name, node.Name)
		must.EqOp(t, structs.NodeStatusReady, node.Status)
		must.EqOp(t, a.HTTPAddr(), node.HTTPAddr)
		must.EqOp(t, strconv.FormatUint(node.ModifyIndex, 10), res.header.Get("X-Nomad-Index"))

		var raw map[string]any
		must.NoError(t, json.Unmarshal(res.body, &raw))
		must.MapNotContainsKey(t, raw, "SecretID")
		must.StrNotContains(t, string(res.body), a.Client().SecretID())
	})

	t.Run("by unique prefix", func(t *testing.T) {
		var node structs.Node
		get(t, a, "/v1/node/"+nodeID[:6], &node)
		must.EqOp(t, nodeID, node.ID)
	})

	t.Run("unknown", func(t *testing.T) {
		res := do(t, a, http.MethodGet, "/v1/node/"+uuid.NewString())
		must.EqOp(t, http.StatusNotFound, res.code)
		must.StrContains(t, string(res.body), "node not found")
		requireReadHeaders(t, res.header)
	})

	t.Run("ambiguous prefix", func(t *testing.T) {
		registerFakeNode(t, a, "abcdef01-0000-4000-8000-000000000001")
		registerFakeNode(t, a, "abcdef01-0000-4000-8000-000000000002")
		res := do(t, a, http.MethodGet, "/v1/node/abcdef01")
		must.EqOp(t, http.StatusBadRequest, res.code)
		must.StrContains(t, string(res.body), "ambiguous")
		must.StrContains(t, string(res.body), "abcdef01-0000-4000-8000-000000000001")

		var node structs.Node
		get(t, a, "/v1/node/abcdef01-0000-4000-8000-000000000002", &node)
		must.EqOp(t, "abcdef01-0000-4000-8000-000000000002", node.ID)
	})

	t.Run("unknown sub-paths are not routes", func(t *testing.T) {
		res := do(t, a, http.MethodGet, "/v1/node/"+nodeID+"/nope")
		must.EqOp(t, http.StatusNotFound, res.code)
		res = do(t, a, http.MethodGet, "/v1/node/"+nodeID+"/allocations/x")
		must.EqOp(t, http.StatusNotFound, res.code)
		res = do(t, a, http.MethodGet, "/v1/node/")
		must.EqOp(t, http.StatusNotFound, res.code)
	})
}

func TestHTTP_RaftConfiguration(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	var cfg structs.RaftConfigurationResponse
	res := get(t, a, "/v1/operator/raft/configuration", &cfg)
	requireReadHeaders(t, res.header)
	must.EqOp(t, strconv.FormatUint(max(cfg.Index, 1), 10), res.header.Get("X-Nomad-Index"))
	must.SliceLen(t, 1, cfg.Servers)
	s := cfg.Servers[0]
	must.Eq(t, &structs.RaftServer{
		ID: a.Server().ID(), Node: a.Config().Name, Address: a.Server().Addr(),
		Leader: true, Voter: true, RaftProtocol: "3", Healthy: true,
	}, s)
}

func TestHTTP_RaftTransferLeadership(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	// A single server has no voter to hand over to: a clean error, and the
	// server still leads.
	for _, method := range []string{http.MethodPut, http.MethodPost} {
		res := do(t, a, method, "/v1/operator/raft/transfer-leadership")
		must.EqOp(t, http.StatusBadRequest, res.code)
		must.StrContains(t, string(res.body), "no other voter")
	}
	res := do(t, a, http.MethodPut, "/v1/operator/raft/transfer-leadership?id=a&address=b")
	must.EqOp(t, http.StatusBadRequest, res.code)
	res = do(t, a, http.MethodGet, "/v1/operator/raft/transfer-leadership")
	must.EqOp(t, http.StatusMethodNotAllowed, res.code)
	must.EqOp(t, "POST, PUT", res.header.Get("Allow"))
	must.True(t, a.Server().IsLeader())
}

func TestHTTP_RaftRemovePeer(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	res := do(t, a, http.MethodDelete, "/v1/operator/raft/peer")
	must.EqOp(t, http.StatusBadRequest, res.code)
	res = do(t, a, http.MethodDelete, "/v1/operator/raft/peer?id=a&address=b")
	must.EqOp(t, http.StatusBadRequest, res.code)
	res = do(t, a, http.MethodDelete, "/v1/operator/raft/peer?id=no-such-peer")
	must.EqOp(t, http.StatusNotFound, res.code)
	must.StrContains(t, string(res.body), "no-such-peer")
}

func TestHTTP_Metrics(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	var summary struct {
		Timestamp string
		Gauges    []map[string]any
		Counters  []map[string]any
		Samples   []map[string]any
	}
	res := get(t, a, "/v1/metrics", &summary)
	must.NotEq(t, "", summary.Timestamp)
	requireReadHeaders(t, res.header)

	res = do(t, a, http.MethodGet, "/v1/metrics?format=prometheus")
	must.EqOp(t, http.StatusOK, res.code)
	must.StrHasPrefix(t, "text/plain", res.header.Get("Content-Type"))
	must.StrContains(t, string(res.body), "# TYPE ")

	res = do(t, a, http.MethodGet, "/v1/metrics?format=xml")
	must.EqOp(t, http.StatusBadRequest, res.code)
}

func TestHTTP_Routing(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	for _, path := range []string{"/v1", "/v1/status", "/v1/nope", "/v1/nodes/extra", "/v2/nodes"} {
		res := do(t, a, http.MethodGet, path)
		must.EqOp(t, http.StatusNotFound, res.code, must.Sprintf("GET %s", path))
	}
	res := do(t, a, http.MethodPost, "/v1/nodes")
	must.EqOp(t, http.StatusMethodNotAllowed, res.code)
	must.EqOp(t, "GET", res.header.Get("Allow"))
	res = do(t, a, http.MethodDelete, "/v1/status/leader")
	must.EqOp(t, http.StatusMethodNotAllowed, res.code)

	// ?pretty indents.
	res = do(t, a, http.MethodGet, "/v1/agent/members?pretty")
	must.EqOp(t, http.StatusOK, res.code)
	must.StrContains(t, string(res.body), "\n    \"ServerName\"")
}

// TestHTTP_NoLeader checks that a read needing the leader fails like
// Nomad's while there is none, and that a stale read is still answered.
func TestHTTP_NoLeader(t *testing.T) {
	t.Parallel()
	a := newTestAgent(t, func(c *Config) {
		c.DevMode = false
		c.Client.Enabled = false
		c.Server.BootstrapExpect = 2 // never met: no leader
	})

	var leader string
	res := get(t, a, "/v1/status/leader", &leader)
	must.EqOp(t, "", leader)
	must.EqOp(t, "false", res.header.Get("X-Nomad-KnownLeader"))
	requireReadHeaders(t, res.header)

	res = do(t, a, http.MethodGet, "/v1/nodes")
	must.EqOp(t, http.StatusInternalServerError, res.code)
	must.EqOp(t, "No cluster leader\n", string(res.body))

	var nodes []*structs.NodeListStub
	res = get(t, a, "/v1/nodes?stale", &nodes)
	must.SliceEmpty(t, nodes)
	must.EqOp(t, "false", res.header.Get("X-Nomad-KnownLeader"))
	requireReadHeaders(t, res.header)
}

// TestHTTP_ClientOnlyAgent checks that an agent without a server answers
// through its client's connection to the servers.
func TestHTTP_ClientOnlyAgent(t *testing.T) {
	t.Parallel()
	srv := newTestAgent(t, func(c *Config) { c.Client.Enabled = false })
	waitForLeader(t, srv)

	cl := newTestAgent(t, func(c *Config) {
		c.Name = "client-only"
		c.DevMode = false
		c.Server.Enabled = false
		c.Client.Servers = []string{srv.Server().Addr()}
	})
	must.Nil(t, cl.Server())
	nodeID := cl.Client().NodeID()
	waitForNodeReady(t, srv, nodeID)

	var leader string
	res := get(t, cl, "/v1/status/leader", &leader)
	must.EqOp(t, srv.Server().Addr(), leader)
	requireReadHeaders(t, res.header)

	var nodes []*structs.NodeListStub
	res = get(t, cl, "/v1/nodes", &nodes)
	requireReadHeaders(t, res.header)
	must.EqOp(t, "true", res.header.Get("X-Nomad-KnownLeader"))
	must.SliceLen(t, 1, nodes)
	must.EqOp(t, nodeID, nodes[0].ID)

	// The client asks with its own secret; the API must still not show it.
	var node structs.Node
	res = get(t, cl, "/v1/node/"+nodeID[:8], &node)
	must.EqOp(t, nodeID, node.ID)
	must.EqOp(t, "client-only", node.Name)
	must.StrNotContains(t, string(res.body), cl.Client().SecretID())

	var members serverMembers
	get(t, cl, "/v1/agent/members", &members)
	must.SliceLen(t, 1, members.Members)
	must.EqOp(t, srv.Server().ID(), members.Members[0].Tags["id"])

	var self agentSelf
	get(t, cl, "/v1/agent/self", &self)
	must.EqOp(t, "client-only", self.Member.Name)
	must.EqOp(t, "client", self.Member.Tags["role"])
	must.EqOp(t, "false", self.Stats["nomad"]["server"])
	must.EqOp(t, nodeID, self.Stats["client"]["node_id"])

	var cfg structs.RaftConfigurationResponse
	get(t, cl, "/v1/operator/raft/configuration", &cfg)
	must.SliceLen(t, 1, cfg.Servers)

	res = do(t, cl, http.MethodGet, "/v1/node/"+uuid.NewString())
	must.EqOp(t, http.StatusNotFound, res.code)
}

// TestHTTP_ShutdownEndsBlockingQuery checks that a blocking query does not
// hold up the HTTP server's shutdown: it is answered with 503 at once.
func TestHTTP_ShutdownEndsBlockingQuery(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	var nodes []*structs.NodeListStub
	res := get(t, a, "/v1/nodes", &nodes)
	index := res.header.Get("X-Nomad-Index")

	req, err := http.NewRequestWithContext(t.Context(),
		http.MethodGet, "http://"+a.HTTPAddr()+"/v1/nodes?wait=10m&index="+index, nil)
	must.NoError(t, err)
	codeCh := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			codeCh <- 0
			return
		}
		resp.Body.Close()
		codeCh <- resp.StatusCode
	}()
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return a.http.rpcWaiting.Load() == 1 }),
		wait.Timeout(30*time.Second),
		wait.Gap(5*time.Millisecond),
	))

	// Shutdown waits for the request in flight, but not for its 10 minutes.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	must.NoError(t, a.http.Shutdown(ctx))
	must.EqOp(t, http.StatusServiceUnavailable, <-codeCh)
}

func TestErrorStatus(t *testing.T) {
	cases := []struct {
		err  error
		code int
		msg  string
	}{
		{structs.ErrNoLeader, 500, "No cluster leader"},
		{fmt.Errorf("wrapped: %w", structs.ErrNoLeader), 500, "No cluster leader"},
		{structs.FromRPCError(rpc.ServerError(structs.EncodeRPCError(fmt.Errorf("%w: waited 5s", structs.ErrNoLeader)))), 500, "No cluster leader"},
		{structs.FromRPCError(rpc.ServerError("rpc error: no cluster leader")), 500, "No cluster leader"},
		{structs.FromRPCError(rpc.ServerError(structs.EncodeRPCError(fmt.Errorf("%w: job x", structs.ErrNotFound)))), 404, "not found: job x"},
		{structs.FromRPCError(rpc.ServerError(structs.EncodeRPCError(fmt.Errorf("%w: class not found", structs.ErrInvalidRequest)))), 400, "invalid request: class not found"},
		{structs.FromRPCError(rpc.ServerError(structs.EncodeRPCError(errors.New("disk: no cluster leader here")))), 500, "disk: no cluster leader here"},
		{fmt.Errorf("%w: bad token", structs.ErrPermissionDenied), 403, "permission denied: bad token"},
		{fmt.Errorf("%w: x", structs.ErrUnknownNode), 404, "unknown node: x"},
		{structs.ErrNotFound, 404, "not found"},
		{fmt.Errorf("%w: missing id", structs.ErrInvalidRequest), 400, "invalid request: missing id"},
		{structs.ErrAmbiguousPrefix, 400, "ambiguous id prefix"},
		{structs.ErrWrongRegion, 400, "unknown region"},
		{structs.ErrShutdown, 503, "server shutting down"},
		{nomad.ErrServerClosed, 503, "server closed"},
		{badRequest("bad %s", "thing"), 400, "bad thing"},
		{errors.New("boom"), 500, "boom"},
	}
	for _, tc := range cases {
		code, msg := errorStatus(tc.err)
		must.EqOp(t, tc.code, code, must.Sprintf("error %v", tc.err))
		must.EqOp(t, tc.msg, msg)
	}
}
