package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/structs"
)

// ClientCSI is the RPC service servers call on this client to reach its
// CSI plugins. Controller methods go through the plugin's lane (see
// csiLane): one call at a time per plugin, in arrival order, each allowed
// to finish whatever happens to the server that sent it. A plugin this
// client does not run is an error wrapping structs.ErrCSIPluginNotFound.
type ClientCSI struct {
	mgr  *csiManager
	vols *csiVolumeManager // nil when the client mounts no CSI volumes
}

// ControllerAttachVolume attaches a volume to a node (ControllerPublishVolume).
func (e *ClientCSI) ControllerAttachVolume(args *structs.ClientCSIControllerAttachVolumeRequest, reply *structs.ClientCSIControllerAttachVolumeResponse) error {
	return e.controllerAttachVolume(context.Background(), args, reply)
}

func (e *ClientCSI) controllerAttachVolume(ctx context.Context, args *structs.ClientCSIControllerAttachVolumeRequest, reply *structs.ClientCSIControllerAttachVolumeResponse) error {
	if args.VolumeID == "" || args.ClientCSINodeID == "" {
		return fmt.Errorf("%w: volume ID and node ID are required", structs.ErrCSIInvalidArgument)
	}
	vc, err := csiVolumeCapability(args.AccessMode, args.AttachmentMode, args.MountOptions)
	if err != nil {
		return err
	}
	req := &csi.ControllerPublishVolumeRequest{
		VolumeId:         args.VolumeID,
		NodeId:           args.ClientCSINodeID,
		VolumeCapability: vc,
		Readonly:         args.ReadOnly,
		Secrets:          args.Secrets,
		VolumeContext:    args.VolumeContext,
	}
	key := laneadmit.Call{Volume: laneadmit.VolumeKey(args.VolumeID), Node: args.ClientCSINodeID}
	return e.mgr.controllerCall(ctx, args.PluginID, "ControllerPublishVolume", args.CSIControllerQuery, key, &reply.CSIControllerReply, func(ctx context.Context, p *csiPluginClient) error {
		resp, err := p.ControllerPublishVolume(ctx, req)
		if err != nil {
			return err
		}
		reply.PublishContext = resp.GetPublishContext()
		return nil
	})
}

// ControllerDetachVolume detaches a volume from a node
// (ControllerUnpublishVolume). Detaching what is not attached succeeds.
func (e *ClientCSI) ControllerDetachVolume(args *structs.ClientCSIControllerDetachVolumeRequest, reply *structs.ClientCSIControllerDetachVolumeResponse) error {
	return e.controllerDetachVolume(context.Background(), args, reply)
}

func (e *ClientCSI) controllerDetachVolume(ctx context.Context, args *structs.ClientCSIControllerDetachVolumeRequest, reply *structs.ClientCSIControllerDetachVolumeResponse) error {
	if args.VolumeID == "" {
		return fmt.Errorf("%w: volume ID is required", structs.ErrCSIInvalidArgument)
	}
	req := &csi.ControllerUnpublishVolumeRequest{VolumeId: args.VolumeID, NodeId: args.ClientCSINodeID, Secrets: args.Secrets}
	key := laneadmit.Call{Volume: laneadmit.VolumeKey(args.VolumeID), Node: args.ClientCSINodeID}
	return e.mgr.controllerCall(ctx, args.PluginID, "ControllerUnpublishVolume", args.CSIControllerQuery, key, &reply.CSIControllerReply, func(ctx context.Context, p *csiPluginClient) error {
		_, err := p.ControllerUnpublishVolume(ctx, req)
		if errors.Is(err, structs.ErrCSINotFound) {
			// The spec's NOT_FOUND here means the volume or node is gone:
			// nothing is attached.
			return nil
		}
		return err
	})
}

// ControllerCreateVolume creates a volume.
func (e *ClientCSI) ControllerCreateVolume(args *structs.ClientCSIControllerCreateVolumeRequest, reply *structs.ClientCSIControllerCreateVolumeResponse) error {
	return e.controllerCreateVolume(context.Background(), args, reply)
}

func (e *ClientCSI) controllerCreateVolume(ctx context.Context, args *structs.ClientCSIControllerCreateVolumeRequest, reply *structs.ClientCSIControllerCreateVolumeResponse) error {
	caps, err := csiVolumeCapabilities(args.Capabilities, args.MountOptions)
	if err != nil {
		return err
	}
	req := &csi.CreateVolumeRequest{
		Name:               args.Name,
		VolumeCapabilities: caps,
		Parameters:         args.Parameters,
		Secrets:            args.Secrets,
	}
	if args.CapacityMin > 0 || args.CapacityMax > 0 {
		req.CapacityRange = &csi.CapacityRange{RequiredBytes: args.CapacityMin, LimitBytes: args.CapacityMax}
	}
	switch {
	case args.SnapshotID != "" && args.CloneID != "":
		return fmt.Errorf("%w: a volume has one source: snapshot %q or clone %q", structs.ErrCSIInvalidArgument, args.SnapshotID, args.CloneID)
	case args.SnapshotID != "":
		req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: args.SnapshotID}}}
	case args.CloneID != "":
		req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: args.CloneID}}}
	}
	if t := args.Topologies; t != nil && (len(t.Required) > 0 || len(t.Preferred) > 0) {
		req.AccessibilityRequirements = &csi.TopologyRequirement{}
		for _, x := range t.Required {
			req.AccessibilityRequirements.Requisite = append(req.AccessibilityRequirements.Requisite, &csi.Topology{Segments: x.Segments})
		}
		for _, x := range t.Preferred {
			req.AccessibilityRequirements.Preferred = append(req.AccessibilityRequirements.Preferred, &csi.Topology{Segments: x.Segments})
		}
	}
	key := laneadmit.Create(args.Name, args.SnapshotID, args.CloneID)
	return e.mgr.controllerCall(ctx, args.PluginID, "CreateVolume", args.CSIControllerQuery, key, &reply.CSIControllerReply, func(ctx context.Context, p *csiPluginClient) error {
		if args.SnapshotID != "" && args.CapacityMin == 0 {
			if err := sizeFromSnapshot(ctx, p, args, req); err != nil {
				return err
			}
		}
		resp, err := p.CreateVolume(ctx, req)
		if err != nil {
			return err
		}
		v := resp.GetVolume()
		reply.ExternalVolumeID = v.GetVolumeId()
		reply.CapacityBytes = v.GetCapacityBytes()
		reply.VolumeContext = v.GetVolumeContext()
		reply.Topologies = reply.Topologies[:0]
		for _, t := range v.GetAccessibleTopology() {
			reply.Topologies = append(reply.Topologies, &structs.CSITopology{Segments: t.GetSegments()})
		}
		return nil
	})
}

// sizeFromSnapshot asks, for a create from a snapshot with no
// capacity_min, for the snapshot's size rather than for 0 bytes, which
// most providers refuse as smaller than the snapshot. The size comes from
// the plugin's ListSnapshots, in the same lane slot as the create. A
// plugin without ListSnapshots is asked as before and decides itself; a
// snapshot larger than capacity_max is refused here, naming both sizes.
func sizeFromSnapshot(ctx context.Context, p *csiPluginClient, args *structs.ClientCSIControllerCreateVolumeRequest, req *csi.CreateVolumeRequest) error {
	resp, err := p.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: args.SnapshotID, Secrets: args.Secrets})
	if errors.Is(err, structs.ErrCSIUnimplemented) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sizing volume %q from snapshot %q: %w", args.Name, args.SnapshotID, err)
	}
	var size int64 = -1
	for _, ent := range resp.GetEntries() {
		if snap := ent.GetSnapshot(); snap.GetSnapshotId() == args.SnapshotID {
			size = snap.GetSizeBytes()
		}
	}
	switch {
	case size < 0:
		return fmt.Errorf("%w: snapshot %q: plugin %q lists no such snapshot", structs.ErrCSINotFound, args.SnapshotID, args.PluginID)
	case size == 0:
		// The plugin does not know the size (the spec's 0); it decides.
		return nil
	case args.CapacityMax > 0 && size > args.CapacityMax:
		return fmt.Errorf("%w: snapshot %q is %d bytes, more than capacity_max %d", structs.ErrCSIInvalidArgument, args.SnapshotID, size, args.CapacityMax)
	}
	req.CapacityRange = &csi.CapacityRange{RequiredBytes: size, LimitBytes: args.CapacityMax}
	return nil
}

// ControllerDeleteVolume deletes a volume. Deleting an unknown volume
// succeeds.
func (e *ClientCSI) ControllerDeleteVolume(args *structs.ClientCSIControllerDeleteVolumeRequest, reply *structs.ClientCSIControllerDeleteVolumeResponse) error {
	return e.controllerDeleteVolume(context.Background(), args, reply)
}

func (e *ClientCSI) controllerDeleteVolume(ctx context.Context, args *structs.ClientCSIControllerDeleteVolumeRequest, reply *structs.ClientCSIControllerDeleteVolumeResponse) error {
	req := &csi.DeleteVolumeRequest{VolumeId: args.ExternalVolumeID, Secrets: args.Secrets}
	key := laneadmit.Call{Volume: laneadmit.VolumeKey(args.ExternalVolumeID)}
	return e.mgr.controllerCall(ctx, args.PluginID, "DeleteVolume", args.CSIControllerQuery, key, &reply.CSIControllerReply, func(ctx context.Context, p *csiPluginClient) error {
		_, err := p.DeleteVolume(ctx, req)
		if errors.Is(err, structs.ErrCSINotFound) {
			return nil
		}
		return err
	})
}

// ControllerValidateVolume checks that a volume supports the capabilities;
// one that does not is an error wrapping ErrCSIInvalidArgument.
func (e *ClientCSI) ControllerValidateVolume(args *structs.ClientCSIControllerValidateVolumeRequest, reply *structs.ClientCSIControllerValidateVolumeResponse) error {
	return e.controllerValidateVolume(context.Background(), args, reply)
}

func (e *ClientCSI) controllerValidateVolume(ctx context.Context, args *structs.ClientCSIControllerValidateVolumeRequest, _ *structs.ClientCSIControllerValidateVolumeResponse) error {
	caps, err := csiVolumeCapabilities(args.Capabilities, args.MountOptions)
	if err != nil {
		return err
	}
	req := &csi.ValidateVolumeCapabilitiesRequest{
		VolumeId:           args.VolumeID,
		VolumeCapabilities: caps,
		Parameters:         args.Parameters,
		VolumeContext:      args.Context,
		Secrets:            args.Secrets,
	}
	return e.mgr.controllerCall(ctx, args.PluginID, "ValidateVolumeCapabilities", args.CSIControllerQuery, laneadmit.Call{}, nil, func(ctx context.Context, p *csiPluginClient) error {
		resp, err := p.ValidateVolumeCapabilities(ctx, req)
		if err != nil {
			return err
		}
		if resp.GetConfirmed() == nil {
			return fmt.Errorf("%w: volume %s: capabilities not confirmed: %s", structs.ErrCSIInvalidArgument, args.VolumeID, resp.GetMessage())
		}
		return nil
	})
}

// ControllerCreateSnapshot snapshots a volume.
func (e *ClientCSI) ControllerCreateSnapshot(args *structs.ClientCSIControllerCreateSnapshotRequest, reply *structs.ClientCSIControllerCreateSnapshotResponse) error {
	return e.controllerCreateSnapshot(context.Background(), args, reply)
}

func (e *ClientCSI) controllerCreateSnapshot(ctx context.Context, args *structs.ClientCSIControllerCreateSnapshotRequest, reply *structs.ClientCSIControllerCreateSnapshotResponse) error {
	req := &csi.CreateSnapshotRequest{
		SourceVolumeId: args.ExternalVolumeID,
		Name:           args.Name,
		Parameters:     args.Parameters,
		Secrets:        args.Secrets,
	}
	key := laneadmit.Call{Volume: laneadmit.VolumeKey(args.ExternalVolumeID)}
	return e.mgr.controllerCall(ctx, args.PluginID, "CreateSnapshot", args.CSIControllerQuery, key, &reply.CSIControllerReply, func(ctx context.Context, p *csiPluginClient) error {
		resp, err := p.CreateSnapshot(ctx, req)
		if err != nil {
			return err
		}
		reply.Snapshot = csiSnapshot(args.PluginID, resp.GetSnapshot())
		return nil
	})
}

// ControllerDeleteSnapshot deletes a snapshot. Deleting an unknown
// snapshot succeeds.
func (e *ClientCSI) ControllerDeleteSnapshot(args *structs.ClientCSIControllerDeleteSnapshotRequest, reply *structs.ClientCSIControllerDeleteSnapshotResponse) error {
	return e.controllerDeleteSnapshot(context.Background(), args, reply)
}

func (e *ClientCSI) controllerDeleteSnapshot(ctx context.Context, args *structs.ClientCSIControllerDeleteSnapshotRequest, reply *structs.ClientCSIControllerDeleteSnapshotResponse) error {
	req := &csi.DeleteSnapshotRequest{SnapshotId: args.ID, Secrets: args.Secrets}
	key := laneadmit.Call{Volume: laneadmit.SnapshotKey(args.ID)}
	return e.mgr.controllerCall(ctx, args.PluginID, "DeleteSnapshot", args.CSIControllerQuery, key, &reply.CSIControllerReply, func(ctx context.Context, p *csiPluginClient) error {
		_, err := p.DeleteSnapshot(ctx, req)
		if errors.Is(err, structs.ErrCSINotFound) {
			return nil
		}
		return err
	})
}

// ControllerListSnapshots lists one page of snapshots.
func (e *ClientCSI) ControllerListSnapshots(args *structs.ClientCSIControllerListSnapshotsRequest, reply *structs.ClientCSIControllerListSnapshotsResponse) error {
	return e.controllerListSnapshots(context.Background(), args, reply)
}

func (e *ClientCSI) controllerListSnapshots(ctx context.Context, args *structs.ClientCSIControllerListSnapshotsRequest, reply *structs.ClientCSIControllerListSnapshotsResponse) error {
	req := &csi.ListSnapshotsRequest{MaxEntries: args.MaxEntries, StartingToken: args.StartingToken, Secrets: args.Secrets}
	// Reads use the lane too: a listing should not interleave with a create
	// or delete the plugin is still working on.
	return e.mgr.controllerCall(ctx, args.PluginID, "ListSnapshots", args.CSIControllerQuery, laneadmit.Call{}, nil, func(ctx context.Context, p *csiPluginClient) error {
		resp, err := p.ListSnapshots(ctx, req)
		if err != nil {
			return err
		}
		reply.Snapshots = reply.Snapshots[:0]
		for _, ent := range resp.GetEntries() {
			reply.Snapshots = append(reply.Snapshots, csiSnapshot(args.PluginID, ent.GetSnapshot()))
		}
		reply.NextToken = resp.GetNextToken()
		return nil
	})
}

func csiSnapshot(pluginID string, s *csi.Snapshot) *structs.CSISnapshot {
	if s == nil {
		return nil
	}
	return &structs.CSISnapshot{
		ID:               s.GetSnapshotId(),
		ExternalSourceID: s.GetSourceVolumeId(),
		SizeBytes:        s.GetSizeBytes(),
		CreateTime:       s.GetCreationTime().GetSeconds(),
		IsReady:          s.GetReadyToUse(),
		PluginID:         pluginID,
	}
}

// NodeDetachVolume unpublishes a volume from an allocation on this client
// and unstages it once no allocation here uses it. The server calls it
// when it frees a claim the client did not release itself. It answers
// within the client's CSINodeCallTimeout: a plugin that does not finish
// by then is an error wrapping structs.ErrCSIUnavailable, and the server
// tries again later. Other volumes, of this plugin or another, are
// detached meanwhile.
func (e *ClientCSI) NodeDetachVolume(args *structs.ClientCSINodeDetachVolumeRequest, reply *structs.ClientCSINodeDetachVolumeResponse) error {
	return e.nodeDetachVolume(context.Background(), args, reply)
}

func (e *ClientCSI) nodeDetachVolume(ctx context.Context, args *structs.ClientCSINodeDetachVolumeRequest, _ *structs.ClientCSINodeDetachVolumeResponse) error {
	if e.vols == nil {
		return fmt.Errorf("%w: %q: this client mounts no csi volumes", structs.ErrCSIPluginNotFound, args.PluginID)
	}
	return e.vols.detach(ctx, args)
}

// NodeVolumeUsers says which allocations here have a volume published,
// and whether it is staged. It calls no plugin and changes nothing. The
// leader asks before it unpublishes, at the provider, a volume this node
// holds that no claim in its state explains (a restored snapshot older
// than the attachment).
func (e *ClientCSI) NodeVolumeUsers(args *structs.ClientCSINodeVolumeUsersRequest, reply *structs.ClientCSINodeVolumeUsersResponse) error {
	if e.vols == nil {
		return nil
	}
	reply.AllocIDs, reply.Staged = e.vols.users(args.PluginID, args.VolumeID)
	return nil
}
