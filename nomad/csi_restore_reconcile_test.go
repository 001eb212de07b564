package nomad

import (
	"testing"

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
