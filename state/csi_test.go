package state

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func csiNode(id string, controller, node, healthy bool) *structs.Node {
	n := &structs.Node{ID: id, SecretID: "s-" + id, Name: id, Datacenter: "dc1", Status: structs.NodeStatusReady,
		CSIControllerPlugins: map[string]*structs.CSIInfo{}, CSINodePlugins: map[string]*structs.CSIInfo{}}
	if controller {
		n.CSIControllerPlugins["hostpath"] = &structs.CSIInfo{PluginID: "hostpath", Healthy: healthy, Provider: "hostpath.csi.roam.dev", RequiresControllerPlugin: true}
	}
	if node {
		n.CSINodePlugins["hostpath"] = &structs.CSIInfo{PluginID: "hostpath", Healthy: healthy, Provider: "hostpath.csi.roam.dev"}
	}
	return n
}

func TestStateStore_CSIPluginsFromNodes(t *testing.T) {
	s, err := NewStateStore()
	must.NoError(t, err)

	must.NoError(t, s.UpsertNode(1, csiNode("n1", true, true, true)))
	must.NoError(t, s.UpsertNode(2, csiNode("n2", false, true, false)))
	p, err := s.CSIPluginByID(nil, "hostpath")
	must.NoError(t, err)
	must.NotNil(t, p)
	must.Eq(t, 1, p.ControllersExpected)
	must.Eq(t, 1, p.ControllersHealthy)
	must.Eq(t, 2, p.NodesExpected)
	must.Eq(t, 1, p.NodesHealthy)
	must.True(t, p.ControllerRequired)
	must.Eq(t, "hostpath.csi.roam.dev", p.Provider)
	must.Eq(t, uint64(1), p.CreateIndex)

	// A new fingerprint replaces the node's instances: n1 loses its
	// controller and its node instance turns unhealthy.
	must.NoError(t, s.UpsertNode(3, csiNode("n1", false, true, false)))
	p, err = s.CSIPluginByID(nil, "hostpath")
	must.NoError(t, err)
	must.Eq(t, 0, p.ControllersExpected)
	must.Eq(t, 0, p.NodesHealthy)
	must.Eq(t, uint64(3), p.ModifyIndex)

	// Deregistering every node that had it removes the plugin.
	must.NoError(t, s.DeleteNodes(4, []string{"n1", "n2"}))
	p, err = s.CSIPluginByID(nil, "hostpath")
	must.NoError(t, err)
	must.Nil(t, p)
	idx, err := s.Index(TableCSIPlugins)
	must.NoError(t, err)
	must.Eq(t, uint64(4), idx)
}

func TestStateStore_CSIVolumeClaims(t *testing.T) {
	s, err := NewStateStore()
	must.NoError(t, err)
	vol := &structs.CSIVolume{ID: "v1", Namespace: structs.DefaultNamespace, PluginID: "hostpath", ExternalID: "ext-1",
		RequestedCapabilities: []*structs.CSIVolumeCapability{{AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem}}}
	must.NoError(t, s.UpsertCSIVolumes(5, []*structs.CSIVolume{vol}))

	claim := &structs.CSIVolumeClaim{AllocationID: "a1", NodeID: "n1", Mode: structs.CSIVolumeClaimWrite,
		AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
		State: structs.CSIVolumeClaimStatePublishing}
	must.NoError(t, s.UpdateCSIVolumeClaim(6, structs.DefaultNamespace, "v1", claim))
	taken := *claim
	taken.State = structs.CSIVolumeClaimStateTaken
	taken.PublishContext = map[string]string{"device": "/dev/roam00"}
	must.NoError(t, s.UpdateCSIVolumeClaim(7, structs.DefaultNamespace, "v1", &taken))

	// Re-registering the volume keeps its claims.
	update := vol.Copy()
	update.Name = "renamed"
	must.NoError(t, s.UpsertCSIVolumes(8, []*structs.CSIVolume{update}))
	got, err := s.CSIVolumeByID(nil, structs.DefaultNamespace, "v1")
	must.NoError(t, err)
	must.Eq(t, "renamed", got.Name)
	must.Eq(t, uint64(5), got.CreateIndex)
	must.MapLen(t, 1, got.Claims)
	must.Eq(t, structs.CSIVolumeClaimStateTaken, got.Claims["a1"].State)
	must.Eq(t, "/dev/roam00", got.Claims["a1"].PublishContext["device"])

	// An empty state frees the claim.
	must.NoError(t, s.UpdateCSIVolumeClaim(9, structs.DefaultNamespace, "v1", &structs.CSIVolumeClaim{AllocationID: "a1"}))
	got, err = s.CSIVolumeByID(nil, structs.DefaultNamespace, "v1")
	must.NoError(t, err)
	must.MapEmpty(t, got.Claims)

	byPlugin, err := s.CSIVolumesByPlugin(nil, "hostpath")
	must.NoError(t, err)
	must.Len(t, 1, byPlugin)
	must.ErrorIs(t, s.UpdateCSIVolumeClaim(10, structs.DefaultNamespace, "nope", claim), structs.ErrNotFound)
	must.ErrorIs(t, s.DeleteCSIVolumes(10, structs.DefaultNamespace, []string{"v1", "nope"}, false), structs.ErrNotFound)
	byPlugin, err = s.CSIVolumesByPlugin(nil, "hostpath")
	must.NoError(t, err)
	must.Len(t, 1, byPlugin, must.Sprint("a failed delete removes nothing"))
	must.NoError(t, s.DeleteCSIVolumes(10, structs.DefaultNamespace, []string{"v1"}, false))
	vols, err := s.CSIVolumes(nil, structs.DefaultNamespace, "")
	must.NoError(t, err)
	must.SliceEmpty(t, vols)
}

// The controller index follows each node's fingerprint: a node appears under
// a plugin while it runs a controller of it, healthy or not, and leaves when
// the controller goes or the node is deregistered.
func TestStateStore_NodesByCSIController(t *testing.T) {
	s, err := NewStateStore()
	must.NoError(t, err)
	ids := func(pluginID string) []string {
		nodes, err := s.NodesByCSIController(nil, pluginID)
		must.NoError(t, err)
		out := []string{}
		for _, n := range nodes {
			out = append(out, n.ID)
		}
		return out
	}

	must.NoError(t, s.UpsertNode(1, csiNode("n3", true, true, true)))
	must.NoError(t, s.UpsertNode(2, csiNode("n1", true, false, false)))
	must.NoError(t, s.UpsertNode(3, csiNode("n2", false, true, true)))
	must.Eq(t, []string{"n1", "n3"}, ids("hostpath"))
	must.Eq(t, []string{}, ids("other"))
	must.Eq(t, []string{}, ids("host"), must.Sprint("a prefix of a plugin ID matches nothing"))

	must.NoError(t, s.UpsertNode(4, csiNode("n3", false, true, true)))
	must.Eq(t, []string{"n1"}, ids("hostpath"))
	must.NoError(t, s.DeleteNodes(5, []string{"n1"}))
	must.Eq(t, []string{}, ids("hostpath"))
}

// An update is checked when it is applied: one that changes a volume's
// identity, or removes a capability a claim uses, is refused with the
// leader's error, and nothing of its batch is written. A claim applied
// between the leader's check and the update's apply is what the check
// sees.
func TestStateStore_CSIVolumeUpdateRefused(t *testing.T) {
	s, err := NewStateStore()
	must.NoError(t, err)
	snw := &structs.CSIVolumeCapability{AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem}
	snr := &structs.CSIVolumeCapability{AccessMode: structs.CSIAccessModeSingleNodeReader, AttachmentMode: structs.CSIAttachmentModeFilesystem}
	vol := &structs.CSIVolume{ID: "v1", Namespace: structs.DefaultNamespace, PluginID: "hostpath", ExternalID: "ext-1",
		RequestedCapabilities: []*structs.CSIVolumeCapability{snw, snr}, Parameters: map[string]string{"type": "ssd"}, Capacity: 2048}
	must.NoError(t, s.UpsertCSIVolumes(5, []*structs.CSIVolume{vol}))

	// The update the leader checked while the volume had no claim.
	dropWriter := vol.Copy()
	dropWriter.RequestedCapabilities = []*structs.CSIVolumeCapability{snr}
	dropWriter.Capacity, dropWriter.Parameters = 0, nil // left out: kept
	checked := dropWriter.Copy()
	checked.InheritUnset(vol)
	must.NoError(t, structs.CheckCSIVolumeUpdate(vol, checked))

	// A claim in single-node-writer mode lands first.
	claim := &structs.CSIVolumeClaim{AllocationID: "a1", NodeID: "n1", Mode: structs.CSIVolumeClaimWrite,
		AccessMode: snw.AccessMode, AttachmentMode: snw.AttachmentMode, State: structs.CSIVolumeClaimStatePublishing}
	must.NoError(t, s.UpdateCSIVolumeClaim(6, structs.DefaultNamespace, "v1", claim))
	claimed, err := s.CSIVolumeByID(nil, structs.DefaultNamespace, "v1")
	must.NoError(t, err)

	otherExt := vol.Copy()
	otherExt.ExternalID = "ext-2"
	fresh := &structs.CSIVolume{ID: "v2", Namespace: structs.DefaultNamespace, PluginID: "hostpath", ExternalID: "ext-v2",
		RequestedCapabilities: []*structs.CSIVolumeCapability{snw}}
	for name, tc := range map[string]struct {
		update *structs.CSIVolume
		want   string
	}{
		"capability in use": {dropWriter, `volume "v1": invalid request: capability single-node-writer/file-system cannot be removed: 1 claim(s) use it`},
		"external id":       {otherExt, `volume "v1": invalid request: external_id cannot be changed from "ext-1" to "ext-2"`},
	} {
		t.Run(name, func(t *testing.T) {
			err := s.UpsertCSIVolumes(7, []*structs.CSIVolume{fresh, tc.update})
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.EqError(t, err, tc.want)

			got, err := s.CSIVolumeByID(nil, structs.DefaultNamespace, "v1")
			must.NoError(t, err)
			must.Eq(t, claimed, got, must.Sprint("a refused update changed the volume"))
			must.Eq(t, uint64(6), got.ModifyIndex)
			other, err := s.CSIVolumeByID(nil, structs.DefaultNamespace, "v2")
			must.NoError(t, err)
			must.Nil(t, other, must.Sprint("the batch's other volume was written"))
			idx, err := s.Index(TableCSIVolumes)
			must.NoError(t, err)
			must.Eq(t, uint64(6), idx)
		})
	}

	// Once the claim is freed the same update applies, keeping what it
	// left out.
	must.NoError(t, s.UpdateCSIVolumeClaim(8, structs.DefaultNamespace, "v1", &structs.CSIVolumeClaim{AllocationID: "a1"}))
	must.NoError(t, s.UpsertCSIVolumes(9, []*structs.CSIVolume{dropWriter}))
	got, err := s.CSIVolumeByID(nil, structs.DefaultNamespace, "v1")
	must.NoError(t, err)
	must.Eq(t, []*structs.CSIVolumeCapability{snr}, got.RequestedCapabilities)
	must.Eq(t, int64(2048), got.Capacity)
	must.Eq(t, "ssd", got.Parameters["type"])
	must.Eq(t, uint64(9), got.ModifyIndex)
	must.Eq(t, uint64(5), got.CreateIndex)
}

// A claim reserved between the leader's check and the apply of a
// deregistration is not dropped with its volume; with force, only claims
// whose tasks are known to be gone may be.
func TestStateStore_DeleteCSIVolumesKeepsLiveClaims(t *testing.T) {
	s, err := NewStateStore()
	must.NoError(t, err)
	node := &structs.Node{ID: "n1", SecretID: "s1", Status: structs.NodeStatusReady}
	must.NoError(t, s.UpsertNode(1, node))
	alloc := &structs.Allocation{ID: "a1", Namespace: structs.DefaultNamespace, JobID: "j", NodeID: "n1",
		DesiredStatus: structs.AllocDesiredStatusStop, ClientStatus: structs.AllocClientStatusRunning}
	must.NoError(t, s.UpsertAllocs(2, []*structs.Allocation{alloc}))
	vol := &structs.CSIVolume{ID: "v1", Namespace: structs.DefaultNamespace, PluginID: "hostpath", ExternalID: "ext-1",
		RequestedCapabilities: []*structs.CSIVolumeCapability{{AccessMode: structs.CSIAccessModeSingleNodeWriter,
			AttachmentMode: structs.CSIAttachmentModeFilesystem}}}
	must.NoError(t, s.UpsertCSIVolumes(5, []*structs.CSIVolume{vol}))
	must.NoError(t, s.UpdateCSIVolumeClaim(6, structs.DefaultNamespace, "v1", &structs.CSIVolumeClaim{
		AllocationID: "a1", NodeID: "n1", Mode: structs.CSIVolumeClaimWrite,
		AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
		State: structs.CSIVolumeClaimStatePublishing}))

	err = s.DeleteCSIVolumes(7, structs.DefaultNamespace, []string{"v1"}, false)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "has 1 claim")
	// Asked to stop is not gone: force refuses too.
	err = s.DeleteCSIVolumes(7, structs.DefaultNamespace, []string{"v1"}, true)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "allocation a1")
	got, err := s.CSIVolumeByID(nil, structs.DefaultNamespace, "v1")
	must.NoError(t, err)
	must.NotNil(t, got)
	must.EqOp(t, uint64(6), got.ModifyIndex)

	done := alloc.Copy()
	done.ClientStatus = structs.AllocClientStatusComplete
	must.NoError(t, s.UpdateAllocsFromClient(8, []*structs.Allocation{done}))
	must.NoError(t, s.DeleteCSIVolumes(9, structs.DefaultNamespace, []string{"v1"}, true))
	got, err = s.CSIVolumeByID(nil, structs.DefaultNamespace, "v1")
	must.NoError(t, err)
	must.Nil(t, got)
}

func TestControllerConcurrency(t *testing.T) {
	healthy := func(n int) *structs.CSIInfo { return &structs.CSIInfo{Healthy: true, ControllerConcurrency: n} }
	sick := func(n int) *structs.CSIInfo { return &structs.CSIInfo{ControllerConcurrency: n} }
	cases := []struct {
		name        string
		controllers map[string]*structs.CSIInfo
		want        int
		warning     string
	}{
		{"no controllers", nil, 1, ""},
		{"none healthy", map[string]*structs.CSIInfo{"a": sick(8)}, 1, ""},
		{"an older client reports 0, which is 1", map[string]*structs.CSIInfo{"a": healthy(0)}, 1, ""},
		{"one controller", map[string]*structs.CSIInfo{"a": healthy(8)}, 8, ""},
		{"all agree", map[string]*structs.CSIInfo{"a": healthy(4), "b": healthy(4)}, 4, ""},
		{"an unhealthy one does not count", map[string]*structs.CSIInfo{"a": healthy(4), "b": sick(1)}, 4, ""},
		{"the smallest wins, with a warning", map[string]*structs.CSIInfo{"a": healthy(16), "b": healthy(2), "c": healthy(16)}, 2,
			"controllers disagree on controller_concurrency: 2 on node b, 16 on node a; using 2"},
		{"a report above the bound is the bound", map[string]*structs.CSIInfo{"a": healthy(1000)}, 64, ""},
		{"an older client holds a mixed plugin to 1", map[string]*structs.CSIInfo{"a": healthy(0), "b": healthy(8)}, 1,
			"controllers disagree on controller_concurrency: 1 on node a, 8 on node b; using 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, warning := controllerConcurrency(tc.controllers)
			must.Eq(t, tc.want, got)
			must.Eq(t, tc.warning, warning)
		})
	}
}
