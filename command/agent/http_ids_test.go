package agent

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// Hostile IDs over HTTP: in the URL path (escaped, as clients send IDs)
// or in the body, each is a 400 that names the kind and quotes the ID,
// and nothing is written.
func TestHTTP_HostileIDsAre400(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	registerCSINode(t, a)
	before, err := a.server.State().LatestIndex()
	must.NoError(t, err)

	hostile := []struct {
		name, id, want string
	}{
		{"ten dot-dots", strings.Repeat("../", 10) + "victim", `"../../../../../../../../../../victim" must start with a letter or a digit`},
		{"slash", "a/b", `"a/b" holds '/' at byte 1`},
		{"NUL", "vol\x00x", `"vol\x00x" holds a NUL at byte 3`},
		{"too long", strings.Repeat("v", 129), fmt.Sprintf("%q is 129 bytes; at most 128 bytes are allowed", strings.Repeat("v", 129))},
		{"dot dot", "..", `".." must start with a letter or a digit`},
	}
	for _, tc := range hostile {
		esc := url.PathEscape(tc.id)
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range []struct {
				method, path, kind string
				body               []byte
			}{
				{http.MethodPut, "/v1/volume/csi/" + esc, "volume ID", []byte(`{"Volumes": [{"ExternalID": "e", "PluginID": "hostpath",
					"RequestedCapabilities": [{"AccessMode": "single-node-writer", "AttachmentMode": "file-system"}]}]}`)},
				{http.MethodPut, "/v1/volume/csi/" + esc + "/create", "volume ID", []byte(`{"Volumes": [{"PluginID": "hostpath",
					"RequestedCapabilities": [{"AccessMode": "single-node-writer", "AttachmentMode": "file-system"}]}]}`)},
				{http.MethodDelete, "/v1/volume/csi/" + esc + "/delete", "volume ID", nil},
				{http.MethodDelete, "/v1/volume/csi/" + esc + "/detach?node=n1", "volume ID", nil},
				{http.MethodDelete, "/v1/volume/csi/" + esc, "volume ID", nil},
				{http.MethodGet, "/v1/volume/csi/" + esc, "volume ID", nil},
				{http.MethodGet, "/v1/plugin/csi/" + esc, "plugin ID", nil},
				{http.MethodPut, "/v1/job/" + esc, "job ID", batchJobJSON("j")},
				{http.MethodGet, "/v1/job/" + esc + "/allocations", "job ID", nil},
				{http.MethodGet, "/v1/node/" + esc, "node ID", nil},
				{http.MethodGet, "/v1/allocation/" + esc, "allocation ID", nil},
				{http.MethodGet, "/v1/client/fs/logs/" + esc + "?task=t&type=stdout", "allocation ID", nil},
			} {
				res := send(t, a, r.method, r.path, r.body)
				must.EqOp(t, http.StatusBadRequest, res.code, must.Sprint(r.method+" "+r.path+": "+string(res.body)))
				must.StrContains(t, string(res.body), r.kind+" ", must.Sprint(r.method+" "+r.path))
				must.StrContains(t, string(res.body), tc.want, must.Sprint(r.method+" "+r.path))
			}

			// IDs in the body reach the same check at the servers.
			vol := func(id string) map[string]any {
				return map[string]any{"ID": id, "ExternalID": "e-" + fmt.Sprint(len(id)), "PluginID": "hostpath",
					"RequestedCapabilities": []any{map[string]any{"AccessMode": "single-node-writer", "AttachmentMode": "file-system"}}}
			}
			body, err := json.Marshal(map[string]any{"Volumes": []any{vol("good"), vol(tc.id)}})
			must.NoError(t, err)
			res := send(t, a, http.MethodPut, "/v1/volume/csi/good", body)
			must.EqOp(t, http.StatusBadRequest, res.code, must.Sprint(string(res.body)))
			must.StrContains(t, string(res.body), "volume ID "+tc.want)

			var job map[string]any
			must.NoError(t, json.Unmarshal(batchJobJSON("j"), &job))
			job["Job"].(map[string]any)["ID"] = tc.id
			body, err = json.Marshal(job)
			must.NoError(t, err)
			res = send(t, a, http.MethodPut, "/v1/jobs", body)
			must.EqOp(t, http.StatusBadRequest, res.code, must.Sprint(string(res.body)))
			must.StrContains(t, string(res.body), "job ID "+tc.want)
		})
	}
	after, err := a.server.State().LatestIndex()
	must.NoError(t, err)
	must.Eq(t, before, after, must.Sprint("a refused request wrote to Raft"))

	// Valid IDs still route as before: unknown ones are 404.
	must.EqOp(t, http.StatusNotFound, do(t, a, http.MethodGet, "/v1/volume/csi/"+url.PathEscape("data[2]")).code)
}
