package nomad

import (
	"fmt"
	"sync"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

var (
	capSNW = &structs.CSIVolumeCapability{AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem}
	capSNR = &structs.CSIVolumeCapability{AccessMode: structs.CSIAccessModeSingleNodeReader, AttachmentMode: structs.CSIAttachmentModeFilesystem}
)

// updateFixture is a server with node n1 running two plugins, hostpath and
// other, and volume v1 of hostpath registered with two capabilities and
// mount options, claimed for writing by a running allocation.
type updateFixture struct {
	srv   *Server
	node  *structs.Node
	alloc *structs.Allocation
}

func newUpdateFixture(t *testing.T) *updateFixture {
	t.Helper()
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	n1 := csiNode("n1")
	n1.CSIControllerPlugins["other"] = &structs.CSIInfo{PluginID: "other", Healthy: true, Provider: "other.csi.roam.dev", RequiresControllerPlugin: true}
	n1.CSINodePlugins["other"] = &structs.CSIInfo{PluginID: "other", Healthy: true,
		NodeInfo: &structs.CSINodeInfo{ID: "n1", MaxVolumes: 16, RequiresNodeStageVolume: true}}
	registerNodeRetry(t, s, n1)

	var rresp structs.CSIVolumeRegisterResponse
	must.NoError(t, s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{updateVolume()}}, &rresp))
	registerJob(t, s, serviceJob("web", 1))
	alloc := waitAllocs(t, s, "web", countIs(1))[0]
	f := &updateFixture{srv: s, node: n1, alloc: alloc}
	f.setClaim(t, structs.CSIVolumeClaimStateTaken)
	return f
}

// updateVolume is v1 as registered, and the start of every update of it.
func updateVolume() *structs.CSIVolume {
	v := testVolume("v1")
	v.RequestedCapabilities = []*structs.CSIVolumeCapability{capSNW, capSNR}
	v.MountOptions = &structs.CSIMountOptions{FSType: "ext4", MountFlags: []string{"noatime"}}
	v.Parameters = map[string]string{"type": "ssd"}
	return v.Copy()
}

// setClaim checkpoints the allocation's write claim on v1 in state, ""
// freeing it.
func (f *updateFixture) setClaim(t *testing.T, state structs.CSIClaimState) {
	t.Helper()
	claim := &structs.CSIVolumeClaim{AllocationID: f.alloc.ID, NodeID: f.node.ID, ExternalNodeID: "n1",
		Mode: structs.CSIVolumeClaimWrite, AccessMode: capSNW.AccessMode, AttachmentMode: capSNW.AttachmentMode, State: state}
	_, _, err := f.srv.raftApply(structs.CSIVolumeClaimRequestType, &structs.CSIVolumeClaimUpdateRequest{
		Namespace: structs.DefaultNamespace, VolumeID: "v1", Claim: claim})
	must.NoError(t, err)
}

func (f *updateFixture) register(vols ...*structs.CSIVolume) error {
	var resp structs.CSIVolumeRegisterResponse
	return f.srv.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: vols}, &resp)
}

// stored reads v1 from the leader's state, secrets and all.
func (f *updateFixture) stored(t *testing.T) *structs.CSIVolume {
	t.Helper()
	v, err := f.srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, "v1")
	must.NoError(t, err)
	must.NotNil(t, v)
	return v
}

// read reads v1 as a client does, through CSIVolume.Get.
func (f *updateFixture) read(t *testing.T) *structs.CSIVolume {
	t.Helper()
	var get structs.CSIVolumeGetResponse
	must.NoError(t, f.srv.RPC("CSIVolume.Get", &structs.CSIVolumeGetRequest{ID: "v1"}, &get))
	must.NotNil(t, get.Volume)
	return get.Volume
}

// A registration of a claimed volume's ID that changes its identity, or
// what its claim relies on, is refused naming each offending field, and
// the volume reads back exactly as it was; an update within the rules
// goes through and keeps the claim.
func TestCSIVolume_RegisterUpdateClaimed(t *testing.T) {
	f := newUpdateFixture(t)
	before := f.stored(t)
	must.MapLen(t, 1, before.Claims)
	beforeRead := f.read(t)

	refused := []struct {
		name   string
		update func(v *structs.CSIVolume)
		want   []string
	}{
		{"external id", func(v *structs.CSIVolume) { v.ExternalID = "ext-other" },
			[]string{`volume "v1": invalid request: external_id cannot be changed from "ext-v1" to "ext-other"`}},
		{"plugin id", func(v *structs.CSIVolume) { v.PluginID = "other" },
			[]string{`volume "v1": invalid request: plugin_id cannot be changed from "hostpath" to "other"`}},
		{"access mode in use", func(v *structs.CSIVolume) { v.RequestedCapabilities = []*structs.CSIVolumeCapability{capSNR} },
			[]string{`volume "v1": invalid request: capability single-node-writer/file-system cannot be removed: 1 claim(s) use it`}},
		{"mount options", func(v *structs.CSIVolume) { v.MountOptions = &structs.CSIMountOptions{FSType: "xfs"} },
			[]string{"mount_options cannot be changed while the volume has 1 claim(s)"}},
		{"parameters", func(v *structs.CSIVolume) { v.Parameters = map[string]string{"type": "hdd"} },
			[]string{"parameters cannot be changed"}},
		{"everything at once", func(v *structs.CSIVolume) {
			v.ExternalID, v.PluginID = "ext-other", "other"
			v.RequestedCapabilities = []*structs.CSIVolumeCapability{capSNR}
		}, []string{"external_id cannot be changed", "plugin_id cannot be changed", "capability single-node-writer/file-system cannot be removed"}},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			v := updateVolume()
			tc.update(v)
			err := f.register(v)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			for _, w := range tc.want {
				must.StrContains(t, err.Error(), w)
			}
			must.Eq(t, before, f.stored(t), must.Sprint("a refused update changed the volume"))
			must.Eq(t, beforeRead, f.read(t))
			must.Eq(t, before.ModifyIndex, f.read(t).ModifyIndex)
		})
	}

	// A refused update in a batch stops the whole batch.
	bad := updateVolume()
	bad.ExternalID = "ext-other"
	err := f.register(testVolume("v2"), bad)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	v2, err := f.srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, "v2")
	must.NoError(t, err)
	must.Nil(t, v2)

	// Name, secrets and a capability no claim uses may change while it
	// is claimed; the claim stays.
	ok := updateVolume()
	ok.Name = "renamed"
	ok.Secrets = map[string]string{"token": "rotated"}
	ok.RequestedCapabilities = []*structs.CSIVolumeCapability{capSNW,
		{AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeBlockDevice}}
	must.NoError(t, f.register(ok))
	got := f.read(t)
	must.Eq(t, "renamed", got.Name)
	must.Eq(t, ok.RequestedCapabilities, got.RequestedCapabilities)
	must.Eq(t, before.ExternalID, got.ExternalID)
	must.Greater(t, before.ModifyIndex, got.ModifyIndex)
	must.Eq(t, before.CreateIndex, got.CreateIndex)
	must.Eq(t, before.Claims, got.Claims)
	must.Eq(t, "rotated", f.stored(t).Secrets["token"])

	// Once the claim is freed, new mount options go through and are
	// read back; the identity is still fixed.
	f.setClaim(t, "")
	mo := updateVolume()
	mo.MountOptions = &structs.CSIMountOptions{FSType: "xfs", MountFlags: []string{"noatime", "nodiratime"}}
	must.NoError(t, f.register(mo))
	got = f.read(t)
	must.Eq(t, mo.MountOptions, got.MountOptions)
	must.Eq(t, []*structs.CSIVolumeCapability{capSNW, capSNR}, got.RequestedCapabilities)
	other := updateVolume()
	other.ExternalID = "ext-other"
	err = f.register(other)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), `external_id cannot be changed from "ext-v1" to "ext-other"`)
	must.Eq(t, got, f.read(t))
}

// The state store applies the same rules: an update proposed without the
// endpoint's check (as one that raced past it would be) is refused when
// applied, leaving the volume as it was.
func TestCSIVolume_UpdateCheckedAtApply(t *testing.T) {
	f := newUpdateFixture(t)
	before := f.stored(t)

	for name, update := range map[string]func(v *structs.CSIVolume){
		"external id":        func(v *structs.CSIVolume) { v.ExternalID = "ext-other" },
		"plugin id":          func(v *structs.CSIVolume) { v.PluginID = "other" },
		"access mode in use": func(v *structs.CSIVolume) { v.RequestedCapabilities = []*structs.CSIVolumeCapability{capSNR} },
	} {
		t.Run(name, func(t *testing.T) {
			v := updateVolume()
			v.Namespace = structs.DefaultNamespace
			update(v)
			endpointErr := f.register(v.Copy())
			must.ErrorIs(t, endpointErr, structs.ErrInvalidRequest)
			_, _, err := f.srv.raftApply(structs.CSIVolumeRegisterRequestType, &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{v}})
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.EqError(t, err, endpointErr.Error(), must.Sprint("the store and the endpoint word the refusal alike"))
			must.Eq(t, before, f.stored(t))
		})
	}
}

// Registrations of one new ID with different external IDs, sent at once,
// leave exactly one registered: every other is an update of it that
// changes its external ID, refused by the endpoint or, for those that
// passed it before the first was applied, by the store.
func TestCSIVolume_RacingRegistrations(t *testing.T) {
	f := newUpdateFixture(t)
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := testVolume("race")
			v.ExternalID = fmt.Sprintf("ext-%d", i)
			<-start
			errs[i] = f.register(v)
		}()
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		if err == nil {
			must.Eq(t, -1, winner, must.Sprintf("registrations %d and %d both succeeded", winner, i))
			winner = i
			continue
		}
		must.ErrorIs(t, err, structs.ErrInvalidRequest)
		must.StrContains(t, err.Error(), "external_id cannot be changed")
	}
	must.NotEq(t, -1, winner)
	got, err := f.srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, "race")
	must.NoError(t, err)
	must.Eq(t, fmt.Sprintf("ext-%d", winner), got.ExternalID)
}
