package nomad

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/plugins/csi/hostpath"
	"github.com/roamhq/roam/structs"
)

// TestCSIVolume_CreateFromSnapshotAndClone: a volume created from a
// snapshot, or as a clone, holds its source's bytes and records its
// source; a spec with both sources, a register with one, and an update
// that changes one are refused without calling the plugin.
func TestCSIVolume_CreateFromSnapshotAndClone(t *testing.T) {
	f := newCSIFixture(t)
	s := f.srv
	var cresp structs.CSIVolumeCreateResponse
	must.NoError(t, s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{createSpec("src")}}, &cresp))
	srcExt := cresp.Volumes[0].ExternalID
	must.NoError(t, os.WriteFile(filepath.Join(f.stateDir, "volumes", srcExt, "token"), []byte("t0k3n"), 0o644))
	var sresp structs.CSISnapshotCreateResponse
	must.NoError(t, s.RPC("CSIVolume.CreateSnapshot", &structs.CSISnapshotCreateRequest{
		Snapshots: []*structs.CSISnapshotSpec{{SourceVolumeID: "src", Name: "src-snap"}}}, &sresp))
	snapID := sresp.Snapshots[0].ID
	creates := func() int64 {
		t.Helper()
		calls, err := hostpath.ReadCalls(f.stateDir, "node-a")
		must.NoError(t, err)
		return calls["CreateVolume"]
	}
	before := creates()

	both := createSpec("both")
	both.SnapshotID, both.CloneID = snapID, srcExt
	err := s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{both}}, &cresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "a volume has one source")
	reg := testVolume("registered")
	reg.ExternalID = srcExt
	reg.SnapshotID = snapID
	var rresp structs.CSIVolumeRegisterResponse
	err = s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{reg}}, &rresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "apply only to volume create")
	must.Eq(t, before, creates())

	for _, tc := range []struct{ id, snap, clone string }{
		{"restored", snapID, ""},
		{"cloned", "", srcExt},
	} {
		spec := createSpec(tc.id)
		spec.SnapshotID, spec.CloneID = tc.snap, tc.clone
		must.NoError(t, s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{spec}}, &cresp))
		got := cresp.Volumes[0]
		must.NotEq(t, srcExt, got.ExternalID)
		must.Eq(t, tc.snap, got.SnapshotID)
		must.Eq(t, tc.clone, got.CloneID)
		b, err := os.ReadFile(filepath.Join(f.stateDir, "volumes", got.ExternalID, "token"))
		must.NoError(t, err, must.Sprintf("volume %s", tc.id))
		must.Eq(t, "t0k3n", string(b))

		// Creating the ID again with the same source updates it; another
		// source is refused: the volume was made from what it was made.
		must.NoError(t, s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{spec}}, &cresp))
		other := spec.Copy()
		other.SnapshotID, other.CloneID = "snap-other", ""
		err = s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{other}}, &cresp)
		must.ErrorIs(t, err, structs.ErrInvalidRequest)
		must.StrContains(t, err.Error(), "cannot be changed")
	}
	must.Eq(t, before+2, creates())
}
