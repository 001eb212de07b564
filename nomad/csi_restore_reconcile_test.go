package nomad

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func TestDecidePublished(t *testing.T) {
	unused := &structs.ClientCSINodeVolumeUsersResponse{}
	running := &structs.ClientCSINodeVolumeUsersResponse{AllocIDs: []string{"a1"}}
	staged := &structs.ClientCSINodeVolumeUsersResponse{Staged: true}
	cases := []struct {
		name string
		in   publishedInput
		want publishedAction
	}{
		{"published and claimed", publishedInput{CanList: true, Registered: true, Claimed: true, NodeKnown: true}, publishedClaimed},
		{"published, unclaimed, no alloc", publishedInput{CanList: true, Registered: true, NodeKnown: true, Asked: true, Users: unused}, publishedUnpublish},
		{"published, unclaimed, running alloc", publishedInput{CanList: true, Registered: true, NodeKnown: true, Asked: true, Users: running}, publishedInUse},
		{"published, unclaimed, still staged", publishedInput{CanList: true, Registered: true, NodeKnown: true, Asked: true, Users: staged}, publishedInUse},
		{"plugin without the capability", publishedInput{Registered: true, NodeKnown: true, Asked: true, Users: unused}, publishedNotListed},
		{"node unreachable", publishedInput{CanList: true, Registered: true, NodeKnown: true, Asked: true, UsersErr: structs.ErrNodeNotConnected}, publishedAskAgain},
		{"node not asked", publishedInput{CanList: true, Registered: true, NodeKnown: true}, publishedAskAgain},
		{"volume not registered", publishedInput{CanList: true, NodeKnown: true, Asked: true, Users: unused}, publishedForeign},
		{"provider node no roam node reports", publishedInput{CanList: true, Registered: true}, publishedForeign},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.EqOp(t, tc.want, decidePublished(tc.in), must.Sprintf("got %s", decidePublished(tc.in)))
		})
	}
}

func TestCanListPublished(t *testing.T) {
	plugin := func(list, nodes, healthy bool) *structs.CSIPlugin {
		return &structs.CSIPlugin{ID: "p", Controllers: map[string]*structs.CSIInfo{"n1": {
			Healthy: healthy,
			ControllerInfo: &structs.CSIControllerInfo{
				SupportsListVolumes: list, SupportsListVolumesAttachedNodes: nodes,
			},
		}}}
	}
	must.True(t, canListPublished(plugin(true, true, true)))
	must.False(t, canListPublished(plugin(true, false, true)), must.Sprint("lists volumes but not their nodes"))
	must.False(t, canListPublished(plugin(false, true, true)))
	must.False(t, canListPublished(plugin(true, true, false)), must.Sprint("no healthy controller"))
	must.False(t, canListPublished(nil))
	must.False(t, canListPublished(&structs.CSIPlugin{ID: "p"}))
}

func TestClaimNamesNode(t *testing.T) {
	vol := &structs.CSIVolume{ID: "v", Claims: map[string]*structs.CSIVolumeClaim{
		"a1": {AllocationID: "a1", NodeID: "node-1", ExternalNodeID: "prov-1"},
	}}
	must.True(t, claimNamesNode(vol, "node-1", "prov-x"))
	must.True(t, claimNamesNode(vol, "", "prov-1"))
	must.False(t, claimNamesNode(vol, "node-2", "prov-2"))
	must.False(t, claimNamesNode(&structs.CSIVolume{ID: "v"}, "node-1", "prov-1"))
}

func TestPublishedAction_String(t *testing.T) {
	for a := publishedNotListed; a <= publishedUnpublish; a++ {
		must.StrNotContains(t, a.String(), "publishedAction(")
	}
}

// publishedTo lists the provider nodes ext is published to.
func (f *csiFixture) publishedTo(t *testing.T, ext string) []string {
	t.Helper()
	resp, err := f.plugin.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	must.NoError(t, err)
	for _, e := range resp.GetEntries() {
		if e.GetVolume().GetVolumeId() == ext {
			return e.GetStatus().GetPublishedNodeIds()
		}
	}
	t.Fatalf("volume %s not listed", ext)
	return nil
}

// publishDirect publishes ext to the provider node outside Roam.
func (f *csiFixture) publishDirect(t *testing.T, ext, providerNode string) {
	t.Helper()
	_, err := f.plugin.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{
		VolumeId: ext, NodeId: providerNode,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
	})
	must.NoError(t, err)
}

// A pass over the real hostpath plugin: an attachment no claim explains,
// on a node that uses nothing of it, is unpublished; one a claim explains
// is left alone.
func TestRestoreReconcile_Pass(t *testing.T) {
	f := newCSIFixture(t)
	p, err := f.srv.State().CSIPluginByID(nil, "hostpath")
	must.NoError(t, err)
	must.True(t, canListPublished(p), must.Sprint("the hostpath plugin's controller does not list published nodes"))

	stray := f.volume(t, "stray")
	kept := f.volume(t, "kept")
	f.publishDirect(t, stray.ExternalID, "node-a")
	a := f.alloc(t, f.nodeB.ID)
	_, err = f.claim(kept.ID, a.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.NoError(t, err)
	must.Eq(t, []string{"node-a"}, f.publishedTo(t, stray.ExternalID))
	must.Eq(t, []string{"node-b"}, f.publishedTo(t, kept.ExternalID))

	r := &restoreReconcile{s: f.srv, done: map[attachKey]bool{}}
	must.EqOp(t, 0, r.pass(context.Background()))
	must.SliceEmpty(t, f.publishedTo(t, stray.ExternalID))
	must.Eq(t, []string{"node-b"}, f.publishedTo(t, kept.ExternalID))
}

// The unpublish reads the claims again in the plugin's lane: a claim made
// for the node after the decision keeps the attachment.
func TestRestoreReconcile_ClaimAppearedInLane(t *testing.T) {
	f := newCSIFixture(t)
	vol := f.volume(t, "data") // as the decision saw it: no claim
	a := f.alloc(t, f.nodeB.ID)
	_, err := f.claim(vol.ID, a.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.NoError(t, err)
	must.Eq(t, []string{"node-b"}, f.publishedTo(t, vol.ExternalID))

	r := &restoreReconcile{s: f.srv, done: map[attachKey]bool{}}
	err = r.unpublish(context.Background(), vol, f.nodeB.ID, "node-b")
	must.ErrorIs(t, err, errClaimAppeared)
	must.Eq(t, []string{"node-b"}, f.publishedTo(t, vol.ExternalID))
}
