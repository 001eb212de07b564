package agent

import (
	"net/http"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// A dev agent runs no CSI plugin, so these cover routing, input checks and
// the server's refusals; the round trips against a real plugin are in
// nomad/csi_volume_controller_test.go.
func TestHTTP_CSICreateErrors(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	cases := []struct {
		name, method, path, body string
		code                     int
		contains                 string
	}{
		{"create unknown plugin", http.MethodPut, "/v1/volume/csi/vol1/create", testVolumeBody, http.StatusBadRequest, `unknown plugin "hostpath"`},
		{"create bad json", http.MethodPut, "/v1/volume/csi/vol1/create", `{`, http.StatusBadRequest, "decode"},
		{"create no volumes", http.MethodPost, "/v1/volume/csi/vol1/create", `{}`, http.StatusBadRequest, "Volumes"},
		{"create id mismatch", http.MethodPut, "/v1/volume/csi/vol1/create", `{"Volumes": [{"ID": "other"}]}`, http.StatusBadRequest, "does not match"},
		{"create wrong method", http.MethodGet, "/v1/volume/csi/vol1/create", "", http.StatusMethodNotAllowed, ""},
		{"delete unknown", http.MethodDelete, "/v1/volume/csi/nope/delete", "", http.StatusNotFound, "nope"},
		{"detach without node", http.MethodDelete, "/v1/volume/csi/nope/detach", "", http.StatusBadRequest, "node"},
		{"detach unknown", http.MethodPut, "/v1/volume/csi/nope/detach?node=n1", "", http.StatusNotFound, "nope"},
		{"snapshot list without plugin", http.MethodGet, "/v1/volumes/snapshot", "", http.StatusBadRequest, "plugin_id"},
		{"snapshot list unknown plugin", http.MethodGet, "/v1/volumes/snapshot?plugin_id=hostpath", "", http.StatusBadRequest, `unknown plugin "hostpath"`},
		{"snapshot list bad per_page", http.MethodGet, "/v1/volumes/snapshot?plugin_id=hostpath&per_page=x", "", http.StatusBadRequest, "per_page"},
		{"snapshot delete missing id", http.MethodDelete, "/v1/volumes/snapshot?plugin_id=hostpath", "", http.StatusBadRequest, "snapshot_id"},
		{"snapshot delete unknown plugin", http.MethodDelete, "/v1/volumes/snapshot?plugin_id=hostpath&snapshot_id=s", "", http.StatusBadRequest, `unknown plugin "hostpath"`},
		{"snapshot create unknown volume", http.MethodPut, "/v1/volumes/snapshot", `{"Snapshots": [{"SourceVolumeID": "nope"}]}`, http.StatusNotFound, "nope"},
		{"snapshot create none", http.MethodPut, "/v1/volumes/snapshot", `{}`, http.StatusBadRequest, "Snapshots"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var body []byte
			if tc.body != "" {
				body = []byte(tc.body)
			}
			res := send(t, a, tc.method, tc.path, body)
			must.EqOp(t, tc.code, res.code, must.Sprintf("%s %s: %s", tc.method, tc.path, res.body))
			must.StrContains(t, string(res.body), tc.contains)
		})
	}

	// Nothing was created.
	var vols []*structs.CSIVolListStub
	get(t, a, "/v1/volumes?type=csi", &vols)
	must.SliceEmpty(t, vols)

	// A registered volume without claims on a node detaches as a no-op.
	registerCSINode(t, a)
	res := send(t, a, http.MethodPut, "/v1/volume/csi/vol1", []byte(testVolumeBody))
	must.EqOp(t, http.StatusOK, res.code, must.Sprint(string(res.body)))
	res = do(t, a, http.MethodDelete, "/v1/volume/csi/vol1/detach?node=elsewhere")
	must.EqOp(t, http.StatusOK, res.code, must.Sprint(string(res.body)))
}
