package nomad

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/plugins/csi/hostpath"
	"github.com/roamhq/roam/structs"
)

func TestCSIVolume_Expand(t *testing.T) {
	f := newCSIFixture(t)
	s := f.srv
	var cresp structs.CSIVolumeCreateResponse
	must.NoError(t, s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{createSpec("grow")}}, &cresp))
	must.Eq(t, int64(1<<20), cresp.Volumes[0].Capacity)
	expands := func() int64 {
		t.Helper()
		calls, err := hostpath.ReadCalls(f.stateDir, "node-a")
		must.NoError(t, err)
		return calls["ControllerExpandVolume"]
	}
	capacity := func() int64 {
		t.Helper()
		v, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "grow")
		must.NoError(t, err)
		return v.Capacity
	}

	// A shrink is refused by name, and the plugin is not called.
	var eresp structs.CSIVolumeExpandResponse
	err := s.RPC("CSIVolume.Expand", &structs.CSIVolumeExpandRequest{VolumeID: "grow", CapacityMin: 1 << 19}, &eresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), `volume "grow" is 1048576 bytes; 524288 is smaller and a volume cannot shrink`)
	for _, bad := range []*structs.CSIVolumeExpandRequest{
		{VolumeID: "grow"},
		{VolumeID: "grow", CapacityMin: 4 << 20, CapacityMax: 3 << 20},
		{VolumeID: "../x", CapacityMin: 4 << 20},
	} {
		err = s.RPC("CSIVolume.Expand", bad, &eresp)
		must.ErrorIs(t, err, structs.ErrInvalidRequest)
	}
	err = s.RPC("CSIVolume.Expand", &structs.CSIVolumeExpandRequest{VolumeID: "nope", CapacityMin: 4 << 20}, &eresp)
	must.ErrorIs(t, err, structs.ErrNotFound)
	must.Eq(t, int64(0), expands())
	must.Eq(t, int64(1<<20), capacity())

	// Expand grows it through the controller and records the new size.
	must.NoError(t, s.RPC("CSIVolume.Expand", &structs.CSIVolumeExpandRequest{VolumeID: "grow", CapacityMin: 2 << 20}, &eresp))
	must.Eq(t, int64(2<<20), eresp.Volume.Capacity)
	must.MapEmpty(t, eresp.Volume.Secrets, must.Sprint("the reply is sanitized"))
	must.Eq(t, int64(2<<20), capacity())
	must.Eq(t, int64(1), expands())

	// A create of the registered ID with a larger capacity_min expands it
	// (Nomad's rule), and so does a register.
	bigger := createSpec("grow")
	bigger.CapacityMin = 3 << 20
	must.NoError(t, s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{bigger}}, &cresp))
	must.Eq(t, int64(3<<20), cresp.Volumes[0].Capacity)
	must.Eq(t, int64(2), expands())
	reg, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "grow")
	must.NoError(t, err)
	again := reg.Copy()
	again.Claims = nil
	again.CapacityMin = 4 << 20
	var rresp structs.CSIVolumeRegisterResponse
	must.NoError(t, s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{again}}, &rresp))
	must.Eq(t, int64(4<<20), capacity())
	must.Eq(t, int64(3), expands())

	// A register that asks for more and breaks another rule changes
	// nothing, at the provider either.
	bad := again.Copy()
	bad.CapacityMin = 5 << 20
	bad.ExternalID = "elsewhere"
	err = s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{bad}}, &rresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "external_id cannot be changed")
	must.Eq(t, int64(4<<20), capacity())
	must.Eq(t, int64(3), expands())

	// With a claim taken on a node that cannot be reached, the provider's
	// volume grows and is recorded, and the call fails naming the node
	// whose mount was not grown; expanding again retries it.
	a := f.alloc(t, f.nodeB.ID)
	_, err = f.claim("grow", a.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.NoError(t, err)
	err = s.RPC("CSIVolume.Expand", &structs.CSIVolumeExpandRequest{VolumeID: "grow", CapacityMin: 6 << 20}, &eresp)
	must.Error(t, err)
	must.StrContains(t, err.Error(), "node "+f.nodeB.ID)
	must.StrContains(t, err.Error(), "expand again to retry")
	must.Eq(t, int64(6<<20), capacity())

	overlaps, err := hostpath.ReadOverlaps(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(0), overlaps)
}
