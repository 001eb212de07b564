package nomad

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// Expanding a volume follows Nomad's rule: a register or a create of a
// registered ID with a capacity_min above the volume's capacity grows the
// volume, and CSIVolume.Expand does the same for one size. The controller
// call runs in the plugin's lane, as every destructive one does. When the
// plugin answers that the node must grow the volume too, every node where
// a claim has it mounted is asked to, while it stays mounted, so a running
// task sees the new size without a restart. A volume never shrinks.

// errVolumeShrink refuses a size below a volume's capacity.
func errVolumeShrink(v *structs.CSIVolume, size int64) error {
	return fmt.Errorf("%w: volume %q is %d bytes; %d is smaller and a volume cannot shrink",
		structs.ErrInvalidRequest, v.ID, v.Capacity, size)
}

// needsExpand says whether next, an update of old, asks for a larger
// volume than old is: a capacity_min above a known capacity.
func needsExpand(old, next *structs.CSIVolume) bool {
	return old != nil && old.Capacity > 0 && next.CapacityMin > old.Capacity
}

// pluginCanExpand refuses a plugin none of whose controllers advertises
// EXPAND_VOLUME.
func pluginCanExpand(store *state.StateStore, pluginID string) error {
	p, err := store.CSIPluginByID(nil, pluginID)
	if err != nil {
		return err
	}
	if p == nil {
		return fmt.Errorf("%w: unknown plugin %q: no client reports it", structs.ErrInvalidRequest, pluginID)
	}
	for _, c := range p.Controllers {
		if c != nil && c.ControllerInfo != nil && c.ControllerInfo.SupportsExpand {
			return nil
		}
	}
	return fmt.Errorf("%w: plugin %q does not support expanding volumes (no controller advertises EXPAND_VOLUME)",
		structs.ErrInvalidRequest, pluginID)
}

// checkExpandingUpdate checks next, an update of old that asks for
// expansion, as if the expansion had happened: every other problem with
// the update is refused before the provider is asked for anything.
func checkExpandingUpdate(store *state.StateStore, old, next *structs.CSIVolume) error {
	if err := pluginCanExpand(store, old.PluginID); err != nil {
		return fmt.Errorf("volume %q: capacity_min %d is above its capacity %d: %w", old.ID, next.CapacityMin, old.Capacity, err)
	}
	grown := next.Copy()
	grown.Capacity = max(grown.Capacity, grown.CapacityMin)
	return checkVolumeUpdate(store, grown)
}

// Expand grows a registered volume to at least CapacityMin bytes. A size
// below the volume's capacity is refused and nothing is called; a size
// equal to it runs the expansion again (every step is idempotent), which
// finishes one whose node step failed.
func (c *CSIVolume) Expand(args *structs.CSIVolumeExpandRequest, reply *structs.CSIVolumeExpandResponse) error {
	if done, err := c.srv.forward("CSIVolume.Expand", args, args, reply); done {
		return err
	}
	if err := structs.ValidateID(structs.IDKindVolume, args.VolumeID); err != nil {
		return err
	}
	if args.CapacityMin <= 0 {
		return fmt.Errorf("%w: volume %q: the size to expand to must be above 0, not %d", structs.ErrInvalidRequest, args.VolumeID, args.CapacityMin)
	}
	if args.CapacityMin > structs.MaxVolumeCapacity {
		return fmt.Errorf("%w: volume %q: the size to expand to, %d, is more than %d bytes (1 EiB), which no provider offers",
			structs.ErrInvalidRequest, args.VolumeID, args.CapacityMin, int64(structs.MaxVolumeCapacity))
	}
	if args.CapacityMax < 0 || (args.CapacityMax > 0 && args.CapacityMax < args.CapacityMin) {
		return fmt.Errorf("%w: volume %q: capacity_min %d and capacity_max %d are not a valid range",
			structs.ErrInvalidRequest, args.VolumeID, args.CapacityMin, args.CapacityMax)
	}
	srv := c.srv
	store := srv.State()
	v, err := store.CSIVolumeByID(nil, structs.DefaultNamespace, args.VolumeID)
	if err != nil {
		return err
	}
	if v == nil {
		return fmt.Errorf("%w: volume %q", structs.ErrNotFound, args.VolumeID)
	}
	if args.CapacityMin < v.Capacity {
		return errVolumeShrink(v, args.CapacityMin)
	}
	if err := pluginCanExpand(store, v.PluginID); err != nil {
		return fmt.Errorf("volume %q: %w", v.ID, err)
	}
	ctx, cancel := srv.csiProvisionContext()
	defer cancel()
	vol, index, err := srv.expandVolume(ctx, v.ID, args.CapacityMin, args.CapacityMax, args.WriteRequest)
	if err != nil {
		return err
	}
	reply.Volume = vol.Sanitize()
	reply.Index = index
	return nil
}

// expandVolume grows volume id to at least min bytes (at most max, when
// set): ControllerExpandVolume in the plugin's lane, the new capacity and
// bounds recorded through Raft, then NodeExpandVolume on every node where
// a claim has the volume mounted, if the plugin asks for it. The capacity
// is recorded before the node step, since the provider's volume has grown
// whatever the nodes do; a node that fails makes the whole call fail, and
// expanding again to the same size retries it. It returns the volume as
// registered.
func (s *Server) expandVolume(ctx context.Context, id string, min, max int64, wr structs.WriteRequest) (*structs.CSIVolume, uint64, error) {
	var resp structs.ClientCSIControllerExpandVolumeResponse
	var vol *structs.CSIVolume
	pluginID, key := s.volumeLaneKey(id)
	err := s.onController(ctx, pluginID, "expand", key, &resp.CSIControllerReply, func(ctx context.Context, cn *structs.Node) error {
		// Read again inside the lane: what runs before in the lane (a
		// delete) may have changed the volume.
		cur, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, id)
		if err != nil {
			return err
		}
		if cur == nil {
			return fmt.Errorf("%w: volume %q", structs.ErrNotFound, id)
		}
		if min < cur.Capacity {
			return errVolumeShrink(cur, min)
		}
		vol = cur
		req := structs.ClientCSIControllerExpandVolumeRequest{
			PluginID: cur.PluginID, ExternalVolumeID: cur.ExternalID,
			CapacityMin: min, CapacityMax: max, Secrets: cur.Secrets, MountOptions: cur.MountOptions,
			CSIControllerQuery: controllerQuery(ctx, cn),
		}
		if len(cur.RequestedCapabilities) > 0 {
			req.Capability = cur.RequestedCapabilities[0]
		}
		return s.clientRPC(ctx, cn.ID, "ClientCSI.ControllerExpandVolume", &req, &resp)
	})
	if err != nil {
		return nil, 0, fmt.Errorf("expanding volume %q: %w", id, err)
	}
	if resp.CapacityBytes < min {
		return nil, 0, fmt.Errorf("expanding volume %q: plugin %q answered with %d bytes, below the %d asked for",
			id, vol.PluginID, resp.CapacityBytes, min)
	}
	grown := vol.Copy()
	grown.Capacity = resp.CapacityBytes
	grown.CapacityMin = min
	if max > 0 {
		grown.CapacityMax = max
	} else if grown.CapacityMax > 0 && grown.CapacityMax < grown.Capacity {
		grown.CapacityMax = 0
	}
	latest, index, err := s.registerVolume(grown, wr)
	if err != nil {
		s.logger.Warn("expanded volume could not be recorded; expand it again",
			"volume_id", id, "capacity_bytes", resp.CapacityBytes, "error", err)
		return nil, 0, fmt.Errorf("recording expanded volume %q: %w", id, err)
	}
	s.logger.Info("expanded volume at the provider", "volume_id", id, "capacity_bytes", resp.CapacityBytes,
		"node_expansion_required", resp.NodeExpansionRequired)
	if !resp.NodeExpansionRequired {
		return latest, index, nil
	}
	if err := s.nodeExpandClaims(ctx, latest, min, max); err != nil {
		return nil, 0, fmt.Errorf("expanding volume %q on its nodes (the provider's volume is %d bytes; expand again to retry): %w",
			id, resp.CapacityBytes, err)
	}
	return latest, index, nil
}

// volumeLaneKey is the plugin of volume id and the lane key of a call on
// it; "" and no key when it is not registered (the lane's call then finds
// it gone).
func (s *Server) volumeLaneKey(id string) (pluginID string, key laneadmit.Call) {
	v, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, id)
	if err != nil || v == nil {
		return "", laneadmit.Call{}
	}
	return v.PluginID, laneadmit.Call{Volume: laneadmit.VolumeKey(v.ExternalID)}
}

// nodeExpandClaims asks the client of every taken claim on vol to grow
// the volume it has mounted. A claim still publishing has not been staged
// yet, and its stage sees the grown volume; a claim being released is
// going away. Every node is tried; the errors are joined.
func (s *Server) nodeExpandClaims(ctx context.Context, vol *structs.CSIVolume, min, max int64) error {
	allocIDs := make([]string, 0, len(vol.Claims))
	for allocID, cl := range vol.Claims {
		if cl.State == structs.CSIVolumeClaimStateTaken {
			allocIDs = append(allocIDs, allocID)
		}
	}
	slices.Sort(allocIDs)
	var errs []error
	for _, allocID := range allocIDs {
		cl := vol.Claims[allocID]
		req := structs.ClientCSINodeExpandVolumeRequest{
			PluginID: vol.PluginID, VolumeID: vol.ID, ExternalID: vol.ExternalID, AllocID: allocID,
			CapacityMin: min, CapacityMax: max, AccessMode: cl.AccessMode, AttachmentMode: cl.AttachmentMode,
			MountOptions: vol.MountOptions,
		}
		var resp structs.ClientCSINodeExpandVolumeResponse
		if err := s.clientRPC(ctx, cl.NodeID, "ClientCSI.NodeExpandVolume", &req, &resp); err != nil {
			errs = append(errs, fmt.Errorf("node %s (allocation %s): %w", cl.NodeID, allocID, err))
			continue
		}
		s.logger.Info("expanded volume on its node", "volume_id", vol.ID, "node_id", cl.NodeID,
			"alloc_id", allocID, "expanded", resp.Expanded, "capacity_bytes", resp.CapacityBytes)
	}
	return errors.Join(errs...)
}

// expandForUpdates expands, one after another, the registered volumes
// that updates (registrations of IDs already registered, checked) ask to
// grow, and sets each such update's capacity to the grown size so that
// the registration that follows records it.
func (s *Server) expandForUpdates(updates []*structs.CSIVolume, wr structs.WriteRequest) error {
	store := s.State()
	ctx, cancel := s.csiProvisionContext()
	defer cancel()
	for _, u := range updates {
		old, err := store.CSIVolumeByID(nil, structs.DefaultNamespace, u.ID)
		if err != nil {
			return err
		}
		if !needsExpand(old, u) {
			continue
		}
		grown, _, err := s.expandVolume(ctx, u.ID, u.CapacityMin, u.CapacityMax, wr)
		if err != nil {
			return err
		}
		u.Capacity = grown.Capacity
	}
	return nil
}
