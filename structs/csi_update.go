package structs

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Registering a volume under an ID that is already registered (by
// register, or by a create of an existing ID) updates the registration.
// The rules follow Nomad's documented `volume register` update rules,
// stricter where a change would let a live claim point at other storage
// or mount it differently from how it is mounted:
//
//   - namespace, plugin_id and external_id never change: they say which
//     storage the volume is. To point an ID at other storage, deregister
//     it (it must be unclaimed) and register again.
//   - snapshot_id and clone_id, what a created volume was made from, never
//     change; an update without them keeps the recorded ones.
//   - parameters never change. They are what the provider made the volume
//     with; a new value would describe a volume that does not exist. An
//     update without parameters keeps the registered ones.
//   - capacity, the size the provider reported, never shrinks (CSI cannot
//     shrink a volume), claimed or not. An update without a capacity keeps
//     the registered one. While the capacity is known, capacity_max may
//     not be set below it, and capacity_min may not be recorded above
//     it: a bound the volume does not meet would be a false record. A
//     register or create that raises capacity_min above it expands the
//     volume first (nomad/csi_volume_expand.go), through the plugin's
//     lane, when the plugin supports expansion; what is then recorded
//     carries the grown capacity. While it is unknown (0: a registered volume
//     no provider has sized) the bounds only describe the volume and may
//     change freely.
//   - while the volume has claims (in any state: a claim being released
//     still holds its attachment), no capability a claim uses may be
//     removed, and mount_options and context may not change: the node
//     plugin mounts with them, so a change would apply to the next mount
//     of a claim and not to the current one. Nomad documents the same for
//     mount_options; Roam adds context, which some plugins use to locate
//     the storage.
//   - name, secrets, capabilities no claim uses, and the capacity bounds
//     within the rules above may change at any time.

// InheritUnset fills in the fields an update may leave out to keep them
// as registered: capacity (which the HTTP API cannot carry on a register)
// and parameters. v is the update; old is the registered volume.
func (v *CSIVolume) InheritUnset(old *CSIVolume) {
	if v.Capacity == 0 {
		v.Capacity = old.Capacity
	}
	if len(v.Parameters) == 0 {
		v.Parameters = copyStringMap(old.Parameters)
	}
	// A register carries no source (see the sources' comment on
	// CSIVolume): it keeps the one the volume was created from.
	if v.SnapshotID == "" && v.CloneID == "" {
		v.SnapshotID, v.CloneID = old.SnapshotID, old.CloneID
	}
	if len(v.Topologies) == 0 {
		v.Topologies = CopyTopologies(old.Topologies)
	}
	if v.RequestedTopologies == nil {
		v.RequestedTopologies = old.RequestedTopologies.Copy()
	}
}

// CheckCSIVolumeUpdate reports whether next may replace old, the
// registered volume with the same ID, under the rules above. next is the
// update as it would be stored (after InheritUnset); its claims are
// ignored, since the store keeps old's. Every problem is named by its
// field, all of them joined in one error that wraps ErrInvalidRequest. It
// reads nothing but its arguments, so the leader checks a registration
// with it before proposing it and the state store again when applying it.
func CheckCSIVolumeUpdate(old, next *CSIVolume) error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if next.Namespace != old.Namespace {
		add("namespace cannot be changed from %q to %q", old.Namespace, next.Namespace)
	}
	if next.PluginID != old.PluginID {
		add("plugin_id cannot be changed from %q to %q", old.PluginID, next.PluginID)
	}
	if next.ExternalID != old.ExternalID {
		add("external_id cannot be changed from %q to %q", old.ExternalID, next.ExternalID)
	}
	if !maps.Equal(next.Parameters, old.Parameters) {
		add("parameters cannot be changed from %v to %v", old.Parameters, next.Parameters)
	}
	if next.SnapshotID != old.SnapshotID {
		add("snapshot_id cannot be changed from %q to %q: it is what the volume was created from", old.SnapshotID, next.SnapshotID)
	}
	if len(old.Topologies) > 0 && !TopologiesEqual(old.Topologies, next.Topologies) {
		add("topologies cannot be changed from %s to %s: they say where the storage is", TopologiesString(old.Topologies), TopologiesString(next.Topologies))
	}
	if next.CloneID != old.CloneID {
		add("clone_id cannot be changed from %q to %q: it is what the volume was created from", old.CloneID, next.CloneID)
	}

	if next.Capacity < old.Capacity {
		add("capacity cannot shrink from %d to %d", old.Capacity, next.Capacity)
	}
	if size := max(old.Capacity, next.Capacity); size > 0 {
		if next.CapacityMax > 0 && next.CapacityMax < size {
			add("capacity_max %d is below the volume's capacity %d: a volume cannot shrink", next.CapacityMax, size)
		}
		if next.CapacityMin > size {
			add("capacity_min %d is above the volume's capacity %d: the volume must be expanded first", next.CapacityMin, size)
		}
	}

	if len(old.Claims) > 0 {
		for _, c := range claimedCapabilities(old.Claims) {
			if !next.HasCapability(c.AccessMode, c.AttachmentMode) {
				add("capability %s/%s cannot be removed: %d claim(s) use it",
					c.AccessMode, c.AttachmentMode, c.claims)
			}
		}
		if !mountOptionsEqual(old.MountOptions, next.MountOptions) {
			add("mount_options cannot be changed while the volume has %d claim(s)", len(old.Claims))
		}
		if !maps.Equal(old.Context, next.Context) {
			add("context cannot be changed while the volume has %d claim(s)", len(old.Claims))
		}
	}

	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("volume %q: %w: %w", next.ID, ErrInvalidRequest, errors.Join(errs...))
}

// claimedCapability is a capability claims use, with how many use it.
type claimedCapability struct {
	CSIVolumeCapability
	claims int
}

// claimedCapabilities returns the capabilities claims use, in a stable
// order so that errors read the same every time.
func claimedCapabilities(claims map[string]*CSIVolumeClaim) []claimedCapability {
	counts := make(map[CSIVolumeCapability]int)
	for _, c := range claims {
		counts[CSIVolumeCapability{AccessMode: c.AccessMode, AttachmentMode: c.AttachmentMode}]++
	}
	out := make([]claimedCapability, 0, len(counts))
	for c, n := range counts {
		out = append(out, claimedCapability{CSIVolumeCapability: c, claims: n})
	}
	slices.SortFunc(out, func(a, b claimedCapability) int {
		return cmp.Or(cmp.Compare(a.AccessMode, b.AccessMode), cmp.Compare(a.AttachmentMode, b.AttachmentMode))
	})
	return out
}

// mountOptionsEqual compares mount options, no options being the same as
// empty ones.
func mountOptionsEqual(a, b *CSIMountOptions) bool {
	var none CSIMountOptions
	if a == nil {
		a = &none
	}
	if b == nil {
		b = &none
	}
	return a.FSType == b.FSType && slices.Equal(a.MountFlags, b.MountFlags)
}
