package structs

import (
	"testing"

	"github.com/shoenig/test/must"
)

func TestCheckCSIVolumeUpdate(t *testing.T) {
	const (
		snw = CSIAccessModeSingleNodeWriter
		snr = CSIAccessModeSingleNodeReader
		fs  = CSIAttachmentModeFilesystem
		blk = CSIAttachmentModeBlockDevice
	)
	registered := func() *CSIVolume {
		return &CSIVolume{
			ID: "v", Name: "v", Namespace: DefaultNamespace, PluginID: "hostpath", ExternalID: "ext-1",
			RequestedCapabilities: []*CSIVolumeCapability{{AccessMode: snw, AttachmentMode: fs}, {AccessMode: snr, AttachmentMode: fs}},
			MountOptions:          &CSIMountOptions{FSType: "ext4", MountFlags: []string{"noatime"}},
			Secrets:               map[string]string{"token": "a"},
			Parameters:            map[string]string{"type": "ssd"},
			Context:               map[string]string{"server": "10.0.0.1"},
			CapacityMin:           1024, CapacityMax: 4096, Capacity: 2048,
			Claims: map[string]*CSIVolumeClaim{},
		}
	}
	writer := &CSIVolumeClaim{AllocationID: "a1", NodeID: "n1", Mode: CSIVolumeClaimWrite,
		AccessMode: snw, AttachmentMode: fs, State: CSIVolumeClaimStateTaken}

	// Each case changes the registered volume into an update, and is
	// checked against the volume unclaimed and claimed by writer. An
	// empty want is an allowed update; otherwise every string must be in
	// the error.
	cases := []struct {
		name string
		// old changes the registered volume before the update is made
		// from it; nil leaves it.
		old            func(v *CSIVolume)
		update         func(v *CSIVolume)
		wantUnclaimed  []string
		wantClaimed    []string
		onlyWithClaims bool
	}{
		{name: "same volume", update: func(v *CSIVolume) {}},
		{name: "name", update: func(v *CSIVolume) { v.Name = "renamed" }},
		{name: "secrets", update: func(v *CSIVolume) { v.Secrets = map[string]string{"token": "b"} }},
		{name: "secrets removed", update: func(v *CSIVolume) { v.Secrets = nil }},
		{name: "namespace",
			update:        func(v *CSIVolume) { v.Namespace = "other" },
			wantUnclaimed: []string{`namespace cannot be changed from "default" to "other"`},
			wantClaimed:   []string{`namespace cannot be changed from "default" to "other"`}},
		{name: "plugin_id",
			update:        func(v *CSIVolume) { v.PluginID = "other-plugin" },
			wantUnclaimed: []string{`plugin_id cannot be changed from "hostpath" to "other-plugin"`},
			wantClaimed:   []string{`plugin_id cannot be changed from "hostpath" to "other-plugin"`}},
		{name: "external_id",
			update:        func(v *CSIVolume) { v.ExternalID = "ext-2" },
			wantUnclaimed: []string{`volume "v": invalid request: external_id cannot be changed from "ext-1" to "ext-2"`},
			wantClaimed:   []string{`volume "v": invalid request: external_id cannot be changed from "ext-1" to "ext-2"`}},
		{name: "parameters",
			update:        func(v *CSIVolume) { v.Parameters = map[string]string{"type": "hdd"} },
			wantUnclaimed: []string{"parameters cannot be changed from map[type:ssd] to map[type:hdd]"},
			wantClaimed:   []string{"parameters cannot be changed"}},
		{name: "parameters left out are kept", update: func(v *CSIVolume) { v.Parameters = nil }},
		{name: "capacity shrinks",
			update:        func(v *CSIVolume) { v.Capacity = 1024 },
			wantUnclaimed: []string{"capacity cannot shrink from 2048 to 1024"},
			wantClaimed:   []string{"capacity cannot shrink from 2048 to 1024"}},
		{name: "capacity left out is kept", update: func(v *CSIVolume) { v.Capacity = 0 }},
		{name: "capacity grows", update: func(v *CSIVolume) { v.Capacity = 8192; v.CapacityMax = 0 }},
		{name: "capacity_max below the capacity",
			update:        func(v *CSIVolume) { v.CapacityMax = 1500 },
			wantUnclaimed: []string{"capacity_max 1500 is below the volume's capacity 2048"},
			wantClaimed:   []string{"capacity_max 1500 is below the volume's capacity 2048"}},
		{name: "capacity_max raised", update: func(v *CSIVolume) { v.CapacityMax = 1 << 20 }},
		{name: "capacity_max unbounded", update: func(v *CSIVolume) { v.CapacityMax = 0 }},
		{name: "capacity_max down to the capacity", update: func(v *CSIVolume) { v.CapacityMax = 2048 }},
		{name: "capacity_min above the capacity",
			update:        func(v *CSIVolume) { v.CapacityMin = 3000 },
			wantUnclaimed: []string{"capacity_min 3000 is above the volume's capacity 2048"},
			wantClaimed:   []string{"capacity_min 3000 is above the volume's capacity 2048"}},
		{name: "capacity_min lowered", update: func(v *CSIVolume) { v.CapacityMin = 0 }},
		{name: "bounds of a volume of unknown capacity",
			old:    func(v *CSIVolume) { v.Capacity = 0 },
			update: func(v *CSIVolume) { v.CapacityMin, v.CapacityMax = 256, 512 }},
		{name: "capability in use removed",
			update:      func(v *CSIVolume) { v.RequestedCapabilities = v.RequestedCapabilities[1:] },
			wantClaimed: []string{"capability single-node-writer/file-system cannot be removed: 1 claim(s) use it"}},
		{name: "capability in use changes attachment mode",
			update:      func(v *CSIVolume) { v.RequestedCapabilities[0].AttachmentMode = blk },
			wantClaimed: []string{"capability single-node-writer/file-system cannot be removed"}},
		{name: "all capabilities removed",
			update:      func(v *CSIVolume) { v.RequestedCapabilities = nil },
			wantClaimed: []string{"capability single-node-writer/file-system cannot be removed"}},
		{name: "capability not in use removed", update: func(v *CSIVolume) { v.RequestedCapabilities = v.RequestedCapabilities[:1] }},
		{name: "capability added", update: func(v *CSIVolume) {
			v.RequestedCapabilities = append(v.RequestedCapabilities, &CSIVolumeCapability{AccessMode: snw, AttachmentMode: blk})
		}},
		{name: "mount_options",
			update:      func(v *CSIVolume) { v.MountOptions = &CSIMountOptions{FSType: "xfs"} },
			wantClaimed: []string{"mount_options cannot be changed while the volume has 1 claim(s)"}},
		{name: "mount_options removed",
			update:      func(v *CSIVolume) { v.MountOptions = nil },
			wantClaimed: []string{"mount_options cannot be changed"}},
		{name: "no mount_options is empty mount_options",
			old:    func(v *CSIVolume) { v.MountOptions = nil },
			update: func(v *CSIVolume) { v.MountOptions = &CSIMountOptions{} }},
		{name: "context",
			update:      func(v *CSIVolume) { v.Context = map[string]string{"server": "10.0.0.2"} },
			wantClaimed: []string{"context cannot be changed while the volume has 1 claim(s)"}},
		{name: "a claim being released still holds its capability",
			old: func(v *CSIVolume) {
				c := *writer
				c.AllocationID, c.State = "a0", CSIVolumeClaimStateNodeDetached
				v.Claims["a0"] = &c
			},
			update:         func(v *CSIVolume) { v.RequestedCapabilities = v.RequestedCapabilities[1:] },
			wantClaimed:    []string{"capability single-node-writer/file-system cannot be removed: 2 claim(s) use it"},
			onlyWithClaims: true},
		{name: "every problem is named",
			update: func(v *CSIVolume) {
				v.ExternalID, v.PluginID = "ext-2", "other-plugin"
				v.RequestedCapabilities = v.RequestedCapabilities[1:]
				v.MountOptions = nil
			},
			wantUnclaimed: []string{"plugin_id cannot be changed", "external_id cannot be changed"},
			wantClaimed: []string{"plugin_id cannot be changed", "external_id cannot be changed",
				"capability single-node-writer/file-system cannot be removed", "mount_options cannot be changed"}},
	}
	for _, tc := range cases {
		for _, claimed := range []bool{false, true} {
			if tc.onlyWithClaims && !claimed {
				continue
			}
			name := tc.name + "/unclaimed"
			want := tc.wantUnclaimed
			if claimed {
				name, want = tc.name+"/claimed", tc.wantClaimed
			}
			t.Run(name, func(t *testing.T) {
				old := registered()
				if claimed {
					c := *writer
					old.Claims[c.AllocationID] = &c
				}
				if tc.old != nil {
					tc.old(old)
				}
				// The update starts as a registration of the same volume,
				// as a caller sends it: no claims, no indexes.
				next := old.Copy()
				next.Claims, next.CreateIndex, next.ModifyIndex = nil, 0, 0
				tc.update(next)
				before := old.Copy()
				next.InheritUnset(old)
				err := CheckCSIVolumeUpdate(old, next)
				must.Eq(t, before, old, must.Sprint("the check changed the registered volume"))
				if len(want) == 0 {
					must.NoError(t, err)
					return
				}
				must.ErrorIs(t, err, ErrInvalidRequest)
				for _, w := range want {
					must.StrContains(t, err.Error(), w)
				}
				// Problems of the other state are not reported.
				if !claimed {
					for _, claimsOnly := range []string{"cannot be removed", "mount_options cannot", "context cannot"} {
						must.StrNotContains(t, err.Error(), claimsOnly)
					}
				}
			})
		}
	}
}

func TestCSIVolume_InheritUnset(t *testing.T) {
	old := &CSIVolume{Capacity: 2048, Parameters: map[string]string{"type": "ssd"}, Context: map[string]string{"k": "v"}}
	next := &CSIVolume{}
	next.InheritUnset(old)
	must.Eq(t, int64(2048), next.Capacity)
	must.Eq(t, map[string]string{"type": "ssd"}, next.Parameters)
	must.MapEmpty(t, next.Context, must.Sprint("context is declarative: left out, it is emptied"))
	next.Parameters["type"] = "hdd"
	must.Eq(t, "ssd", old.Parameters["type"], must.Sprint("inherited parameters are a copy"))

	set := &CSIVolume{Capacity: 4096, Parameters: map[string]string{"type": "hdd"}}
	set.InheritUnset(old)
	must.Eq(t, int64(4096), set.Capacity)
	must.Eq(t, "hdd", set.Parameters["type"])
}
