package agent

import (
	"net/http"
	"testing"

	"github.com/shoenig/test/must"
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
