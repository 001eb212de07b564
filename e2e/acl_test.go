//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
)

// bootstrapACL bootstraps ACLs through the leader's HTTP API, retrying
// while the cluster settles, and makes the harness's own requests and CLI
// runs carry the management token until the test ends.
func bootstrapACL(t *testing.T, c *Cluster) string {
	t.Helper()
	var tok api.ACLToken
	WaitFor(t, leaderTimeout, func() error {
		return SendJSON(http.MethodPut, c.API(), "/v1/acl/bootstrap", nil, &tok)
	})
	must.NotEq(t, "", tok.SecretID)
	harnessToken.Store(tok.SecretID)
	t.Cleanup(func() { harnessToken.Store("") })
	t.Setenv(api.TokenEnv, tok.SecretID)
	return tok.SecretID
}

// aclRequest sends method base+path with token (empty: anonymous) and
// returns the status and body.
func aclRequest(t *testing.T, method, base, path, token string, body any) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		buf, err := json.Marshal(body)
		must.NoError(t, err)
		rd = strings.NewReader(string(buf))
	}
	req, err := http.NewRequest(method, base+path, rd)
	must.NoError(t, err)
	req.Header["X-Nomad-Token"] = []string{token}
	resp, err := httpClient.Do(req)
	must.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	return resp.StatusCode, string(out)
}

// TestACL_MountWithoutWrite: with ACLs on, a token holding submit-job and
// csi-mount-volume (but not csi-write-volume) runs a job that mounts an
// existing volume and cannot deregister or delete that volume; the
// anonymous token can do nothing until a policy grants it something.
func TestACL_MountWithoutWrite(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 1, Clients: 1, ExternalPlugins: true, ACL: true})
	server, client := cc.API(), cc.ClientHTTP(0)

	// Anonymous: nothing, on the server and on the client agent.
	anonymousDenied := func(base string) {
		t.Helper()
		for _, path := range []string{
			"/v1/jobs", "/v1/nodes", "/v1/volumes?type=csi", "/v1/plugins?type=csi",
			"/v1/plugin/csi/" + csiPluginID, "/v1/allocations", "/v1/agent/self",
			"/v1/operator/raft/configuration", "/v1/acl/tokens", "/v1/operator/snapshot",
		} {
			code, body := aclRequest(t, http.MethodGet, base, path, "", nil)
			must.Eq(t, http.StatusForbidden, code, must.Sprintf("anonymous GET %s: %s", path, body))
			must.Eq(t, "Permission denied\n", body)
		}
	}
	anonymousDenied(server)
	anonymousDenied(client)
	code, _ := aclRequest(t, http.MethodPut, server, "/v1/jobs", "", map[string]any{"Job": map[string]any{"ID": "x"}})
	must.Eq(t, http.StatusForbidden, code)

	// An existing volume, registered by the operator (management token).
	ext := cc.createVolumes(t, "client-0", "acl-vol")
	cc.registerVolumeHTTP(t, "acl-vol", ext[0])

	// A policy with submit-job and csi-mount-volume but not
	// csi-write-volume, and a token holding it.
	policy := filepath.Join(t.TempDir(), "mounter.hcl")
	must.NoError(t, os.WriteFile(policy, []byte(`namespace "default" {
  capabilities = ["submit-job", "csi-mount-volume", "read-job", "list-jobs"]
}
`), 0o600))
	cc.MustCLI("acl", "policy", "apply", "mounter", policy)
	out := cc.MustCLI("acl", "token", "create", "-name", "mounter", "-policy", "mounter", "-json")
	var tok api.ACLToken
	must.NoError(t, json.Unmarshal([]byte(out), &tok))
	must.NotEq(t, "", tok.SecretID)

	// Without csi-mount-volume the same job is refused at submission.
	cc.MustCLI("acl", "policy", "apply", "submitter", writeTemp(t, "submitter.hcl", `namespace "default" { capabilities = ["submit-job"] }`))
	out = cc.MustCLI("acl", "token", "create", "-name", "submitter", "-policy", "submitter", "-json")
	var sub api.ACLToken
	must.NoError(t, json.Unmarshal([]byte(out), &sub))
	job := writeTemp(t, "acl-job.hcl", csiJob("acl-job", "service", 1, "acl-vol", false, "", "echo ok > data/f; sleep 3600"))
	stdout, stderr, rc := cc.RunCLI("job", "run", "-detach", "-token", sub.SecretID, job)
	must.NotEq(t, 0, rc, must.Sprintf("job without csi-mount-volume was accepted: %s", stdout))
	must.StrContains(t, stderr, "Permission denied")

	// With it, the job runs and mounts the volume.
	cc.MustCLI("job", "run", "-detach", "-token", tok.SecretID, job)
	allocs := cc.waitCSIAllocs(t, "acl-job", csiSettle, oneAlloc("running"))
	must.Len(t, 1, allocs)
	// The token reads its job through the client agent too.
	code, body := aclRequest(t, http.MethodGet, client, "/v1/job/acl-job", tok.SecretID, nil)
	must.Eq(t, http.StatusOK, code, must.Sprint(body))

	// It cannot deregister, delete, detach or re-register the volume.
	vol := "/v1/volume/csi/" + url.PathEscape("acl-vol")
	for _, req := range []struct{ method, path string }{
		{http.MethodDelete, vol},
		{http.MethodDelete, vol + "?force=true"},
		{http.MethodDelete, vol + "/delete"},
		{http.MethodDelete, vol + "/detach?node=" + cc.NodeIDs["client-0"]},
	} {
		code, body := aclRequest(t, req.method, server, req.path, tok.SecretID, nil)
		must.Eq(t, http.StatusForbidden, code, must.Sprintf("%s %s: %s", req.method, req.path, body))
	}
	_, stderr, rc = cc.RunCLI("volume", "deregister", "-token", tok.SecretID, "acl-vol")
	must.NotEq(t, 0, rc)
	must.StrContains(t, stderr, "Permission denied")
	_, stderr, rc = cc.RunCLI("volume", "delete", "-token", tok.SecretID, "acl-vol")
	must.NotEq(t, 0, rc)
	must.StrContains(t, stderr, "Permission denied")
	// The volume is still registered and claimed.
	v, err := cc.volume("acl-vol")
	must.NoError(t, err)
	must.NotNil(t, v)
	must.StrContains(t, claimsString(v), "alloc="+allocs[0].ID[:8])

	// The anonymous policy grants the anonymous token what it says, and
	// nothing more.
	cc.MustCLI("acl", "policy", "apply", "anonymous", writeTemp(t, "anonymous.hcl", `namespace "default" { capabilities = ["list-jobs"] }`))
	WaitFor(t, csiSettle, func() error {
		if code, body := aclRequest(t, http.MethodGet, server, "/v1/jobs", "", nil); code != http.StatusOK {
			return fmt.Errorf("anonymous GET /v1/jobs: %d %s", code, body)
		}
		return nil
	})
	code, _ = aclRequest(t, http.MethodGet, server, "/v1/nodes", "", nil)
	must.Eq(t, http.StatusForbidden, code)
	code, _ = aclRequest(t, http.MethodGet, server, vol, "", nil)
	must.Eq(t, http.StatusForbidden, code)
}
