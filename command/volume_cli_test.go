package command

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/uuid"
	"github.com/roamhq/roam/command/agent"
	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
)

// registerCSINode registers a ready node reporting the hostpath plugin.
func registerCSINode(t *testing.T, a *agent.Agent) string {
	t.Helper()
	id := uuid.NewString()
	var reply structs.NodeUpdateResponse
	must.NoError(t, a.RPC("Node.Register", &structs.NodeRegisterRequest{Node: &structs.Node{
		ID: id, SecretID: "secret-" + id, Name: "csi-" + id[:8], Datacenter: "dc1",
		Status: structs.NodeStatusReady,
		CSIControllerPlugins: map[string]*structs.CSIInfo{"hostpath": {PluginID: "hostpath", Healthy: true,
			Provider: "hostpath.csi.roam.dev", RequiresControllerPlugin: true}},
		CSINodePlugins: map[string]*structs.CSIInfo{"hostpath": {PluginID: "hostpath", Healthy: true,
			Provider: "hostpath.csi.roam.dev", NodeInfo: &structs.CSINodeInfo{ID: id, MaxVolumes: 4}}},
	}}, &reply))
	return id
}

func writeFile(t *testing.T, name, src string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	must.NoError(t, os.WriteFile(p, []byte(src), 0o600))
	return p
}

const volumeSpec = `
id          = "data"
type        = "csi"
plugin_id   = "hostpath"
external_id = "ext-data"
capacity_min = "1KiB"
capacity_max = 4096

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
capability {
  access_mode     = "single-node-reader-only"
  attachment_mode = "file-system"
}
mount_options {
  fs_type     = "ext4"
  mount_flags = ["noatime"]
}
secrets {
  token = "s3cret"
}
parameters {
  p = "1"
}
`

func TestParseVolumeSpec(t *testing.T) {
	vol, err := parseVolumeSpec("v.hcl", []byte(volumeSpec))
	must.NoError(t, err)
	must.EqOp(t, "data", vol.Name)
	must.EqOp(t, int64(1024), vol.RequestedCapacityMin)
	must.EqOp(t, int64(4096), vol.RequestedCapacityMax)
	must.SliceLen(t, 2, vol.RequestedCapabilities)
	must.EqOp(t, "ext4", vol.MountOptions.FSType)
	must.Eq(t, map[string]string{"token": "s3cret"}, vol.Secrets)
	must.Eq(t, map[string]string{"p": "1"}, vol.Parameters)

	for name, tc := range map[string]struct{ src, want string }{
		"unknown attribute": {"id = \"a\"\ntype = \"csi\"\nplugin_id = \"p\"\nexternal_id = \"e\"\nbogus = 1\n", "v.hcl:5,1: Unsupported argument"},
		"wrong type":        {"id = \"a\"\ntype = \"host\"\nplugin_id = \"p\"\nexternal_id = \"e\"\n", `v.hcl:2,8: Unsupported volume type; type is "host"`},
		"missing type":      {"id = \"a\"\nplugin_id = \"p\"\nexternal_id = \"e\"\n", `type is required`},
		"bad capacity":      {"id = \"a\"\ntype = \"csi\"\nplugin_id = \"p\"\nexternal_id = \"e\"\ncapacity_max = \"lots\"\n", "v.hcl:5,16: Invalid capacity_max"},
		"missing id":        {"type = \"csi\"\nplugin_id = \"p\"\nexternal_id = \"e\"\n", `Missing required argument; The argument "id" is required`},
		"syntax":            {"id = \n", "v.hcl:1,"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseVolumeSpec("v.hcl", []byte(tc.src))
			must.ErrorContains(t, err, tc.want)
		})
	}
}

func TestCLI_Volumes(t *testing.T) {
	t.Parallel()
	a, addr := newTestAgent(t)
	spec := writeFile(t, "vol.hcl", volumeSpec)

	// No plugin yet: the server refuses, naming it.
	code, _, errOut := run("volume", "register", "-address", addr, spec)
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, `unknown plugin "hostpath"`)

	code, _, errOut = run("volume", "register", "-address", addr, writeFile(t, "bad.hcl", "id = \"x\"\nwhat = 1\n"))
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "bad.hcl:2,1")
	code, _, _ = run("volume", "register", "-address", addr)
	must.EqOp(t, 1, code)
	code, _, _ = run("volume", "register", "-address", addr, filepath.Join(t.TempDir(), "missing.hcl"))
	must.EqOp(t, 1, code)

	code, out, _ := run("volume", "status", "-address", addr)
	must.EqOp(t, 0, code)
	must.StrContains(t, out, "No CSI volumes")
	code, out, _ = run("plugin", "status", "-address", addr)
	must.EqOp(t, 0, code)
	must.StrContains(t, out, "No CSI plugins")

	nodeID := registerCSINode(t, a)
	code, out, errOut = run("volume", "register", "-address", addr, spec)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.StrContains(t, out, `Volume "data" registered`)

	code, out, errOut = run("volume", "status", "-address", addr)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.Eq(t, []string{
		"ID Name Plugin ID Schedulable Access Mode",
		"data data hostpath true single-node-writer",
	}, lines(out))

	code, out, errOut = run("volume", "status", "-address", addr, "-verbose", "da")
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.StrContains(t, out, "External ID          = ext-data")
	must.StrContains(t, out, "Provider             = hostpath.csi.roam.dev")
	must.StrContains(t, out, "single-node-writer/file-system, single-node-reader-only/file-system")
	must.StrContains(t, out, "No claims")
	must.StrNotContains(t, out, "s3cret")

	code, _, errOut = run("volume", "status", "-address", addr, "nope")
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, `No volume(s) with prefix or ID "nope" found`)

	code, out, errOut = run("plugin", "status", "-address", addr)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.Eq(t, []string{
		"ID Provider Controllers Healthy/Expected Nodes Healthy/Expected",
		"hostpath hostpath.csi.roam.dev 1/1 1/1",
	}, lines(out))
	code, out, errOut = run("plugin", "status", "-address", addr, "host")
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.StrContains(t, out, "Controllers Healthy    = 1")
	must.StrContains(t, out, "Controller Concurrency = 1")
	must.StrContains(t, out, nodeID[:8]+"  true")
	code, _, errOut = run("plugin", "status", "-address", addr, "nope")
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, `No plugin(s) with prefix or ID "nope" found`)

	code, _, _ = run("volume", "deregister", "-address", addr)
	must.EqOp(t, 1, code)
	code, _, errOut = run("volume", "deregister", "-address", addr, "nope")
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "404")
	code, out, errOut = run("volume", "deregister", "-address", addr, "-force", "data")
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.StrContains(t, out, `Volume "data" deregistered`)
	code, _, _ = run("volume", "status", "-address", addr, "data")
	must.EqOp(t, 1, code)
}
