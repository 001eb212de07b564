package agent

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/roamhq/roam/structs"
	"github.com/roamhq/roam/testutil"
	"github.com/shoenig/test/must"
)

// newTestAgent starts an agent from TestConfig (a dev agent bound to
// 127.0.0.1 on kernel-chosen ports with a temp data dir); mutate may
// change the config first. A server that no longer bootstraps alone gets
// the LAN Raft timers back. The agent is shut down when the test ends.
func newTestAgent(t testing.TB, mutate func(*Config)) *Agent {
	t.Helper()
	c := TestConfig(t)
	if mutate != nil {
		mutate(c)
	}
	if c.Server.BootstrapExpect != 1 || (c.Server.ServerJoin != nil && len(c.Server.ServerJoin.RetryJoin) > 0) {
		c.RaftTimers = nil
	}
	return testutil.StartAgent(t, func(logs io.Writer) (*Agent, error) { return NewAgent(c, logs) })
}

// newDevAgent starts a dev agent and waits until it leads and its own node
// is ready.
func newDevAgent(t testing.TB) *Agent {
	t.Helper()
	a := newTestAgent(t, nil)
	waitForLeader(t, a)
	waitForNodeReady(t, a, a.Client().NodeID())
	return a
}

func waitForLeader(t testing.TB, a *Agent) {
	t.Helper()
	testutil.WaitForLeader(t, a.Server())
}

// waitForNodeReady polls through a's RPC path until the node is ready.
func waitForNodeReady(t testing.TB, a *Agent, nodeID string) {
	t.Helper()
	testutil.WaitForNodeReady(t, a, nodeID)
}

// registerFakeNode registers a node with the given ID through a's RPC
// path, as a client would, and returns the write's index.
func registerFakeNode(t testing.TB, a *Agent, id string) uint64 {
	t.Helper()
	var reply structs.NodeUpdateResponse
	err := a.RPC("Node.Register", &structs.NodeRegisterRequest{Node: &structs.Node{
		ID:         id,
		SecretID:   "secret-" + id,
		Name:       "fake-" + id[:8],
		Datacenter: "dc1",
		Status:     structs.NodeStatusReady,
		Attributes: map[string]string{"roam.version": "test"},
	}}, &reply)
	must.NoError(t, err)
	return reply.Index
}

// httpResult is one answered request.
type httpResult struct {
	code   int
	header http.Header
	body   []byte
}

// do sends a request to a's HTTP API.
func do(t testing.TB, a *Agent, method, path string) httpResult {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+a.HTTPAddr()+path, nil)
	must.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	return httpResult{code: resp.StatusCode, header: resp.Header, body: body}
}

// get GETs path, requires a 200 and decodes the JSON body into out.
func get(t testing.TB, a *Agent, path string, out any) httpResult {
	t.Helper()
	res := do(t, a, http.MethodGet, path)
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("GET %s: %s", path, res.body))
	must.EqOp(t, "application/json", res.header.Get("Content-Type"))
	must.NoError(t, json.Unmarshal(res.body, out), must.Sprintf("body: %s", res.body))
	return res
}

// requireReadHeaders checks the headers every read answers with.
func requireReadHeaders(t testing.TB, h http.Header) {
	t.Helper()
	idx := h.Get("X-Nomad-Index")
	must.NotEq(t, "", idx, must.Sprint("missing X-Nomad-Index"))
	must.NotEq(t, "0", idx, must.Sprint("X-Nomad-Index must never be 0"))
	must.SliceContains(t, []string{"true", "false"}, h.Get("X-Nomad-KnownLeader"))
	must.NotEq(t, "", h.Get("X-Nomad-LastContact"), must.Sprint("missing X-Nomad-LastContact"))
}
