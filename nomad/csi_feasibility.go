package nomad

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/roamhq/roam/scheduler"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// volumeChecker answers the scheduler's CSI feasibility questions from the
// same state snapshot the evaluation is scheduled against.
//
// It sees only claims already in state, not the other placements of the
// plan being built: two allocations of one evaluation asking for one
// single-writer volume may both pass here. Claim admission (CanClaim at
// claim time and again at Raft apply time) stays the authority; this check
// only keeps the scheduler from placing where a claim cannot succeed.
type volumeChecker struct {
	snap *state.StateSnapshot
	// namespace is the evaluated job's; volumes are looked up in it.
	namespace string
}

var _ scheduler.VolumeChecker = (*volumeChecker)(nil)

// volumeSource is the volume ID a request resolves to for the allocation
// with index allocIndex.
func volumeSource(req *structs.VolumeRequest, allocIndex int) string {
	if req.PerAlloc {
		return req.Source + fmt.Sprintf("[%d]", allocIndex)
	}
	return req.Source
}

// claimFor is the claim an allocation on node would make for req.
func claimFor(req *structs.VolumeRequest, nodeID string) *structs.CSIVolumeClaim {
	c := &structs.CSIVolumeClaim{
		NodeID:         nodeID,
		Mode:           structs.CSIVolumeClaimWrite,
		AccessMode:     req.AccessMode,
		AttachmentMode: req.AttachmentMode,
	}
	if req.ReadOnly {
		c.Mode = structs.CSIVolumeClaimRead
	}
	if c.AccessMode == "" {
		c.AccessMode = structs.CSIAccessModeSingleNodeWriter
	}
	if c.AttachmentMode == "" {
		c.AttachmentMode = structs.CSIAttachmentModeFilesystem
	}
	return c
}

// FeasibleVolumes implements scheduler.VolumeChecker. For each CSI volume
// the group requests, the volume must be registered, the node must run a
// healthy node instance of its plugin, the volume must have room for the
// claim, and the plugin's per-node volume limit (MaxVolumes) must not be
// exceeded. Claims of the allocation being replaced, and of allocations
// that are terminal or gone from state, count as free: their release is
// already under way and the volume watcher will finish it.
func (c *volumeChecker) FeasibleVolumes(node *structs.Node, tg *structs.TaskGroup, allocIndex int, replacing *structs.Allocation) (bool, string) {
	if len(tg.Volumes) == 0 {
		return true, ""
	}
	ns := c.namespace
	if ns == "" {
		ns = structs.DefaultNamespace
	}
	var replacingID string
	if replacing != nil {
		replacingID = replacing.ID
	}
	// newByPlugin collects, per plugin, the volumes this placement would
	// attach to the node, for the MaxVolumes check below.
	newByPlugin := make(map[string]map[string]bool)
	// Sorted, so the reason recorded for a rejection is stable.
	for _, name := range slices.Sorted(maps.Keys(tg.Volumes)) {
		req := tg.Volumes[name]
		if req == nil || req.Type != "csi" {
			continue
		}
		id := volumeSource(req, allocIndex)
		vol, err := c.snap.CSIVolumeByID(nil, ns, id)
		if err != nil {
			return false, fmt.Sprintf("volume %q: state read failed", id)
		}
		if vol == nil {
			return false, fmt.Sprintf("volume %q not registered", id)
		}
		info := node.CSINodePlugins[vol.PluginID]
		switch {
		case info == nil:
			return false, fmt.Sprintf("missing CSI node plugin %q", vol.PluginID)
		case !info.Healthy:
			return false, fmt.Sprintf("unhealthy CSI node plugin %q", vol.PluginID)
		}
		free := c.liveClaims(vol, replacingID)
		if err := free.CanClaim(claimFor(req, node.ID)); err != nil {
			if errors.Is(err, structs.ErrCSIMaxClaims) {
				return false, fmt.Sprintf("volume %q max claims reached", id)
			}
			return false, fmt.Sprintf("volume %q: %v", id, err)
		}
		if newByPlugin[vol.PluginID] == nil {
			newByPlugin[vol.PluginID] = make(map[string]bool)
		}
		newByPlugin[vol.PluginID][vol.Namespace+"/"+vol.ID] = true
	}
	for _, pluginID := range slices.Sorted(maps.Keys(newByPlugin)) {
		info := node.CSINodePlugins[pluginID]
		if info.NodeInfo == nil || info.NodeInfo.MaxVolumes <= 0 {
			continue
		}
		attached, err := c.attachedOnNode(node.ID, pluginID, replacingID)
		if err != nil {
			return false, fmt.Sprintf("CSI node plugin %q: state read failed", pluginID)
		}
		for key := range newByPlugin[pluginID] {
			attached[key] = true
		}
		if int64(len(attached)) > info.NodeInfo.MaxVolumes {
			return false, fmt.Sprintf("CSI node plugin %q max volumes reached", pluginID)
		}
	}
	return true, ""
}

// liveClaims returns vol, or a copy of it, holding only the claims that
// still count: not the replaced allocation's, not those of allocations
// that are terminal or no longer in state.
func (c *volumeChecker) liveClaims(vol *structs.CSIVolume, replacingID string) *structs.CSIVolume {
	var drop []string
	for allocID := range vol.Claims {
		if allocID == replacingID || c.releasing(allocID) {
			drop = append(drop, allocID)
		}
	}
	if len(drop) == 0 {
		return vol
	}
	cp := vol.Copy()
	for _, id := range drop {
		delete(cp.Claims, id)
	}
	return cp
}

// releasing reports whether the allocation's claims are on their way out.
func (c *volumeChecker) releasing(allocID string) bool {
	a, err := c.snap.AllocByID(nil, allocID)
	if err != nil {
		return false // unknown: keep counting the claim
	}
	return a == nil || a.TerminalStatus()
}

// attachedOnNode returns the plugin's volumes (namespace/ID) with a claim
// that still counts on the node.
func (c *volumeChecker) attachedOnNode(nodeID, pluginID, replacingID string) (map[string]bool, error) {
	vols, err := c.snap.CSIVolumesByPlugin(nil, pluginID)
	if err != nil {
		return nil, err
	}
	attached := make(map[string]bool)
	for _, v := range vols {
		for allocID, cl := range v.Claims {
			if cl.NodeID != nodeID || allocID == replacingID || c.releasing(allocID) {
				continue
			}
			attached[v.Namespace+"/"+v.ID] = true
			break
		}
	}
	return attached, nil
}
