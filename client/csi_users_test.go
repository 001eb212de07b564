package client

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func TestCSIVolumeManager_Users(t *testing.T) {
	m := newCSIVolumeManager(csiVolumeManagerConfig{DataDir: t.TempDir()})
	ids, staged := m.users("p", "v")
	must.SliceEmpty(t, ids)
	must.False(t, staged)

	m.allocs["a2"] = map[string]*csiAllocMount{"data": {PluginID: "p", VolumeID: "v"}}
	m.allocs["a3"] = map[string]*csiAllocMount{"data": {PluginID: "p", VolumeID: "other"}}
	m.allocs["a4"] = map[string]*csiAllocMount{"data": {PluginID: "q", VolumeID: "v"}}
	u := &csiVolumeUse{sem: make(chan struct{}, 1), users: map[string]bool{"a1": true}, staged: true}
	m.volumes["p/v"] = u
	ids, staged = m.users("p", "v")
	must.Eq(t, []string{"a1", "a2"}, ids)
	must.True(t, staged)

	// Staged with no user left is still in use.
	u.users = map[string]bool{}
	delete(m.allocs, "a2")
	ids, staged = m.users("p", "v")
	must.SliceEmpty(t, ids)
	must.True(t, staged)
	must.True(t, (&structs.ClientCSINodeVolumeUsersResponse{AllocIDs: ids, Staged: staged}).InUse())

	// A volume whose turn another operation holds (a mount or unmount in
	// progress) counts as staged rather than being read under a race.
	u.staged = false
	u.sem <- struct{}{}
	_, staged = m.users("p", "v")
	must.True(t, staged)
	<-u.sem
	_, staged = m.users("p", "v")
	must.False(t, staged)
	must.False(t, (&structs.ClientCSINodeVolumeUsersResponse{}).InUse())
}
