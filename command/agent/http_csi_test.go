package agent

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
)

// registerCSINode registers a ready node whose fingerprint reports the
// hostpath plugin as controller and node, so volumes may name it.
func registerCSINode(t *testing.T, a *Agent) string {
	t.Helper()
	id := uuid.NewString()
	info := &structs.CSIInfo{PluginID: "hostpath", Healthy: true, Provider: "hostpath.csi.roam.dev", RequiresControllerPlugin: true}
	var reply structs.NodeUpdateResponse
	must.NoError(t, a.RPC("Node.Register", &structs.NodeRegisterRequest{Node: &structs.Node{
		ID: id, SecretID: "secret-" + id, Name: "csi-" + id[:8], Datacenter: "dc1",
		Status:               structs.NodeStatusReady,
		Attributes:           map[string]string{"roam.version": "test"},
		CSIControllerPlugins: map[string]*structs.CSIInfo{"hostpath": info},
		CSINodePlugins: map[string]*structs.CSIInfo{"hostpath": {PluginID: "hostpath", Healthy: true,
			Provider: "hostpath.csi.roam.dev", NodeInfo: &structs.CSINodeInfo{ID: id, MaxVolumes: 16}}},
	}}, &reply))
	return id
}

const testVolumeBody = `{"Volumes": [{
	"ID": "vol1", "ExternalID": "ext-vol1", "PluginID": "hostpath",
	"RequestedCapabilities": [{"AccessMode": "single-node-writer", "AttachmentMode": "file-system"}],
	"MountOptions": {"FSType": "ext4", "MountFlags": ["noatime"]},
	"Secrets": {"token": "s3cret"}, "Parameters": {"p": "1"}, "Context": {"c": "2"},
	"RequestedCapacityMin": 1024, "RequestedCapacityMax": 4096}]}`

func TestHTTP_CSIVolumes(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	t.Run("list requires type csi", func(t *testing.T) {
		for _, path := range []string{"/v1/volumes", "/v1/volumes?type=host", "/v1/plugins", "/v1/plugins?type=x"} {
			res := do(t, a, http.MethodGet, path)
			must.EqOp(t, http.StatusBadRequest, res.code, must.Sprintf("%s: %s", path, res.body))
		}
	})
	t.Run("unknowns are 404", func(t *testing.T) {
		res := do(t, a, http.MethodGet, "/v1/volume/csi/nope")
		must.EqOp(t, http.StatusNotFound, res.code)
		requireReadHeaders(t, res.header)
		must.EqOp(t, http.StatusNotFound, do(t, a, http.MethodGet, "/v1/plugin/csi/nope").code)
		must.EqOp(t, http.StatusNotFound, do(t, a, http.MethodDelete, "/v1/volume/csi/nope").code)
	})
	t.Run("unknown plugin is 400 and writes nothing", func(t *testing.T) {
		res := send(t, a, http.MethodPut, "/v1/volume/csi/vol1", []byte(testVolumeBody))
		must.EqOp(t, http.StatusBadRequest, res.code)
		must.StrContains(t, string(res.body), `unknown plugin "hostpath"`)
		var vols []*structs.CSIVolListStub
		get(t, a, "/v1/volumes?type=csi", &vols)
		must.SliceEmpty(t, vols)
	})
	t.Run("bad bodies are 400", func(t *testing.T) {
		for _, body := range []string{`{`, `{}`, `{"Volumes": [null]}`,
			`{"Volumes": [{"ID": "other", "ExternalID": "e", "PluginID": "hostpath"}]}`} {
			res := send(t, a, http.MethodPut, "/v1/volume/csi/vol1", []byte(body))
			must.EqOp(t, http.StatusBadRequest, res.code, must.Sprintf("%s: %s", body, res.body))
		}
	})

	registerCSINode(t, a)

	t.Run("bad capability is 400", func(t *testing.T) {
		res := send(t, a, http.MethodPost, "/v1/volume/csi/vol1",
			[]byte(`{"Volumes": [{"ExternalID": "e", "PluginID": "hostpath", "RequestedCapabilities": [{"AccessMode": "bogus", "AttachmentMode": "file-system"}]}]}`))
		must.EqOp(t, http.StatusBadRequest, res.code)
		must.StrContains(t, string(res.body), "bogus")
	})

	res := send(t, a, http.MethodPut, "/v1/volume/csi/vol1", []byte(testVolumeBody))
	must.EqOp(t, http.StatusOK, res.code, must.Sprint(string(res.body)))
	must.NotEq(t, "", res.header.Get("X-Nomad-Index"))

	var vol map[string]any
	res = get(t, a, "/v1/volume/csi/vol1", &vol)
	requireReadHeaders(t, res.header)
	must.StrNotContains(t, string(res.body), "s3cret")
	must.MapNotContainsKey(t, vol, "Secrets")
	must.EqOp(t, "ext-vol1", vol["ExternalID"].(string))
	must.EqOp(t, "single-node-writer", vol["AccessMode"].(string))
	must.EqOp(t, float64(4096), vol["RequestedCapacityMax"].(float64))
	must.True(t, vol["Schedulable"].(bool))
	must.EqOp(t, "hostpath.csi.roam.dev", vol["Provider"].(string))

	t.Run("changing a volume's identity is 400 naming the field", func(t *testing.T) {
		var before map[string]any
		get(t, a, "/v1/volume/csi/vol1", &before)
		body := strings.Replace(testVolumeBody, `"ExternalID": "ext-vol1", "PluginID": "hostpath"`,
			`"ExternalID": "ext-other", "PluginID": "other"`, 1)
		res := send(t, a, http.MethodPut, "/v1/volume/csi/vol1", []byte(body))
		must.EqOp(t, http.StatusBadRequest, res.code, must.Sprint(string(res.body)))
		// An unknown plugin is refused first; a known one would be refused
		// as a change of plugin_id.
		must.StrContains(t, string(res.body), `unknown plugin "other"`)
		body = strings.Replace(testVolumeBody, `"ExternalID": "ext-vol1"`, `"ExternalID": "ext-other"`, 1)
		res = send(t, a, http.MethodPut, "/v1/volume/csi/vol1", []byte(body))
		must.EqOp(t, http.StatusBadRequest, res.code, must.Sprint(string(res.body)))
		must.StrContains(t, string(res.body), `volume "vol1": invalid request: external_id cannot be changed from "ext-vol1" to "ext-other"`)
		var after map[string]any
		get(t, a, "/v1/volume/csi/vol1", &after)
		must.Eq(t, before, after)
	})

	var vols []*structs.CSIVolListStub
	res = get(t, a, "/v1/volumes?type=csi&plugin_id=hostpath", &vols)
	requireReadHeaders(t, res.header)
	must.SliceLen(t, 1, vols)
	must.EqOp(t, "vol1", vols[0].ID)
	get(t, a, "/v1/volumes?type=csi&prefix=zz", &vols)
	must.SliceEmpty(t, vols)
	get(t, a, "/v1/volumes?type=csi&plugin_id=other", &vols)
	must.SliceEmpty(t, vols)

	var plugins []*structs.CSIPluginListStub
	get(t, a, "/v1/plugins?type=csi", &plugins)
	must.SliceLen(t, 1, plugins)
	must.EqOp(t, 1, plugins[0].NodesHealthy)
	var plugin structs.CSIPlugin
	get(t, a, "/v1/plugin/csi/hostpath", &plugin)
	must.MapLen(t, 1, plugin.Controllers)

	res = do(t, a, http.MethodDelete, "/v1/volume/csi/vol1?force=true")
	must.EqOp(t, http.StatusOK, res.code, must.Sprint(string(res.body)))
	must.EqOp(t, http.StatusNotFound, do(t, a, http.MethodGet, "/v1/volume/csi/vol1").code)
	must.EqOp(t, http.StatusBadRequest, do(t, a, http.MethodDelete, "/v1/volume/csi/vol1?force=maybe").code)
}

func TestNomadAPI_CSI(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	c := newNomadClient(t, a)
	vol := &nomadapi.CSIVolume{
		ID: "web", ExternalID: "ext-web", PluginID: "hostpath",
		RequestedCapabilities: []*nomadapi.CSIVolumeCapability{{
			AccessMode: nomadapi.CSIVolumeAccessModeMultiNodeMultiWriter, AttachmentMode: nomadapi.CSIVolumeAttachmentModeFilesystem,
		}},
		Secrets: nomadapi.CSISecrets{"k": "v"},
	}
	_, err := c.CSIVolumes().Register(vol, nil)
	must.ErrorContains(t, err, `unknown plugin "hostpath"`)

	registerCSINode(t, a)
	_, err = c.CSIVolumes().Register(vol, nil)
	must.NoError(t, err)

	// The volume's identity is fixed: Nomad's client gets the 400.
	moved := *vol
	moved.ExternalID = "ext-elsewhere"
	_, err = c.CSIVolumes().Register(&moved, nil)
	must.ErrorContains(t, err, "400")
	must.ErrorContains(t, err, `external_id cannot be changed from "ext-web" to "ext-elsewhere"`)

	list, qm, err := c.CSIVolumes().List(nil)
	must.NoError(t, err)
	must.Positive(t, qm.LastIndex)
	must.SliceLen(t, 1, list)
	must.EqOp(t, "web", list[0].ID)
	must.EqOp(t, "web", list[0].Name)
	must.True(t, list[0].Schedulable)

	got, _, err := c.CSIVolumes().Info("web", nil)
	must.NoError(t, err)
	must.EqOp(t, "ext-web", got.ExternalID)
	must.MapEmpty(t, got.Secrets)
	must.SliceLen(t, 1, got.RequestedCapabilities)
	must.EqOp(t, nomadapi.CSIVolumeAccessModeMultiNodeMultiWriter, got.RequestedCapabilities[0].AccessMode)

	plugins, _, err := c.CSIPlugins().List(nil)
	must.NoError(t, err)
	must.SliceLen(t, 1, plugins)
	must.EqOp(t, "hostpath", plugins[0].ID)
	p, _, err := c.CSIPlugins().Info("hostpath", nil)
	must.NoError(t, err)
	must.EqOp(t, 1, p.ControllersHealthy)
	must.MapLen(t, 1, p.Nodes)
	_, _, err = c.CSIPlugins().Info("nope", nil)
	must.ErrorContains(t, err, "404")

	must.NoError(t, c.CSIVolumes().Deregister("web", false, nil))
	_, _, err = c.CSIVolumes().Info("web", nil)
	must.ErrorContains(t, err, "404")
	must.Error(t, c.CSIVolumes().Deregister("web", false, nil))

}
