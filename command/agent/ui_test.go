package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// TestUI_Routing checks what /ui/ serves and what it refuses: pages and
// their content alone, the embedded assets and nothing beside them, only
// GET and HEAD, IDs the API would refuse.
func TestUI_Routing(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	waitForLeader(t, a)

	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, p := range []string{"/", "/ui", "/ui/"} {
		resp, err := noRedirect.Get("http://" + a.HTTPAddr() + p)
		must.NoError(t, err)
		resp.Body.Close()
		must.EqOp(t, http.StatusFound, resp.StatusCode, must.Sprintf("GET %s", p))
		must.EqOp(t, "/ui/cluster", resp.Header.Get("Location"))
	}

	for _, p := range []string{"/ui/cluster", "/ui/volumes", "/ui/plugins", "/ui/jobs"} {
		res := do(t, a, http.MethodGet, p)
		must.EqOp(t, http.StatusOK, res.code, must.Sprintf("GET %s: %s", p, res.body))
		must.StrHasPrefix(t, "text/html", res.header.Get("Content-Type"))
		must.StrContains(t, res.header.Get("Content-Security-Policy"), "default-src 'self'")
		body := string(res.body)
		must.StrContains(t, body, `<main id="content"`)
		must.StrContains(t, body, `aria-current="page"`)
		must.StrContains(t, body, `<span>API:</span> <a href="/v1/`)
		// Nothing is fetched from anywhere but the agent.
		must.StrNotContains(t, body, "http://")
		must.StrNotContains(t, body, "https://")

		res = do(t, a, http.MethodGet, p+"?fragment=1")
		must.EqOp(t, http.StatusOK, res.code)
		must.StrNotContains(t, string(res.body), "<html")
	}
	res := do(t, a, http.MethodGet, "/ui/volumes?fragment=1")
	must.StrContains(t, string(res.body), "No volumes yet")

	for _, asset := range []string{"app.js", "style.css"} {
		res := do(t, a, http.MethodGet, "/ui/assets/"+asset)
		must.EqOp(t, http.StatusOK, res.code)
		must.Positive(t, len(res.body))
		must.StrNotContains(t, string(res.body), "http://")
	}

	cases := []struct {
		method, path string
		code         int
	}{
		{http.MethodPost, "/ui/volumes", http.StatusMethodNotAllowed},
		{http.MethodDelete, "/", http.StatusMethodNotAllowed},
		{http.MethodGet, "/ui/nope", http.StatusNotFound},
		{http.MethodGet, "/ui/volumes/extra", http.StatusNotFound},
		{http.MethodGet, "/ui/volume/", http.StatusBadRequest},
		{http.MethodGet, "/ui/volume/no-such-volume", http.StatusNotFound},
		{http.MethodGet, "/ui/volume/%2e%2e", http.StatusBadRequest},
		{http.MethodGet, "/ui/volume/a%2Fb", http.StatusBadRequest},
		{http.MethodGet, "/ui/volumes?page=0", http.StatusBadRequest},
		{http.MethodGet, "/ui/volumes?page=-1", http.StatusBadRequest},
		{http.MethodGet, "/ui/volumes?page=abc", http.StatusBadRequest},
		{http.MethodGet, "/ui/volumes?page=99999999999", http.StatusBadRequest},
		{http.MethodGet, "/ui/volumes?page=7", http.StatusOK},
		{http.MethodGet, "/ui/job/no-such-job", http.StatusNotFound},
		{http.MethodGet, "/ui/job/%2e%2e", http.StatusBadRequest},
		{http.MethodGet, "/ui/alloc/no-such-alloc", http.StatusNotFound},
		{http.MethodGet, "/ui/alloc/%2e%2e", http.StatusBadRequest},
		{http.MethodGet, "/ui/jobs/x", http.StatusNotFound},
		{http.MethodGet, "/ui/assets/", http.StatusNotFound},
		{http.MethodGet, "/ui/assets/../ui.go", http.StatusNotFound},
		{http.MethodGet, "/ui/assets/..%2fui.go", http.StatusNotFound},
		{http.MethodGet, "/ui/assets/%2e%2e", http.StatusNotFound},
		{http.MethodGet, "/ui/assets/nope.js", http.StatusNotFound},
		{http.MethodGet, "/ui/" + strings.Repeat("a", maxUIPathLen), http.StatusBadRequest},
	}
	for _, c := range cases {
		res := do(t, a, c.method, c.path)
		must.EqOp(t, c.code, res.code, must.Sprintf("%s %s: %s", c.method, c.path, res.body))
	}
	// An unknown volume renders as the page with its error, not a blank.
	res = do(t, a, http.MethodGet, "/ui/volume/no-such-volume")
	must.StrContains(t, string(res.body), `role="alert"`)
}

// TestUI_TokenRequired checks that a refusal renders the "token required"
// state the script and the operator can act on, and other errors as
// themselves.
func TestUI_TokenRequired(t *testing.T) {
	t.Parallel()
	code, body := uiErrorBody(fmt.Errorf("list volumes: %w", structs.ErrPermissionDenied))
	must.EqOp(t, http.StatusForbidden, code)
	must.StrContains(t, string(body), `id="token-required"`)
	must.StrContains(t, string(body), "Token required")

	code, body = uiErrorBody(errors.New("boom <script>"))
	must.EqOp(t, http.StatusInternalServerError, code)
	must.StrNotContains(t, string(body), "token-required")
	must.StrNotContains(t, string(body), "<script>")
}

func TestUI_HumanBytes(t *testing.T) {
	t.Parallel()
	for in, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 10 << 30: "10.0 GiB"} {
		must.EqOp(t, want, humanBytes(in))
	}
}

// TestUI_LanesAPI checks the lanes route a plugin page reads: the leader
// answers, with an empty list before any controller call.
func TestUI_LanesAPI(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	waitForLeader(t, a)
	var lanes []*structs.CSILaneStats
	res := get(t, a, csiLanesPath, &lanes)
	requireReadHeaders(t, res.header)
	must.SliceEmpty(t, lanes)
	res = do(t, a, http.MethodDelete, csiLanesPath)
	must.EqOp(t, http.StatusMethodNotAllowed, res.code)

	res = do(t, a, http.MethodGet, "/ui/plugins?fragment=1")
	must.EqOp(t, http.StatusOK, res.code)
	must.StrContains(t, string(res.body), `id="no-lanes"`)
}

func TestUI_LaneChart(t *testing.T) {
	t.Parallel()
	must.EqOp(t, "no calls yet", string(laneChart(&structs.CSILaneStats{})))
	out := string(laneChart(&structs.CSILaneStats{Recent: []structs.CSILaneCall{
		{Op: "publish", Duration: 400 * time.Millisecond},
		{Op: "<unpublish>", Duration: 2 * time.Second, TimedOut: true},
	}}))
	must.StrContains(t, out, `aria-label="2 recent calls, longest 2000 ms"`)
	must.StrContains(t, out, "publish: 400 ms")
	must.StrContains(t, out, "&lt;unpublish&gt;: 2000 ms (timeout)")
	must.StrNotContains(t, out, "<unpublish>")
}

// TestUI_NodePage checks the node page renders the node, its drivers and
// the drain form, and refuses IDs the API would.
func TestUI_NodePage(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	waitForLeader(t, a)
	var nodes []*structs.NodeListStub
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		res := do(t, a, http.MethodGet, "/v1/nodes")
		if err := json.Unmarshal(res.body, &nodes); err != nil {
			return err
		}
		if len(nodes) != 1 {
			return fmt.Errorf("%d nodes", len(nodes))
		}
		return nil
	}), wait.Timeout(20*time.Second), wait.Gap(50*time.Millisecond)))

	res := do(t, a, http.MethodGet, "/ui/node/"+nodes[0].ID)
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("%s", res.body))
	body := string(res.body)
	must.StrContains(t, body, `id="drain-form"`)
	must.StrContains(t, body, `data-action="start"`)
	must.StrContains(t, body, "raw_exec")
	must.StrContains(t, body, `href="/v1/node/`+nodes[0].ID+`/allocations"`)

	res = do(t, a, http.MethodGet, "/ui/node/no-such-node")
	must.EqOp(t, http.StatusNotFound, res.code)
	res = do(t, a, http.MethodGet, "/ui/node/%2e%2e")
	must.EqOp(t, http.StatusBadRequest, res.code)
}

func TestUI_LaneKey(t *testing.T) {
	for k, want := range map[structs.CSILaneKey]string{
		{Op: "publish", Volume: "db[0]", Node: "9f86d081-884c-7d65"}: "publish db[0]@9f86d081",
		{Op: "delete", Volume: "db"}:                                 "delete db",
		{Op: "snapshot-delete", Volume: "snapshot:snap-1"}:           "snapshot-delete snapshot:snap-1",
		{Op: "publish", Node: "n1"}:                                  "publish@n1",
	} {
		must.EqOp(t, want, laneKey(k))
	}
}
