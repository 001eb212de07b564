package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// /debug/pprof/ answers only with enable_debug; with ACLs on, only to a
// token with agent:write.
func TestHTTP_DebugPprof(t *testing.T) {
	c, err := ParseConfig("agent.hcl", []byte("enable_debug = true\n"))
	must.NoError(t, err)
	must.True(t, DefaultConfig().Merge(c).EnableDebug, must.Sprint("enable_debug from a file"))

	off := newTestAgent(t, nil)
	code, body := aclDo(t, off, http.MethodGet, "/debug/pprof/cmdline", "", nil)
	must.EqOp(t, http.StatusNotFound, code)
	must.StrContains(t, body, "enable_debug")

	on := newTestAgent(t, func(c *Config) { c.EnableDebug = true })
	code, body = aclDo(t, on, http.MethodGet, "/debug/pprof/", "", nil)
	must.EqOp(t, http.StatusOK, code)
	must.StrContains(t, body, "goroutine")
	code, body = aclDo(t, on, http.MethodGet, "/debug/pprof/goroutine?debug=1", "", nil)
	must.EqOp(t, http.StatusOK, code)
	must.StrContains(t, body, "goroutine profile:")
	code, _ = aclDo(t, on, http.MethodGet, "/debug/pprof/cmdline", "", nil)
	must.EqOp(t, http.StatusOK, code)
	code, _ = aclDo(t, on, http.MethodDelete, "/debug/pprof/heap", "", nil)
	must.EqOp(t, http.StatusMethodNotAllowed, code)

	acl, mgmt := newACLAgentWith(t, func(c *Config) { c.EnableDebug = true })
	reader := aclHTTPToken(t, acl, mgmt, "agent-read", `agent { policy = "read" }`)
	writer := aclHTTPToken(t, acl, mgmt, "agent-write", `agent { policy = "write" }`)
	for _, tc := range []struct {
		name, token string
		want        int
	}{
		{"anonymous", "", http.StatusForbidden},
		{"agent:read", reader, http.StatusForbidden},
		{"agent:write", writer, http.StatusOK},
		{"management", mgmt, http.StatusOK},
	} {
		code, body := aclDo(t, acl, http.MethodGet, "/debug/pprof/heap?debug=1", tc.token, nil)
		must.EqOp(t, tc.want, code, must.Sprintf("%s: %s", tc.name, body))
	}
}

// profileGet is a GET with the server headers of the answer.
func profileGet(t *testing.T, a *Agent, path, token string) (code int, body []byte, serverID string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+a.HTTPAddr()+path, nil)
	must.NoError(t, err)
	if token != "" {
		req.Header.Set("X-Nomad-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	defer resp.Body.Close()
	body, err = io.ReadAll(resp.Body)
	must.NoError(t, err)
	return resp.StatusCode, body, resp.Header.Get("X-Roam-Server-ID")
}

// /v1/agent/pprof/ takes a profile of the agent itself or, with
// server_id, of the server named, which checks its own enable_debug.
func TestHTTP_AgentPprofAcrossServers(t *testing.T) {
	// Server 2 runs without enable_debug.
	agents, leader := newTestServersWith(t, 3, func(i int, c *Config) { c.EnableDebug = i != 2 })
	a0, a1, a2 := agents[0], agents[1], agents[2]
	id1, id2 := a1.Server().ID(), a2.Server().ID()
	waitForMembers(t, a0, 3)

	code, body, from := profileGet(t, a0, "/v1/agent/pprof/goroutine?debug=1&server_id="+id1, "")
	must.EqOp(t, http.StatusOK, code, must.Sprint(string(body)))
	must.Eq(t, id1, from, must.Sprint("the profile came from another server than the one named"))
	must.StrContains(t, string(body), "goroutine profile:")

	code, body, from = profileGet(t, a0, "/v1/agent/pprof/profile?seconds=1&server_id="+id1, "")
	must.EqOp(t, http.StatusOK, code, must.Sprint(string(body)))
	must.Eq(t, id1, from)
	must.True(t, bytes.HasPrefix(body, []byte{0x1f, 0x8b}), must.Sprint("a CPU profile in pprof's format"))

	code, body, from = profileGet(t, a2, "/v1/agent/pprof/heap?server_id=leader", "")
	must.EqOp(t, http.StatusOK, code, must.Sprint(string(body)))
	must.Eq(t, agents[leader].Server().ID(), from)

	code, body, from = profileGet(t, a0, "/v1/metrics?server_id="+id1, "")
	must.EqOp(t, http.StatusOK, code, must.Sprint(string(body)))
	must.Eq(t, id1, from)
	var summary map[string]any
	must.NoError(t, json.Unmarshal(body, &summary))
	must.MapContainsKey(t, summary, "Gauges")

	// Refusals name the problem and take nothing.
	for _, tc := range []struct {
		agent *Agent
		path  string
		want  int
		says  string
	}{
		{a0, "/v1/agent/pprof/goroutine?server_id=" + id2, http.StatusForbidden, "enable_debug"},
		{a2, "/v1/agent/pprof/goroutine", http.StatusForbidden, "enable_debug"},
		{a0, "/v1/metrics?server_id=" + id2, http.StatusForbidden, "enable_debug"},
		{a0, "/v1/agent/pprof/goroutine?server_id=no-such-server", http.StatusNotFound, "no-such-server"},
		{a0, "/v1/agent/pprof/cmdline", http.StatusBadRequest, `unknown profile "cmdline"`},
		{a0, "/v1/agent/pprof/profile?seconds=abc", http.StatusBadRequest, "seconds"},
		{a0, "/v1/agent/pprof/profile?seconds=-3", http.StatusBadRequest, "seconds"},
		{a0, "/v1/agent/pprof/trace?seconds=301", http.StatusBadRequest, "seconds = 301"},
		{a0, "/v1/agent/pprof/heap?debug=2", http.StatusBadRequest, "goroutine only"},
		{a0, "/v1/agent/pprof/heap?gc=maybe", http.StatusBadRequest, "gc"},
		{a0, "/v1/metrics?server_id=" + id1 + "&format=prometheus", http.StatusBadRequest, "only json"},
		{a0, "/v1/agent/pprof/", http.StatusBadRequest, `unknown profile ""`},
		{a0, "/v1/agent/pprof/heap/extra", http.StatusNotFound, ""},
	} {
		code, body, _ := profileGet(t, tc.agent, tc.path, "")
		must.EqOp(t, tc.want, code, must.Sprintf("%s: %s", tc.path, body))
		must.StrContains(t, string(body), tc.says, must.Sprint(tc.path))
	}
}

// With ACLs on, a profile asks for agent:write, and enable_debug is not
// needed (Nomad's rule).
func TestHTTP_AgentPprofACL(t *testing.T) {
	a, mgmt := newACLAgentWith(t, nil)
	reader := aclHTTPToken(t, a, mgmt, "agent-read", `agent { policy = "read" }`)
	writer := aclHTTPToken(t, a, mgmt, "agent-write", `agent { policy = "write" }`)
	self := a.Server().ID()
	for _, path := range []string{"/v1/agent/pprof/heap?debug=1", "/v1/agent/pprof/heap?debug=1&server_id=" + self, "/v1/metrics?server_id=" + self} {
		for _, tc := range []struct {
			name, token string
			want        int
		}{
			{"anonymous", "", http.StatusForbidden},
			{"agent:read", reader, http.StatusForbidden},
			{"agent:write", writer, http.StatusOK},
			{"management", mgmt, http.StatusOK},
		} {
			code, body, _ := profileGet(t, a, path, tc.token)
			must.EqOp(t, tc.want, code, must.Sprintf("%s %s: %s", path, tc.name, body))
		}
	}
}

// waitForMembers waits until a knows n servers alive.
func waitForMembers(t *testing.T, a *Agent, n int) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		code, body := aclDo(t, a, http.MethodGet, "/v1/agent/members", "", nil)
		if code != http.StatusOK {
			return fmt.Errorf("members: %d %s", code, body)
		}
		var m serverMembers
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			return err
		}
		alive := 0
		for _, mem := range m.Members {
			if mem.Status == "alive" {
				alive++
			}
		}
		if alive != n {
			return fmt.Errorf("%d servers alive, want %d", alive, n)
		}
		return nil
	}), wait.Timeout(20*time.Second), wait.Gap(50*time.Millisecond)))
}
