package client

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/structs"
)

// ControllerExpandVolume grows a volume at the provider
// (ControllerExpandVolume), in the plugin's controller lane like every
// destructive controller call.
func (e *ClientCSI) ControllerExpandVolume(args *structs.ClientCSIControllerExpandVolumeRequest, reply *structs.ClientCSIControllerExpandVolumeResponse) error {
	return e.controllerExpandVolume(context.Background(), args, reply)
}

func (e *ClientCSI) controllerExpandVolume(ctx context.Context, args *structs.ClientCSIControllerExpandVolumeRequest, reply *structs.ClientCSIControllerExpandVolumeResponse) error {
	if args.ExternalVolumeID == "" {
		return fmt.Errorf("%w: volume ID is required", structs.ErrCSIInvalidArgument)
	}
	if args.CapacityMin <= 0 && args.CapacityMax <= 0 {
		return fmt.Errorf("%w: a capacity is required", structs.ErrCSIInvalidArgument)
	}
	req := &csi.ControllerExpandVolumeRequest{
		VolumeId:      args.ExternalVolumeID,
		CapacityRange: &csi.CapacityRange{RequiredBytes: args.CapacityMin, LimitBytes: args.CapacityMax},
		Secrets:       args.Secrets,
	}
	if c := args.Capability; c != nil {
		vc, err := csiVolumeCapability(c.AccessMode, c.AttachmentMode, args.MountOptions)
		if err != nil {
			return err
		}
		req.VolumeCapability = vc
	}
	key := laneadmit.Call{Volume: laneadmit.VolumeKey(args.ExternalVolumeID)}
	return e.mgr.controllerCall(ctx, args.PluginID, "ControllerExpandVolume", args.CSIControllerQuery, key, &reply.CSIControllerReply, func(ctx context.Context, p *csiPluginClient) error {
		resp, err := p.ControllerExpandVolume(ctx, req)
		if err != nil {
			return err
		}
		reply.CapacityBytes = resp.GetCapacityBytes()
		reply.NodeExpansionRequired = resp.GetNodeExpansionRequired()
		return nil
	})
}

// NodeExpandVolume grows a volume this client has mounted for an
// allocation, while it stays mounted (NodeExpandVolume). It holds the
// volume as a mount or unmount does, so it never runs beside one: a mount
// that finishes first is expanded, and one that starts after stages the
// grown volume. A volume not mounted here is not an error; nothing is
// called. Like NodeDetachVolume it answers within CSINodeCallTimeout.
func (e *ClientCSI) NodeExpandVolume(args *structs.ClientCSINodeExpandVolumeRequest, reply *structs.ClientCSINodeExpandVolumeResponse) error {
	return e.nodeExpandVolume(context.Background(), args, reply)
}

func (e *ClientCSI) nodeExpandVolume(ctx context.Context, args *structs.ClientCSINodeExpandVolumeRequest, reply *structs.ClientCSINodeExpandVolumeResponse) error {
	if e.vols == nil {
		return fmt.Errorf("%w: %q: this client mounts no csi volumes", structs.ErrCSIPluginNotFound, args.PluginID)
	}
	return e.vols.expand(ctx, args, reply)
}

// expand serves ClientCSI.NodeExpandVolume.
func (m *csiVolumeManager) expand(ctx context.Context, args *structs.ClientCSINodeExpandVolumeRequest, reply *structs.ClientCSINodeExpandVolumeResponse) error {
	if args.VolumeID == "" || args.ExternalID == "" || args.AllocID == "" {
		return fmt.Errorf("%w: volume ID, external ID and allocation ID are required", structs.ErrCSIInvalidArgument)
	}
	// Refused before anything is asked of the plugin unless each ID is one
	// plain name beneath csiDir.
	staging, err := m.stagingPath(args.PluginID, args.VolumeID)
	if err != nil {
		return err
	}
	target, err := m.targetPath(args.PluginID, args.AllocID, args.VolumeID)
	if err != nil {
		return err
	}
	vc, err := csiVolumeCapability(args.AccessMode, args.AttachmentMode, args.MountOptions)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.NodeCallTimeout)
	defer cancel()
	p, err := m.cfg.Plugins.nodePlugin(args.PluginID)
	if err != nil {
		return err
	}
	u, unlock, err := m.lock(ctx, args.PluginID, args.VolumeID)
	if err != nil {
		return err
	}
	defer unlock()
	if !u.users[args.AllocID] {
		// Not published for that allocation here: nothing mounted to grow.
		m.logger.Debug("volume to expand is not mounted here", "volume_id", args.VolumeID, "alloc_id", args.AllocID)
		return nil
	}
	caps, err := p.client.NodeGetCapabilities(ctx)
	if err != nil {
		return err
	}
	if !nodeCanExpand(caps) {
		// The plugin grows nothing on the node; the controller's answer
		// is the whole expansion.
		return nil
	}
	req := &csi.NodeExpandVolumeRequest{
		VolumeId:         args.ExternalID,
		VolumePath:       target,
		CapacityRange:    &csi.CapacityRange{RequiredBytes: args.CapacityMin, LimitBytes: args.CapacityMax},
		VolumeCapability: vc,
	}
	if u.staged {
		req.StagingTargetPath = staging
	}
	resp, err := p.client.NodeExpandVolume(ctx, req)
	if err != nil {
		return err
	}
	reply.CapacityBytes = resp.GetCapacityBytes()
	reply.Expanded = true
	m.logger.Info("expanded mounted volume", "volume_id", args.VolumeID, "alloc_id", args.AllocID,
		"capacity_bytes", resp.GetCapacityBytes())
	return nil
}
