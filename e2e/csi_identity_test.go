//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
)

// identityPluginID is a second plugin, a storage provider of its own.
const identityPluginID = "hostpath2"

// identityVolume is a register body's volume vol1 of plugin with external
// ID ext, in file-system mode with the given access modes.
func identityVolume(ext, plugin string, accessModes ...string) map[string]any {
	caps := make([]map[string]string, 0, len(accessModes))
	for _, m := range accessModes {
		caps = append(caps, map[string]string{"AccessMode": m, "AttachmentMode": api.CSIAttachmentModeFilesystem})
	}
	return map[string]any{
		"ID": "vol1", "Name": "vol1", "ExternalID": ext, "PluginID": plugin,
		"RequestedCapabilities": caps,
		"MountOptions":          map[string]any{"FSType": "ext4", "MountFlags": []string{"noatime"}},
	}
}

// putVolume sends PUT /v1/volume/csi/vol1 with vol and returns the status
// and body, whatever they are.
func putVolume(t *testing.T, base string, vol map[string]any) (int, string) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"Volumes": []any{vol}})
	must.NoError(t, err)
	req, err := http.NewRequest(http.MethodPut, base+"/v1/volume/csi/"+url.PathEscape("vol1"), bytes.NewReader(body))
	must.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	must.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	return resp.StatusCode, string(data)
}

// claimIDs renders a volume's claims as allocation=state pairs.
func claimIDs(v *api.CSIVolume) []string {
	var out []string
	for _, c := range v.Claims {
		out = append(out, c.AllocationID+"="+c.State)
	}
	slices.Sort(out)
	return out
}

// mustSameVolume checks that after is the volume before was, in every
// field that says what storage it is and how it is used.
func mustSameVolume(t *testing.T, before, after *api.CSIVolume) {
	t.Helper()
	must.Eq(t, before.ExternalID, after.ExternalID)
	must.Eq(t, before.PluginID, after.PluginID)
	must.Eq(t, before.Name, after.Name)
	must.Eq(t, before.RequestedCapabilities, after.RequestedCapabilities)
	must.Eq(t, before.MountOptions, after.MountOptions)
	must.Eq(t, before.Context, after.Context)
	must.Eq(t, before.ModifyIndex, after.ModifyIndex)
	must.Eq(t, claimIDs(before), claimIDs(after))
}

// TestCSI_VolumeIdentityFixed claims a volume with a running job, then
// re-registers it over HTTP (sent to a server that may be a follower)
// with another external ID, with another plugin's ID, and without the
// access mode the claim uses: each is a 400 naming the field, and the
// volume reads back unchanged, ModifyIndex included. Nomad's Go client and
// `roam volume register` are refused likewise. Mount options follow
// Nomad's rule: refused while the volume is claimed, taken once it is
// free. An update within the rules (name, an added capability) goes
// through while it is claimed, and the job keeps running on the volume.
func TestCSI_VolumeIdentityFixed(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 3, Clients: 1, ExtraPluginIDs: []string{identityPluginID}})
	ext := cc.createVolumes(t, "client-0", "vol1", "vol2")
	otherExt := createVolumesAt(t, cc.Extra[identityPluginID].Sockets["client-0"], "vol1")[0]
	t.Logf("vol1 is %s of %s; %s of %s and %s of %s exist too",
		ext[0], csiPluginID, ext[1], csiPluginID, otherExt, identityPluginID)

	rw, ro := api.CSIAccessModeSingleNodeWriter, api.CSIAccessModeSingleNodeReader
	code, body := putVolume(t, cc.API(), identityVolume(ext[0], csiPluginID, rw, ro))
	must.Eq(t, http.StatusOK, code, must.Sprint(body))

	cc.RunJob(csiJob("holder", "service", 1, "vol1", false, "", sleepScript))
	holder := cc.waitCSIAllocs(t, "holder", csiSettle, oneAlloc("running"))[0]
	cc.waitClaim(t, "vol1", holder.ID)
	before, err := cc.volume("vol1")
	must.NoError(t, err)
	t.Logf("vol1 claimed by %s at index %d: %s", holder, before.ModifyIndex, claimsString(before))

	refused := []struct {
		name string
		vol  map[string]any
		want string
	}{
		{"another external id", identityVolume(ext[1], csiPluginID, rw, ro),
			fmt.Sprintf(`volume "vol1": invalid request: external_id cannot be changed from %q to %q`, ext[0], ext[1])},
		{"another plugin", identityVolume(ext[0], identityPluginID, rw, ro),
			fmt.Sprintf(`volume "vol1": invalid request: plugin_id cannot be changed from %q to %q`, csiPluginID, identityPluginID)},
		{"another plugin's volume", identityVolume(otherExt, identityPluginID, rw, ro),
			`plugin_id cannot be changed`},
		{"without the access mode in use", identityVolume(ext[0], csiPluginID, ro),
			`volume "vol1": invalid request: capability single-node-writer/file-system cannot be removed: 1 claim(s) use it`},
		{"new mount options while claimed", func() map[string]any {
			v := identityVolume(ext[0], csiPluginID, rw, ro)
			v["MountOptions"] = map[string]any{"FSType": "xfs", "MountFlags": []string{"noatime", "nodiratime"}}
			return v
		}(), `mount_options cannot be changed while the volume has 1 claim(s)`},
	}
	for _, tc := range refused {
		code, body := putVolume(t, cc.API(), tc.vol)
		must.Eq(t, http.StatusBadRequest, code, must.Sprintf("%s: %s", tc.name, body))
		must.StrContains(t, body, tc.want, must.Sprint(tc.name))
		must.StrNotContains(t, body, "unknown plugin", must.Sprint(tc.name))
		after, err := cc.volume("vol1")
		must.NoError(t, err)
		mustSameVolume(t, before, after)
		t.Logf("%s: %d %s", tc.name, code, bytes.TrimSpace([]byte(body)))
	}

	// Nomad's Go client sees the refusal as an error.
	nc, err := nomadapi.NewClient(&nomadapi.Config{Address: cc.API()})
	must.NoError(t, err)
	_, err = nc.CSIVolumes().Register(&nomadapi.CSIVolume{
		ID: "vol1", Name: "vol1", ExternalID: ext[1], PluginID: csiPluginID,
		RequestedCapabilities: []*nomadapi.CSIVolumeCapability{
			{AccessMode: nomadapi.CSIVolumeAccessModeSingleNodeWriter, AttachmentMode: nomadapi.CSIVolumeAttachmentModeFilesystem},
			{AccessMode: nomadapi.CSIVolumeAccessModeSingleNodeReader, AttachmentMode: nomadapi.CSIVolumeAttachmentModeFilesystem},
		},
		MountOptions: &nomadapi.CSIMountOptions{FSType: "ext4", MountFlags: []string{"noatime"}},
	}, nil)
	must.ErrorContains(t, err, "400")
	must.ErrorContains(t, err, "external_id cannot be changed")
	t.Logf("nomad api client: %v", err)

	// So does the CLI.
	spec := filepath.Join(t.TempDir(), "volume.hcl")
	must.NoError(t, os.WriteFile(spec, []byte(volumeSpec("vol1", ext[1])), 0o644))
	out, errOut, exit := cc.RunCLI("volume", "register", spec)
	must.NotEq(t, 0, exit, must.Sprintf("volume register of another external id succeeded: %s", out))
	must.StrContains(t, out+errOut, "external_id cannot be changed")
	after, err := cc.volume("vol1")
	must.NoError(t, err)
	mustSameVolume(t, before, after)

	// Within the rules, a claimed volume is updated: a new name and a
	// capability no claim uses. The claim and the job are untouched.
	allowed := identityVolume(ext[0], csiPluginID, rw, ro, api.CSIAccessModeMultiNodeReader)
	allowed["Name"] = "vol1 renamed"
	code, body = putVolume(t, cc.API(), allowed)
	must.Eq(t, http.StatusOK, code, must.Sprint(body))
	after, err = cc.volume("vol1")
	must.NoError(t, err)
	must.Eq(t, "vol1 renamed", after.Name)
	must.SliceLen(t, 3, after.RequestedCapabilities)
	must.Greater(t, before.ModifyIndex, after.ModifyIndex)
	must.Eq(t, before.ExternalID, after.ExternalID)
	must.Eq(t, claimIDs(before), claimIDs(after))
	cc.waitCSIAllocs(t, "holder", csiSettle, oneAlloc("running"))

	// Once the job is gone and the claim freed, new mount options go
	// through and read back.
	cc.MustCLI("job", "stop", "holder")
	cc.waitUnclaimed(t, "vol1")
	mo := identityVolume(ext[0], csiPluginID, rw, ro)
	mo["MountOptions"] = map[string]any{"FSType": "xfs", "MountFlags": []string{"noatime", "nodiratime"}}
	code, body = putVolume(t, cc.API(), mo)
	must.Eq(t, http.StatusOK, code, must.Sprint(body))
	after, err = cc.volume("vol1")
	must.NoError(t, err)
	must.Eq(t, &api.CSIMountOptions{FSType: "xfs", MountFlags: []string{"noatime", "nodiratime"}}, after.MountOptions)
	must.Eq(t, ext[0], after.ExternalID)
	must.Eq(t, csiPluginID, after.PluginID)

	// Unclaimed, the identity is still fixed.
	code, body = putVolume(t, cc.API(), identityVolume(otherExt, identityPluginID, rw, ro))
	must.Eq(t, http.StatusBadRequest, code, must.Sprint(body))
	must.StrContains(t, body, "plugin_id cannot be changed")
	must.StrContains(t, body, "external_id cannot be changed")
	cc.mustNoOverlaps(t)
}
