package command

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
	"github.com/roamhq/roam/command/agent"
	"github.com/roamhq/roam/testutil"
)

// newACLTestAgent starts a dev agent with ACLs on, waits until it leads,
// and returns its HTTP address.
func newACLTestAgent(t *testing.T) string {
	t.Helper()
	a := startAgent(t, func(c *agent.Config) { c.ACL = &agent.ACLConfig{Enabled: true} })
	testutil.WaitForLeader(t, a.Server())
	return "http://" + a.HTTPAddr()
}

// field returns the value of "Key = value" in out.
func field(out, key string) string {
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(l, "=")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func TestCLI_ACL(t *testing.T) {
	addr := newACLTestAgent(t)
	t.Setenv(api.AddressEnv, addr)
	t.Setenv(api.TokenEnv, "")

	code, out, errOut := run("acl", "bootstrap")
	must.EqOp(t, 0, code, must.Sprint(errOut))
	mgmt := field(out, "Secret ID")
	mgmtAccessor := field(out, "Accessor ID")
	must.NotEq(t, "", mgmt)
	must.Eq(t, "management", field(out, "Type"))

	code, _, errOut = run("acl", "bootstrap")
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "acl bootstrap already done (reset index: ")

	// Without a token, nothing.
	code, _, errOut = run("acl", "policy", "list")
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "403")
	must.StrContains(t, errOut, "Permission denied")

	t.Setenv(api.TokenEnv, mgmt)
	file := filepath.Join(t.TempDir(), "p.hcl")
	must.NoError(t, os.WriteFile(file, []byte(`namespace "default" { capabilities = ["list-jobs"] }`), 0o600))
	code, out, errOut = run("acl", "policy", "apply", "-description", "lists jobs", "lister", file)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.StrContains(t, out, `Successfully wrote "lister"`)

	bad := filepath.Join(t.TempDir(), "bad.hcl")
	must.NoError(t, os.WriteFile(bad, []byte(`namespace "default" { capabilities = ["fly"] }`), 0o600))
	code, _, errOut = run("acl", "policy", "apply", "bad", bad)
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, `unknown capability "fly"`)

	code, out, _ = run("acl", "policy", "list")
	must.EqOp(t, 0, code)
	must.StrContains(t, out, "lister")
	must.StrContains(t, out, "lists jobs")
	code, out, _ = run("acl", "policy", "info", "lister")
	must.EqOp(t, 0, code)
	must.StrContains(t, out, `capabilities = ["list-jobs"]`)

	code, out, errOut = run("acl", "token", "create", "-name", "ci", "-policy", "lister")
	must.EqOp(t, 0, code, must.Sprint(errOut))
	secret, accessor := field(out, "Secret ID"), field(out, "Accessor ID")
	must.NotEq(t, "", secret)

	code, out, _ = run("acl", "token", "list")
	must.EqOp(t, 0, code)
	must.StrContains(t, out, accessor)
	must.StrContains(t, out, mgmtAccessor)
	must.StrNotContains(t, out, secret)
	must.StrNotContains(t, out, mgmt)

	code, out, _ = run("acl", "token", "info", accessor)
	must.EqOp(t, 0, code)
	must.Eq(t, "ci", field(out, "Name"))

	code, out, _ = run("acl", "token", "update", "-name", "ci2", accessor)
	must.EqOp(t, 0, code)
	must.Eq(t, "ci2", field(out, "Name"))
	must.Eq(t, "lister", field(out, "Policies"))

	// The new token, from -token: it can list jobs, and read itself.
	code, _, errOut = run("job", "status", "-token", secret)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	code, out, errOut = run("acl", "token", "self", "-token", secret)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.Eq(t, accessor, field(out, "Accessor ID"))
	code, _, errOut = run("acl", "policy", "list", "-token", secret)
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "Permission denied")

	code, _, errOut = run("acl", "token", "delete", accessor)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	code, _, errOut = run("acl", "token", "self", "-token", secret)
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "acl token not found")
	must.StrNotContains(t, errOut, secret)

	code, _, errOut = run("acl", "policy", "delete", "lister")
	must.EqOp(t, 0, code, must.Sprint(errOut))
	code, _, _ = run("acl", "policy", "info", "lister")
	must.EqOp(t, 1, code)
}
