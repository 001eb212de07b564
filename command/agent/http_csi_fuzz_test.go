package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
)

// FuzzVolumeRegisterBody decodes volume register and create bodies as
// the HTTP API receives them from `roam volume register/create` and
// Nomad's client. A refusal is a 400 (or 413) naming the problem; an
// accepted body yields volumes, none nil, whose fields are those the
// API client's own types read from the same JSON, when they can read it.
func FuzzVolumeRegisterBody(f *testing.F) {
	for _, vols := range [][]*api.CSIVolume{
		{{ID: "vol1", PluginID: "hostpath", ExternalID: "ext-1",
			RequestedCapabilities: []*api.CSIVolumeCapability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}}},
		{{PluginID: "hostpath", RequestedCapacityMin: 1 << 30, RequestedCapacityMax: 10 << 30,
			MountOptions: &api.CSIMountOptions{FSType: "ext4", MountFlags: []string{"noatime"}},
			Secrets:      map[string]string{"token": "s3cret"}, Parameters: map[string]string{"p": "1"}}},
		{{ID: "a", PluginID: "p"}, {ID: "b", PluginID: "p", AccessMode: "single-node-reader-only", AttachmentMode: "block-device"}},
	} {
		buf, err := json.Marshal(&api.CSIVolumeRegisterRequest{Volumes: vols})
		must.NoError(f, err)
		f.Add(buf)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest(http.MethodPut, csiVolumePathPrefix+"vol1", bytes.NewReader(body))
		vols, err := decodeVolumesBody(r, "register")
		if err != nil {
			var coded *codedError
			must.True(t, errors.As(err, &coded), must.Sprintf("error is not an HTTP error: %v", err))
			must.True(t, coded.code == http.StatusBadRequest || coded.code == http.StatusRequestEntityTooLarge,
				must.Sprintf("refused with %d: %v", coded.code, err))
			must.NotEq(t, "", coded.msg)
			must.Nil(t, vols)
			return
		}
		must.SliceNotEmpty(t, vols)

		var sent api.CSIVolumeRegisterRequest
		if err := json.Unmarshal(body, &sent); err != nil {
			// The server skips the fields it has no use for, of any type
			// (Nomad's client sends several); the API client's types read
			// some of them, so this body has nothing to compare with.
			return
		}
		must.SliceLen(t, len(sent.Volumes), vols)
		for i, v := range vols {
			must.NotNil(t, v)
			in := sent.Volumes[i]
			want := in.ID
			if len(vols) == 1 && want == "" {
				want = "vol1"
			}
			must.EqOp(t, want, v.ID)
			must.EqOp(t, in.Name, v.Name)
			must.EqOp(t, in.ExternalID, v.ExternalID)
			must.EqOp(t, in.PluginID, v.PluginID)
			must.EqOp(t, in.RequestedCapacityMin, v.CapacityMin)
			must.EqOp(t, in.RequestedCapacityMax, v.CapacityMax)
			must.MapEq(t, in.Secrets, v.Secrets)
			must.MapEq(t, in.Parameters, v.Parameters)
			must.MapEq(t, in.Context, v.Context)
			for _, c := range v.RequestedCapabilities {
				must.NotNil(t, c)
			}
		}
	})
}
