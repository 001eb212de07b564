package nomad

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// TestCSI_TopologyChecks: a registered volume is accessible where its
// spec requires; a claim from a node outside that is refused before the
// provider is called; bad topology input is refused; and the topology of
// a registered volume never changes.
func TestCSI_TopologyChecks(t *testing.T) {
	f := newCSIFixture(t)
	s := f.srv
	vol := testVolume("zonal")
	vol.ExternalID = f.volume(t, "backing").ExternalID
	vol.RequestedTopologies = &structs.CSITopologyRequest{Required: []*structs.CSITopology{{Segments: map[string]string{"zone": "b"}}}}
	var rresp structs.CSIVolumeRegisterResponse
	must.NoError(t, s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{vol}}, &rresp))
	got, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "zonal")
	must.NoError(t, err)
	must.SliceLen(t, 1, got.Topologies)
	must.Eq(t, "b", got.Topologies[0].Segments["zone"])

	// Node B reports no topology: outside zone b.
	a := f.alloc(t, f.nodeB.ID)
	_, err = f.claim("zonal", a.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), `volume "zonal" is accessible only in topology {zone=b}; the node is in {}`)
	got, err = s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "zonal")
	must.NoError(t, err)
	must.MapEmpty(t, got.Claims)

	moved := vol.Copy()
	moved.RequestedTopologies = &structs.CSITopologyRequest{Required: []*structs.CSITopology{{Segments: map[string]string{"zone": "a"}}}}
	moved.Topologies = nil
	err = s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{moved}}, &rresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "topologies cannot be changed")

	for _, bad := range []*structs.CSITopologyRequest{
		{Required: []*structs.CSITopology{{}}},
		{Preferred: []*structs.CSITopology{{Segments: map[string]string{"": "x"}}}},
	} {
		v := testVolume("bad")
		v.RequestedTopologies = bad
		err = s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{v}}, &rresp)
		must.ErrorIs(t, err, structs.ErrInvalidRequest)
	}

	// A node inside the topology passes the placement check.
	inB := &structs.CSIInfo{Healthy: true, NodeInfo: &structs.CSINodeInfo{AccessibleTopology: &structs.CSITopology{Segments: map[string]string{"zone": "b", "rack": "r1"}}}}
	must.EqOp(t, "", outsideTopology(got, inB))
	inA := &structs.CSIInfo{Healthy: true, NodeInfo: &structs.CSINodeInfo{AccessibleTopology: &structs.CSITopology{Segments: map[string]string{"zone": "a"}}}}
	must.StrContains(t, outsideTopology(got, inA), "the node is in {zone=a}")
}
