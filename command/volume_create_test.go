package command

import (
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

func TestParseVolumeCreateSpec(t *testing.T) {
	noExternal := strings.Replace(volumeSpec, `external_id = "ext-data"`, "", 1)
	vol, err := parseVolumeCreateSpec("v.hcl", []byte(noExternal))
	must.NoError(t, err)
	must.EqOp(t, "", vol.ExternalID)
	must.EqOp(t, "data", vol.ID)
	must.SliceLen(t, 2, vol.RequestedCapabilities)

	// An external ID given is kept (and ignored by the server).
	vol, err = parseVolumeCreateSpec("v.hcl", []byte(volumeSpec))
	must.NoError(t, err)
	must.EqOp(t, "ext-data", vol.ExternalID)

	// Errors keep the file's positions.
	_, err = parseVolumeCreateSpec("v.hcl", []byte("id = \"a\"\ntype = \"csi\"\nplugin_id = \"p\"\nbogus = 1\n"))
	must.ErrorContains(t, err, "v.hcl:4,1: Unsupported argument")
	_, err = parseVolumeCreateSpec("v.hcl", []byte("id = \n"))
	must.ErrorContains(t, err, "v.hcl:1")
}

// A dev agent runs no CSI plugin: these cover arguments and the server's
// refusals.
func TestCLI_VolumeCreateErrors(t *testing.T) {
	t.Parallel()
	_, addr := newTestAgent(t)
	spec := writeFile(t, "vol.hcl", strings.Replace(volumeSpec, `external_id = "ext-data"`, "", 1))

	for _, tc := range []struct {
		args     []string
		contains string
	}{
		{[]string{"volume", "create", "-address", addr, spec}, `unknown plugin "hostpath"`},
		{[]string{"volume", "create", "-address", addr}, "one argument"},
		{[]string{"volume", "create", "-address", addr, writeFile(t, "bad.hcl", "id = \"x\"\nwhat = 1\n")}, "bad.hcl:2,1"},
		{[]string{"volume", "delete", "-address", addr, "nope"}, "404"},
		{[]string{"volume", "delete", "-address", addr}, "one argument"},
		{[]string{"volume", "detach", "-address", addr, "nope", "node1"}, "404"},
		{[]string{"volume", "detach", "-address", addr, "nope"}, "two arguments"},
		{[]string{"volume", "snapshot", "create", "-address", addr, "nope"}, "404"},
		{[]string{"volume", "snapshot", "create", "-address", addr}, "one or two arguments"},
		{[]string{"volume", "snapshot", "delete", "-address", addr, "hostpath", "snap"}, `unknown plugin "hostpath"`},
		{[]string{"volume", "snapshot", "delete", "-address", addr, "hostpath"}, "two arguments"},
		{[]string{"volume", "snapshot", "list", "-address", addr, "-plugin", "hostpath"}, `unknown plugin "hostpath"`},
		{[]string{"volume", "snapshot", "list", "-address", addr}, "-plugin flag is required"},
		{[]string{"volume", "snapshot", "bogus"}, "unknown subcommand"},
	} {
		code, _, errOut := run(tc.args...)
		must.EqOp(t, 1, code, must.Sprintf("%v: %s", tc.args, errOut))
		must.StrContains(t, errOut, tc.contains, must.Sprintf("%v", tc.args))
	}

	code, out, _ := run("volume", "snapshot")
	must.EqOp(t, 0, code)
	must.StrContains(t, out, "volume snapshot list")
}
