package client

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/structs"
)

// ControllerListVolumes lists one page of the plugin's volumes
// (ListVolumes). It runs in the plugin's lane, like ListSnapshots, so a
// listing never interleaves with a create or delete in progress.
func (e *ClientCSI) ControllerListVolumes(args *structs.ClientCSIControllerListVolumesRequest, reply *structs.ClientCSIControllerListVolumesResponse) error {
	return e.controllerListVolumes(context.Background(), args, reply)
}

func (e *ClientCSI) controllerListVolumes(ctx context.Context, args *structs.ClientCSIControllerListVolumesRequest, reply *structs.ClientCSIControllerListVolumesResponse) error {
	req := &csi.ListVolumesRequest{MaxEntries: args.MaxEntries, StartingToken: args.StartingToken}
	return e.mgr.controllerCall(ctx, args.PluginID, "ListVolumes", args.CSIControllerQuery, laneadmit.Call{}, nil, func(ctx context.Context, p *csiPluginClient) error {
		resp, err := p.ListVolumes(ctx, req)
		if err != nil {
			return err
		}
		reply.Volumes = reply.Volumes[:0]
		for _, ent := range resp.GetEntries() {
			v := ent.GetVolume()
			stub := &structs.CSIVolumeExternalStub{
				ExternalID:               v.GetVolumeId(),
				CapacityBytes:            v.GetCapacityBytes(),
				VolumeContext:            v.GetVolumeContext(),
				PublishedExternalNodeIDs: ent.GetStatus().GetPublishedNodeIds(),
				// The CSI spec this build speaks has no volume condition
				// in ListVolumes: IsAbnormal and Status stay unset.
			}
			if src := v.GetContentSource(); src != nil {
				stub.SnapshotID = src.GetSnapshot().GetSnapshotId()
				stub.CloneID = src.GetVolume().GetVolumeId()
			}
			reply.Volumes = append(reply.Volumes, stub)
		}
		reply.NextToken = resp.GetNextToken()
		return nil
	})
}
