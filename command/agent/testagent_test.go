package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/roamhq/roam/structs"
	"github.com/roamhq/roam/testutil"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// newTestAgent starts an agent from a dev config bound to 127.0.0.1 on
// kernel-chosen ports with a temp data dir; mutate may change the config
// first. The agent is shut down when the test ends.
func newTestAgent(t testing.TB, mutate func(*Config)) *Agent {
	t.Helper()
	logs := testutil.NewLogWriter(t)
	c := DevConfig()
	c.Name = strings.ReplaceAll(t.Name(), "/", "-")
	c.BindAddr = "127.0.0.1"
	c.Ports = &Ports{HTTP: 0, RPC: 0}
	c.DataDir = t.TempDir()
	c.LogLevel = "INFO"
	if mutate != nil {
		mutate(c)
	}
	a, err := NewAgent(c, logs)
	must.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		must.NoError(t, a.Shutdown(ctx))
	})
	return a
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
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return a.Server().IsLeader() }),
		wait.Timeout(30*time.Second),
		wait.Gap(20*time.Millisecond),
	))
}

// waitForNodeReady polls through a's RPC path until the node is ready.
func waitForNodeReady(t testing.TB, a *Agent, nodeID string) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			var reply structs.SingleNodeResponse
			if err := a.RPC("Node.GetNode", &structs.NodeSpecificRequest{NodeID: nodeID}, &reply); err != nil {
				return err
			}
			if reply.Node == nil || reply.Node.Status != structs.NodeStatusReady {
				return fmt.Errorf("node %s not ready yet", nodeID)
			}
			return nil
		}),
		wait.Timeout(30*time.Second),
		wait.Gap(20*time.Millisecond),
	))
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
