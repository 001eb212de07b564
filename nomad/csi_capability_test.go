package nomad

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// TestCSI_CapabilityChecks: expansion, restore and clone are refused by
// name for a plugin whose controllers do not advertise them, and allowed
// once one does.
func TestCSI_CapabilityChecks(t *testing.T) {
	st, err := state.NewStateStore()
	must.NoError(t, err)
	n := workNode("n1")
	info := &structs.CSIControllerInfo{SupportsCreateDelete: true}
	n.CSIControllerPlugins = map[string]*structs.CSIInfo{"p": {PluginID: "p", Healthy: true, ControllerInfo: info}}
	must.NoError(t, st.UpsertNode(1, n))

	err = pluginCanExpand(st, "p")
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), `plugin "p" does not support expanding volumes`)
	snap := &structs.CSIVolume{ID: "v", PluginID: "p", SnapshotID: "snap-1"}
	err = checkVolumeSource(st, snap)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "CREATE_DELETE_SNAPSHOT")
	clone := &structs.CSIVolume{ID: "v", PluginID: "p", CloneID: "vol-1"}
	err = checkVolumeSource(st, clone)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "CLONE_VOLUME")
	bad := &structs.CSIVolume{ID: "v", PluginID: "p", SnapshotID: "../x"}
	must.Error(t, checkVolumeSource(st, bad))

	n2 := n.Copy()
	n2.CSIControllerPlugins = map[string]*structs.CSIInfo{"p": {PluginID: "p", Healthy: true,
		ControllerInfo: &structs.CSIControllerInfo{SupportsExpand: true, SupportsCreateSnapshot: true, SupportsClone: true}}}
	must.NoError(t, st.UpsertNode(2, n2))
	must.NoError(t, pluginCanExpand(st, "p"))
	must.NoError(t, checkVolumeSource(st, snap))
	must.NoError(t, checkVolumeSource(st, clone))
}
