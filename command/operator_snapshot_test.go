package command

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func TestCLI_OperatorSnapshot(t *testing.T) {
	t.Parallel()
	a, addr := newTestAgent(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "backup.snap")

	registerFakeNode(t, a, "11111111-1111-1111-1111-111111111111", "kept")
	code, out, errOut := run("operator", "snapshot", "save", "-address", addr, path)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.StrContains(t, out, "State file written to "+path)

	code, out, errOut = run("operator", "snapshot", "inspect", path)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.StrContains(t, out, "Index")
	must.StrContains(t, out, "SHA256")
	var nodesLine string
	for _, l := range lines(out) {
		if strings.HasPrefix(l, "nodes ") {
			nodesLine = l
		}
	}
	must.Eq(t, "nodes 2", nodesLine, must.Sprint(out)) // the dev client and "kept"

	later := "22222222-2222-2222-2222-222222222222"
	registerFakeNode(t, a, later, "later")

	// A truncated copy is refused by inspect and by restore, and the
	// cluster keeps what it has.
	file, err := os.ReadFile(path)
	must.NoError(t, err)
	cut := filepath.Join(dir, "cut.snap")
	must.NoError(t, os.WriteFile(cut, file[:len(file)-100], 0o600))
	code, _, errOut = run("operator", "snapshot", "inspect", cut)
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "snapshot file is truncated")
	code, _, errOut = run("operator", "snapshot", "restore", "-address", addr, cut)
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "snapshot file is truncated")

	// The HTTP route checks again on the server: a corrupt body is a 400.
	bad := append([]byte(nil), file...)
	bad[len(bad)-40] ^= 0xff
	req, err := http.NewRequest(http.MethodPut, addr+"/v1/operator/snapshot", strings.NewReader(string(bad)))
	must.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	resp.Body.Close()
	must.EqOp(t, http.StatusBadRequest, resp.StatusCode)

	var reply structs.SingleNodeResponse
	must.NoError(t, a.RPC("Node.GetNode", &structs.NodeSpecificRequest{NodeID: later}, &reply))
	must.NotNil(t, reply.Node)

	code, out, errOut = run("operator", "snapshot", "restore", "-address", addr, path)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.StrContains(t, out, "Snapshot restored")
	must.NoError(t, a.RPC("Node.GetNode", &structs.NodeSpecificRequest{NodeID: later}, &reply))
	must.Nil(t, reply.Node)

	code, _, errOut = run("operator", "snapshot", "save", "-address", addr)
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "one argument")
}
