//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// aclSend sends in as JSON with token and decodes the answer into out.
func aclSend(base, method, path, token string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequest(method, base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("X-Nomad-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %d: %s", method, path, resp.StatusCode, raw)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(raw, out)
}

// TestUI_ACL: with ACLs on, the UI without a token shows a clear "token
// required" state; with a read-only token it shows the pages and hides or
// disables the drain button.
func TestUI_ACL(t *testing.T) {
	cfg := writeTemp(t, "acl.hcl", "acl {\n  enabled = true\n}\n")
	p := FreePorts(t, 2)
	a := StartAgent(t, "dev", p[0], p[1], "agent", "-dev", "-config", cfg,
		"-http-port", strconv.Itoa(p[0]), "-rpc-port", strconv.Itoa(p[1]))
	base := a.HTTPAddr()

	var boot struct{ SecretID string }
	WaitFor(t, settle, func() error { return aclSend(base, "POST", "/v1/acl/bootstrap", "", nil, &boot) })
	mgmt := boot.SecretID
	must.NoError(t, aclSend(base, "POST", "/v1/acl/policy/readonly", mgmt, map[string]any{
		"Name": "readonly",
		"Rules": `namespace "default" { policy = "read" }
node { policy = "read" }
plugin { policy = "read" }
operator { policy = "read" }`,
	}, nil))
	var tok struct{ SecretID string }
	must.NoError(t, aclSend(base, "POST", "/v1/acl/token", mgmt, map[string]any{
		"Name": "ui-reader", "Type": "client", "Policies": []string{"readonly"},
	}, &tok))

	b := newBrowser(t)
	b.navigate(base + "/ui/volumes")
	must.NoError(t, b.waitJS(uiWait, `document.getElementById("token-required") !== null &&
		document.getElementById("token-required").textContent.indexOf("Token required") >= 0`))
	b.checkLayout("token required")
	b.screenshot("ui-acl-token-required")

	// Enter the read-only token in the field: it goes to session storage
	// and every request after carries it.
	must.NoError(t, b.waitJS(time.Second, `(function () {
  document.getElementById("token").value = `+strconv.Quote(tok.SecretID)+`;
  document.getElementById("token-form").requestSubmit();
  return true;
})()`))
	must.NoError(t, b.waitJS(uiWait, `document.getElementById("token-required") === null &&
		document.querySelector("p.summary") !== null`))

	var nodes []struct{ ID string }
	must.NoError(t, aclSend(base, "GET", "/v1/nodes", mgmt, nil, &nodes))
	must.Len(t, 1, nodes)
	b.navigate(base + "/ui/node/" + nodes[0].ID)
	must.NoError(t, b.waitJS(uiWait, `document.getElementById("drain-form") !== null`))
	// Read-only: the drain button is hidden or disabled before any click.
	must.NoError(t, b.waitJS(uiWait, `(function () {
  var b = document.getElementById("drain-button");
  return b === null || b.disabled || b.getAttribute("aria-disabled") === "true";
})()`))
	b.screenshot("ui-acl-readonly-node")
}
