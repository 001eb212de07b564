package nomad

import (
	"fmt"
	"math"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/plugins/csi/hostpath"
	"github.com/roamhq/roam/structs"
)

func createSpec(id string) *structs.CSIVolume {
	v := testVolume(id)
	v.ExternalID = ""
	v.CapacityMin = 1 << 20
	v.Context = map[string]string{"mine": "1"}
	return v
}

func TestCSIVolume_CreateAndDelete(t *testing.T) {
	f := newCSIFixture(t)
	s := f.srv

	// Bad input creates nothing at the plugin.
	var cresp structs.CSIVolumeCreateResponse
	bad := createSpec("bad")
	bad.PluginID = "nope"
	err := s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{bad}}, &cresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), `unknown plugin "nope"`)
	err = s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{}, &cresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)

	err = s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{createSpec("made")}}, &cresp)
	must.NoError(t, err)
	must.SliceLen(t, 1, cresp.Volumes)
	must.NotEq(t, "", cresp.Volumes[0].ExternalID)
	must.MapEmpty(t, cresp.Volumes[0].Secrets, must.Sprint("the reply is sanitized"))
	got, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "made")
	must.NoError(t, err)
	must.NotNil(t, got)
	must.Eq(t, cresp.Volumes[0].ExternalID, got.ExternalID)
	must.Positive(t, got.Capacity)
	must.Eq(t, "1", got.Context["mine"])
	must.Eq(t, "s3cret", got.Secrets["token"])
	calls, err := hostpath.ReadCalls(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(1), calls["CreateVolume"])

	// Creating a registered ID again updates its registration: the
	// plugin is not called, and the provider's external ID, capacity and
	// context stay.
	again := createSpec("made")
	again.Name = "made again"
	again.Context = map[string]string{"mine": "changed", "more": "3"}
	var aresp structs.CSIVolumeCreateResponse
	err = s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{again}}, &aresp)
	must.NoError(t, err)
	must.SliceLen(t, 1, aresp.Volumes)
	must.Eq(t, got.ExternalID, aresp.Volumes[0].ExternalID)
	calls, err = hostpath.ReadCalls(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(1), calls["CreateVolume"])
	updated, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "made")
	must.NoError(t, err)
	must.Eq(t, "made again", updated.Name)
	must.Eq(t, got.ExternalID, updated.ExternalID)
	must.Eq(t, got.Capacity, updated.Capacity)
	must.Eq(t, "1", updated.Context["mine"], must.Sprint("the registered context wins"))
	must.Eq(t, "3", updated.Context["more"])
	for k, v := range got.Context {
		must.Eq(t, v, updated.Context[k])
	}

	// A claimed volume is not deleted.
	a1 := f.alloc(t, f.nodeB.ID)
	_, err = f.claim("made", a1.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.NoError(t, err)

	// Nor is it changed by a create of its ID that drops the capability
	// its claim uses or names other storage; the plugin is not called.
	claimed, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "made")
	must.NoError(t, err)
	drop := createSpec("made")
	drop.RequestedCapabilities = []*structs.CSIVolumeCapability{{
		AccessMode: structs.CSIAccessModeMultiNodeMultiWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem}}
	drop.ExternalID = "elsewhere"
	err = s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{drop}}, &aresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "capability single-node-writer/file-system cannot be removed: 1 claim(s) use it")
	must.StrContains(t, err.Error(), `external_id cannot be changed from "`+got.ExternalID+`" to "elsewhere"`)
	after, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "made")
	must.NoError(t, err)
	must.Eq(t, claimed, after)
	calls, err = hostpath.ReadCalls(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(1), calls["CreateVolume"])
	var dresp structs.CSIVolumeDeleteResponse
	err = s.RPC("CSIVolume.Delete", &structs.CSIVolumeDeleteRequest{VolumeIDs: []string{"made"}}, &dresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	calls, err = hostpath.ReadCalls(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(0), calls["DeleteVolume"])

	// Detach refuses while the allocation runs, and releases nothing.
	var uresp structs.CSIVolumeUnpublishResponse
	err = s.RPC("CSIVolume.Unpublish", &structs.CSIVolumeUnpublishRequest{VolumeID: "made", NodeID: f.nodeB.ID}, &uresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	got, err = s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "made")
	must.NoError(t, err)
	must.Eq(t, structs.CSIVolumeClaimStateTaken, got.Claims[a1.ID].State)
	// A node without claims on the volume has nothing to release.
	err = s.RPC("CSIVolume.Unpublish", &structs.CSIVolumeUnpublishRequest{VolumeID: "made", NodeID: "other"}, &uresp)
	must.NoError(t, err)
	must.SliceEmpty(t, uresp.Released)

	// The node releases its claim; now the volume may go.
	_, err = f.claim("made", a1.ID, structs.CSIVolumeClaimStateUnpublishing, f.nodeB.SecretID)
	must.NoError(t, err)
	err = s.RPC("CSIVolume.Delete", &structs.CSIVolumeDeleteRequest{VolumeIDs: []string{"made"}}, &dresp)
	must.NoError(t, err)
	got, err = s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "made")
	must.NoError(t, err)
	must.Nil(t, got)
	calls, err = hostpath.ReadCalls(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(1), calls["DeleteVolume"])
	err = s.RPC("CSIVolume.Delete", &structs.CSIVolumeDeleteRequest{VolumeIDs: []string{"made"}}, &dresp)
	must.ErrorIs(t, err, structs.ErrNotFound)

	overlaps, err := hostpath.ReadOverlaps(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(0), overlaps)
}

func TestCSIVolume_Snapshots(t *testing.T) {
	f := newCSIFixture(t)
	s := f.srv
	vol := f.volume(t, "src")

	var cresp structs.CSISnapshotCreateResponse
	err := s.RPC("CSIVolume.CreateSnapshot", &structs.CSISnapshotCreateRequest{
		Snapshots: []*structs.CSISnapshotSpec{{SourceVolumeID: "nope"}}}, &cresp)
	must.ErrorIs(t, err, structs.ErrNotFound)
	var lresp structs.CSISnapshotListResponse
	err = s.RPC("CSIVolume.ListSnapshots", &structs.CSISnapshotListRequest{PluginID: "nope"}, &lresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)

	err = s.RPC("CSIVolume.CreateSnapshot", &structs.CSISnapshotCreateRequest{
		Snapshots: []*structs.CSISnapshotSpec{{SourceVolumeID: vol.ID, Name: "snap1"}}}, &cresp)
	must.NoError(t, err)
	must.SliceLen(t, 1, cresp.Snapshots)
	snapID := cresp.Snapshots[0].ID
	must.NotEq(t, "", snapID)

	err = s.RPC("CSIVolume.ListSnapshots", &structs.CSISnapshotListRequest{PluginID: "hostpath"}, &lresp)
	must.NoError(t, err)
	ids := make([]string, 0, len(lresp.Snapshots))
	for _, sn := range lresp.Snapshots {
		ids = append(ids, sn.ID)
	}
	must.SliceContains(t, ids, snapID)

	var dresp structs.CSISnapshotDeleteResponse
	err = s.RPC("CSIVolume.DeleteSnapshot", &structs.CSISnapshotDeleteRequest{PluginID: "hostpath", SnapshotID: snapID}, &dresp)
	must.NoError(t, err)
	lresp = structs.CSISnapshotListResponse{}
	err = s.RPC("CSIVolume.ListSnapshots", &structs.CSISnapshotListRequest{PluginID: "hostpath"}, &lresp)
	must.NoError(t, err)
	for _, sn := range lresp.Snapshots {
		must.NotEq(t, snapID, sn.ID)
	}

	calls, err := hostpath.ReadCalls(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(1), calls["CreateSnapshot"])
	must.Eq(t, int64(1), calls["DeleteSnapshot"])
	overlaps, err := hostpath.ReadOverlaps(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(0), overlaps)
}

// A capacity past structs.MaxVolumeCapacity (2^63-1) is refused before
// anything sees it: no plugin call, no Raft write (not even the lane's
// fence). One within it that the provider cannot give is the plugin's
// OUT_OF_RANGE: the caller's mistake, returned as ErrCSIInvalidArgument
// (a 400 over HTTP), and nothing is registered.
func TestCSIVolume_CreateCapacityOutOfRange(t *testing.T) {
	f := newCSIFixture(t)
	s := f.srv
	before, err := s.State().Index("csi_volumes")
	must.NoError(t, err)
	lastIndex := s.raft.LastIndex()
	v := createSpec("absurd")
	v.CapacityMin = math.MaxInt64
	var resp structs.CSIVolumeCreateResponse
	err = s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{v}}, &resp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "capacity_min 9223372036854775807 is more than")
	must.Eq(t, lastIndex, s.raft.LastIndex(), must.Sprint("a refused create wrote to raft"))

	v = createSpec("huge")
	v.CapacityMin = structs.MaxVolumeCapacity
	err = s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{v}}, &resp)
	must.ErrorIs(t, err, structs.ErrCSIInvalidArgument)
	must.StrContains(t, err.Error(), "1152921504606846976")
	got, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "huge")
	must.NoError(t, err)
	must.Nil(t, got)
	after, err := s.State().Index("csi_volumes")
	must.NoError(t, err)
	must.Eq(t, before, after)

	// A negative one never reaches the plugin.
	v = createSpec("negative")
	v.CapacityMin = -1
	err = s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{v}}, &resp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "capacity_min -1")
}

// A call over several volumes that stops after some were done says so:
// sent again as a call that never ran, the next leader would refuse it as
// "volume not found" for the ones already deleted, or snapshot them twice.
func TestPartlyDone(t *testing.T) {
	noLeader := fmt.Errorf("volume %q: lanes closed: %w", "b", structs.ErrNoLeader)
	got := partlyDone([]string{"a"}, "deleted", noLeader)
	must.ErrorIs(t, got, structs.ErrPartlyDone)
	must.ErrorIs(t, got, structs.ErrNoLeader, must.Sprint("the cause is kept"))
	must.False(t, forwardRetryable(got), must.Sprint("forward would send it again"))
	must.EqError(t, got, structs.ErrPartlyDone.Error()+`: deleted a first, then: `+noLeader.Error())

	// Nothing done first: the plain error, which forward may send again.
	must.Eq(t, noLeader, partlyDone(nil, "deleted", noLeader))
	must.True(t, forwardRetryable(partlyDone(nil, "deleted", noLeader)))
	// Marked once only.
	twice := partlyDone([]string{"b"}, "deleted", got)
	must.Eq(t, got, twice)
}
