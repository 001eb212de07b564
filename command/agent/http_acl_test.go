package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// newACLAgent starts a dev agent with ACLs on and bootstraps it over
// HTTP, returning the management secret.
func newACLAgent(t *testing.T) (*Agent, string) {
	t.Helper()
	return newACLAgentWith(t, nil)
}

// newACLAgentWith is newACLAgent with more config.
func newACLAgentWith(t *testing.T, fn func(*Config)) (*Agent, string) {
	t.Helper()
	a := newTestAgent(t, func(c *Config) {
		c.ACL = &ACLConfig{Enabled: true}
		if fn != nil {
			fn(c)
		}
	})
	waitForLeader(t, a)
	code, body := aclDo(t, a, http.MethodPut, "/v1/acl/bootstrap", "", nil)
	must.Eq(t, http.StatusOK, code, must.Sprint(body))
	var tok structs.ACLToken
	must.NoError(t, json.Unmarshal([]byte(body), &tok))
	must.Eq(t, structs.ACLManagementToken, tok.Type)
	must.NotEq(t, "", tok.SecretID)
	return a, tok.SecretID
}

func aclDo(t *testing.T, a *Agent, method, path, token string, body any) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		buf, err := json.Marshal(body)
		must.NoError(t, err)
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, "http://"+a.HTTPAddr()+path, rd)
	must.NoError(t, err)
	if token != "" {
		req.Header.Set("X-Nomad-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	return resp.StatusCode, string(out)
}

// aclHTTPToken makes a policy and a client token holding it, over HTTP.
func aclHTTPToken(t *testing.T, a *Agent, mgmt, name, rules string) string {
	t.Helper()
	code, body := aclDo(t, a, http.MethodPut, "/v1/acl/policy/"+name, mgmt, map[string]string{"Name": name, "Rules": rules})
	must.Eq(t, http.StatusOK, code, must.Sprint(body))
	code, body = aclDo(t, a, http.MethodPut, "/v1/acl/token", mgmt, map[string]any{"Name": name, "Type": "client", "Policies": []string{name}})
	must.Eq(t, http.StatusOK, code, must.Sprint(body))
	var tok structs.ACLToken
	must.NoError(t, json.Unmarshal([]byte(body), &tok))
	return tok.SecretID
}

func ns(caps ...string) string {
	return `namespace "default" { capabilities = ["` + strings.Join(caps, `","`) + `"] }`
}

// httpACLCase is one route's row: rules that allow it and near-miss rules
// that must not; grant "management" means a management token only.
type httpACLCase struct {
	grant, near string
	exempt      string
}

var (
	nodeRead   = httpACLCase{grant: `node { policy = "read" }`, near: `agent { policy = "write" }`}
	nodeWrite  = httpACLCase{grant: `node { policy = "write" }`, near: `node { policy = "read" }`}
	mgmtOnly   = httpACLCase{grant: "management", near: `operator { policy = "write" }` + "\n" + `namespace "*" { policy = "write" }`}
	readJob    = httpACLCase{grant: ns("read-job"), near: ns("list-jobs")}
	submitJob  = httpACLCase{grant: ns("submit-job"), near: `namespace "default" { policy = "read" }`}
	writeVol   = httpACLCase{grant: ns("csi-write-volume"), near: ns("csi-mount-volume", "submit-job", "csi-read-volume")}
	listVol    = httpACLCase{grant: ns("csi-list-volume"), near: ns("csi-read-volume")}
	openRoute  = httpACLCase{exempt: "open"}
	operWrite  = httpACLCase{grant: `operator { policy = "write" }`, near: `operator { policy = "read" }`}
	httpCaseOf = map[string]httpACLCase{
		"GET /v1/status/leader": openRoute,
		"GET /v1/status/peers":  openRoute,
		"GET /v1/metrics":       openRoute,
		"GET /v1/agent/self":    {grant: `agent { policy = "read" }`, near: `node { policy = "write" }`},
		"GET /debug/pprof/":     {grant: `agent { policy = "write" }`, near: `agent { policy = "read" }`},
		"GET /v1/agent/pprof/":  {grant: `agent { policy = "write" }`, near: `agent { policy = "read" }`},
		"POST /debug/pprof/":    {grant: `agent { policy = "write" }`, near: `agent { policy = "read" }`},
		"GET /v1/agent/members": nodeRead,

		"GET /v1/nodes":                              nodeRead,
		"GET /v1/node/":                              nodeRead,
		"GET /v1/node/*/allocations":                 nodeRead,
		"PUT /v1/node/*/drain":                       nodeWrite,
		"POST /v1/node/*/drain":                      nodeWrite,
		"PUT /v1/node/*/eligibility":                 nodeWrite,
		"POST /v1/node/*/eligibility":                nodeWrite,
		"GET /v1/operator/raft/configuration":        {grant: `operator { policy = "read" }`, near: `agent { policy = "write" }`},
		"DELETE /v1/operator/raft/peer":              operWrite,
		"PUT /v1/operator/raft/transfer-leadership":  operWrite,
		"POST /v1/operator/raft/transfer-leadership": operWrite,
		"GET /v1/operator/snapshot":                  mgmtOnly,
		"PUT /v1/operator/snapshot":                  mgmtOnly,

		"GET /v1/jobs":                      {grant: ns("list-jobs"), near: ns("read-logs")},
		"PUT /v1/jobs":                      submitJob,
		"POST /v1/jobs":                     submitJob,
		"PUT /v1/jobs/parse":                submitJob,
		"POST /v1/jobs/parse":               submitJob,
		"GET /v1/job/":                      readJob,
		"PUT /v1/job/":                      submitJob,
		"POST /v1/job/":                     submitJob,
		"DELETE /v1/job/":                   submitJob,
		"GET /v1/job/*/allocations":         readJob,
		"GET /v1/job/*/evaluations":         readJob,
		"GET /v1/allocations":               readJob,
		"GET /v1/allocation/":               readJob,
		"GET /v1/evaluations":               readJob,
		"GET /v1/evaluation/":               readJob,
		"GET /v1/client/fs/logs/":           {grant: ns("read-logs"), near: ns("read-job", "alloc-lifecycle")},
		"GET /v1/client/fs/ls/":             {grant: ns("read-fs"), near: ns("read-job", "read-logs")},
		"GET /v1/client/fs/stat/":           {grant: ns("read-fs"), near: ns("read-job", "read-logs")},
		"GET /v1/client/fs/cat/":            {grant: ns("read-fs"), near: ns("read-job", "read-logs")},
		"GET /v1/client/allocation/*/stats": {grant: ns("read-job"), near: ns("read-logs", "read-fs")},

		"GET /v1/volumes":                listVol,
		"GET /v1/volume/csi/":            {grant: ns("csi-read-volume"), near: ns("csi-list-volume")},
		"PUT /v1/volume/csi/":            writeVol,
		"POST /v1/volume/csi/":           writeVol,
		"DELETE /v1/volume/csi/":         writeVol,
		"PUT /v1/volume/csi/*/create":    writeVol,
		"POST /v1/volume/csi/*/create":   writeVol,
		"DELETE /v1/volume/csi/*/delete": writeVol,
		"PUT /v1/volume/csi/*/detach":    writeVol,
		"DELETE /v1/volume/csi/*/detach": writeVol,
		"PUT /v1/volumes/snapshot":       writeVol,
		"POST /v1/volumes/snapshot":      writeVol,
		"DELETE /v1/volumes/snapshot":    writeVol,
		"GET /v1/volumes/snapshot":       listVol,
		"GET /v1/volumes/external":       listVol,
		"PUT /v1/volume/csi/*/expand":    writeVol,
		"POST /v1/volume/csi/*/expand":   writeVol,
		"GET /v1/event/stream": {
			grant: ns("read-job", "csi-read-volume") + "\n" + `node { policy = "read" }` + "\n" + `plugin { policy = "read" }`,
			near:  ns("read-job", "csi-read-volume") + "\n" + `node { policy = "read" }`,
		},
		"GET /v1/plugins/csi/lanes": {grant: `plugin { policy = "read" }`, near: `plugin { policy = "list" }`},
		"GET /v1/status/leadership": {grant: `operator { policy = "read" }`, near: `agent { policy = "write" }`},
		"GET /v1/plugins":           {grant: `plugin { policy = "list" }`, near: `namespace "default" { policy = "write" }`},
		"GET /v1/plugin/csi/":       {grant: `plugin { policy = "read" }`, near: `plugin { policy = "list" }`},

		"PUT /v1/acl/bootstrap":  {exempt: "bootstrap"},
		"POST /v1/acl/bootstrap": {exempt: "bootstrap"},
		"GET /v1/acl/policies":   mgmtOnly,
		"GET /v1/acl/policy/":    mgmtOnly,
		"PUT /v1/acl/policy/":    mgmtOnly,
		"POST /v1/acl/policy/":   mgmtOnly,
		"DELETE /v1/acl/policy/": mgmtOnly,
		"GET /v1/acl/tokens":     mgmtOnly,
		"PUT /v1/acl/token":      mgmtOnly,
		"POST /v1/acl/token":     mgmtOnly,
		"GET /v1/acl/token/":     mgmtOnly,
		"PUT /v1/acl/token/":     mgmtOnly,
		"POST /v1/acl/token/":    mgmtOnly,
		"DELETE /v1/acl/token/":  mgmtOnly,
	}
)

// wireUnsafe are the routes whose handler, given a junk request with a
// token that may call it, could still change the cluster under the test:
// they are checked with authorizeHTTP only.
var wireUnsafe = map[string]bool{
	"PUT /v1/operator/raft/transfer-leadership":  true,
	"POST /v1/operator/raft/transfer-leadership": true,
	"PUT /v1/operator/snapshot":                  true,
	"DELETE /v1/operator/raft/peer":              true,
}

// wireStreaming are the routes whose allowed answer never ends (the event
// stream reads the server's own broker, with no RPC behind it to check):
// their granted request is checked with authorizeHTTP only.
var wireStreaming = map[string]bool{
	"GET /v1/event/stream": true,
}

// routePath makes a concrete path for a route key: an ID route gets an
// ID, a sub-resource route an ID and its segment.
func routePath(route string) string {
	if prefix, sub, ok := strings.Cut(route, "*/"); ok {
		return prefix + "x1/" + sub
	}
	if strings.HasSuffix(route, "/") {
		return route + "x1"
	}
	return route
}

// TestHTTPACL_RouteTable checks every registered route and method: a
// token with what it needs passes the check, a near-miss token and the
// anonymous token get 403 "Permission denied" on the wire, and an unknown
// secret gets 403. A route without a row fails the test.
func TestHTTPACL_RouteTable(t *testing.T) {
	a, mgmt := newACLAgent(t)
	var keys []string
	for route, methods := range a.http.routes {
		for m := range methods {
			keys = append(keys, httpRouteKey(m, route))
		}
	}
	sort.Strings(keys)
	must.SliceNotEmpty(t, keys)
	for i, key := range keys {
		tc, ok := httpCaseOf[key]
		if !ok {
			t.Errorf("route %s has no row in httpCaseOf: say what it needs", key)
			continue
		}
		rule, ok := httpACLRules[key]
		if !ok {
			t.Errorf("route %s has no rule in httpACLRules", key)
			continue
		}
		method, route, _ := strings.Cut(key, " ")
		path := routePath(route)
		t.Run(key, func(t *testing.T) {
			check := func(secret string) error {
				req := httptest.NewRequest(method, path, nil)
				if secret != "" {
					req.Header.Set("X-Nomad-Token", secret)
				}
				return a.http.authorizeHTTP(req, route)
			}
			if tc.exempt != "" {
				must.Eq(t, tc.exempt, rule.exempt)
				must.NoError(t, check(""))
				return
			}
			must.Eq(t, "", rule.exempt)
			must.NoError(t, check(mgmt))
			granted := mgmt
			if tc.grant != "management" {
				granted = aclHTTPToken(t, a, mgmt, "grant-"+strconv.Itoa(i), tc.grant)
				must.NoError(t, check(granted))
			}
			// On the wire too: the RPCs behind the route must not refuse
			// what the route allowed. The request is junk (an unknown ID,
			// no body), so the answer may be any refusal but 403.
			if !wireUnsafe[key] && !wireStreaming[key] {
				code, body := aclDo(t, a, method, path, granted, nil)
				must.NotEq(t, http.StatusForbidden, code, must.Sprintf("granted: %s", body))
			}
			near := aclHTTPToken(t, a, mgmt, "near-"+strconv.Itoa(i), tc.near)
			for name, secret := range map[string]string{"near miss": near, "anonymous": ""} {
				err := check(secret)
				must.True(t, errors.Is(err, structs.ErrPermissionDenied), must.Sprintf("%s: %v", name, err))
				code, body := aclDo(t, a, method, path, secret, nil)
				must.Eq(t, http.StatusForbidden, code, must.Sprintf("%s: %s", name, body))
				must.Eq(t, "Permission denied\n", body, must.Sprint(name))
			}
			code, body := aclDo(t, a, method, path, "0b8c1d2e-0000-4000-8000-000000000000", nil)
			must.Eq(t, http.StatusForbidden, code, must.Sprint(body))
		})
	}
	for key := range httpACLRules {
		method, route, _ := strings.Cut(key, " ")
		_, registered := a.http.routes[route][method]
		must.True(t, registered, must.Sprintf("httpACLRules names %s, which is not a route", key))
	}
}
