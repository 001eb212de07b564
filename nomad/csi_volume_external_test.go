package nomad

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// TestCSIVolume_ListExternal pages through what the provider has,
// registered or not, and refuses bad input by name.
func TestCSIVolume_ListExternal(t *testing.T) {
	f := newCSIFixture(t)
	s := f.srv
	f.volume(t, "registered")
	var cresp structs.CSIVolumeCreateResponse
	must.NoError(t, s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{createSpec("made")}}, &cresp))
	// One the provider has that Roam never registered.
	unregistered := f.volume(t, "stray")
	var dresp structs.CSIVolumeDeregisterResponse
	must.NoError(t, s.RPC("CSIVolume.Deregister", &structs.CSIVolumeDeregisterRequest{VolumeIDs: []string{"stray"}}, &dresp))

	var resp structs.CSIVolumeExternalListResponse
	for _, bad := range []structs.CSIVolumeExternalListRequest{
		{PluginID: "nope"},
		{PluginID: ""},
		{PluginID: "hostpath", PerPage: -1},
		{PluginID: "hostpath", PerPage: structs.MaxExternalPerPage + 1},
	} {
		err := s.RPC("CSIVolume.ListExternal", &bad, &resp)
		must.ErrorIs(t, err, structs.ErrInvalidRequest, must.Sprintf("%+v", bad))
	}

	seen := map[string]*structs.CSIVolumeExternalStub{}
	token, pages := "", 0
	for {
		resp = structs.CSIVolumeExternalListResponse{}
		must.NoError(t, s.RPC("CSIVolume.ListExternal", &structs.CSIVolumeExternalListRequest{
			PluginID: "hostpath", PerPage: 2, NextToken: token}, &resp))
		must.LessEq(t, 2, len(resp.Volumes))
		must.Positive(t, resp.Index)
		for _, v := range resp.Volumes {
			must.MapNotContainsKey(t, seen, v.ExternalID, must.Sprint("listed twice"))
			seen[v.ExternalID] = v
		}
		pages++
		if token = resp.NextToken; token == "" {
			break
		}
	}
	must.Eq(t, 2, pages)
	must.MapLen(t, 3, seen)
	must.MapContainsKey(t, seen, unregistered.ExternalID)
	must.MapContainsKey(t, seen, cresp.Volumes[0].ExternalID)
	must.Eq(t, int64(1<<20), seen[cresp.Volumes[0].ExternalID].CapacityBytes)
}
