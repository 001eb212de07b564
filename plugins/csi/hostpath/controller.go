package hostpath

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const (
	// totalCapacity is the simulated provider's pool, shared by all volumes
	// in a state dir. Sizes are only recorded; no space is reserved on disk.
	totalCapacity int64 = 1 << 40
	// defaultVolumeSize is the size of a volume created without a required
	// size.
	defaultVolumeSize int64 = 1 << 30
	// devicePrefix starts every simulated device name.
	devicePrefix = "/dev/roam"
)

// controllerServer is the CSI controller service, served in controller and
// monolith modes.
type controllerServer struct {
	csi.UnimplementedControllerServer
	p *Plugin
}

var _ csi.ControllerServer = (*controllerServer)(nil)

func (s *controllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	types := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	}
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, t := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

// requestedSize turns a capacity range into the size to give a volume.
func requestedSize(cr *csi.CapacityRange) (size, limit int64, err error) {
	required, limit := cr.GetRequiredBytes(), cr.GetLimitBytes()
	if required < 0 || limit < 0 {
		return 0, 0, status.Error(codes.InvalidArgument, "capacity range must not be negative")
	}
	if limit > 0 && required > limit {
		return 0, 0, status.Errorf(codes.InvalidArgument, "required bytes %d exceed limit bytes %d", required, limit)
	}
	size = required
	if size == 0 {
		size = defaultVolumeSize
		if limit > 0 && limit < size {
			size = limit
		}
	}
	if size > totalCapacity {
		return 0, 0, status.Errorf(codes.OutOfRange, "size %d exceeds the provider's capacity %d", size, totalCapacity)
	}
	return size, limit, nil
}

// usedCapacity is the sum of all volume sizes.
func usedCapacity(st *state) int64 {
	var used int64
	for _, v := range st.Volumes {
		used += v.CapacityBytes
	}
	return used
}

func (s *controllerServer) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities are required")
	}
	for _, c := range req.GetVolumeCapabilities() {
		if err := validateCapability(c); err != nil {
			return nil, err
		}
	}
	size, limit, err := requestedSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	var sourceSnapshot, sourceVolume string
	if src := req.GetVolumeContentSource(); src != nil {
		switch {
		case src.GetSnapshot() != nil:
			if sourceSnapshot = src.GetSnapshot().GetSnapshotId(); sourceSnapshot == "" {
				return nil, status.Error(codes.InvalidArgument, "content source snapshot ID is empty")
			}
		case src.GetVolume() != nil:
			if sourceVolume = src.GetVolume().GetVolumeId(); sourceVolume == "" {
				return nil, status.Error(codes.InvalidArgument, "content source volume ID is empty")
			}
		default:
			return nil, status.Error(codes.InvalidArgument, "unknown content source")
		}
	}
	zone, err := chooseZone(req.GetAccessibilityRequirements())
	if err != nil {
		return nil, err
	}
	id, err := newID("vol-")
	if err != nil {
		return nil, err
	}

	var vol volume
	created := false
	err = s.p.store.update(func(st *state) error {
		for _, v := range st.Volumes {
			if v.Name != req.GetName() {
				continue
			}
			if v.CapacityBytes < size || (limit > 0 && v.CapacityBytes > limit) ||
				v.SourceSnapshotID != sourceSnapshot || v.SourceVolumeID != sourceVolume || v.Zone != zone ||
				!maps.Equal(v.Parameters, req.GetParameters()) {
				return status.Errorf(codes.AlreadyExists, "volume %q exists as %s with a different size, source or parameters", v.Name, v.ID)
			}
			vol = *v
			return nil
		}
		dir, err := volumeName(id)
		if err != nil {
			return err
		}
		if used := usedCapacity(st); used+size > totalCapacity {
			return status.Errorf(codes.OutOfRange, "size %d exceeds the %d bytes left", size, totalCapacity-used)
		}
		if sourceSnapshot != "" {
			snap := st.Snapshots[sourceSnapshot]
			if snap == nil {
				return status.Errorf(codes.NotFound, "snapshot %q not found", sourceSnapshot)
			}
			if requested := req.GetCapacityRange().GetRequiredBytes(); s.p.cfg.StrictSourceSize && requested < snap.SizeBytes {
				return status.Errorf(codes.OutOfRange, "snapshot %s is %d bytes, greater than the requested volume size %d", snap.ID, snap.SizeBytes, requested)
			}
			if size < snap.SizeBytes {
				if limit > 0 && limit < snap.SizeBytes {
					return status.Errorf(codes.OutOfRange, "snapshot %s is %d bytes, over the limit %d", snap.ID, snap.SizeBytes, limit)
				}
				size = snap.SizeBytes
				if used := usedCapacity(st); used+size > totalCapacity {
					return status.Errorf(codes.OutOfRange, "size %d exceeds the %d bytes left", size, totalCapacity-used)
				}
			}
			snapDir, err := snapshotName(snap.ID)
			if err != nil {
				return err
			}
			if err := s.p.store.inStateDir(func(root *os.Root) error { return replaceTree(root, snapDir, dir) }); err != nil {
				return fmt.Errorf("restoring snapshot %s: %w", snap.ID, err)
			}
		} else if sourceVolume != "" {
			src := st.Volumes[sourceVolume]
			if src == nil {
				return status.Errorf(codes.NotFound, "source volume %q not found", sourceVolume)
			}
			if requested := req.GetCapacityRange().GetRequiredBytes(); s.p.cfg.StrictSourceSize && requested < src.CapacityBytes {
				return status.Errorf(codes.OutOfRange, "source volume %s is %d bytes, greater than the requested volume size %d", src.ID, src.CapacityBytes, requested)
			}
			if size < src.CapacityBytes {
				if limit > 0 && limit < src.CapacityBytes {
					return status.Errorf(codes.OutOfRange, "source volume %s is %d bytes, over the limit %d", src.ID, src.CapacityBytes, limit)
				}
				size = src.CapacityBytes
				if used := usedCapacity(st); used+size > totalCapacity {
					return status.Errorf(codes.OutOfRange, "size %d exceeds the %d bytes left", size, totalCapacity-used)
				}
			}
			srcDir, err := volumeName(src.ID)
			if err != nil {
				return err
			}
			// The copy is taken under the state lock, like a snapshot: a
			// consistent point in time for this simulated provider.
			if err := s.p.store.inStateDir(func(root *os.Root) error { return replaceTree(root, srcDir, dir) }); err != nil {
				return fmt.Errorf("cloning volume %s: %w", src.ID, err)
			}
		} else if err := s.p.store.inStateDir(func(root *os.Root) error { return mkVolumeDir(root, dir) }); err != nil {
			return fmt.Errorf("creating volume dir: %w", err)
		}
		vol = volume{
			ID:               id,
			Name:             req.GetName(),
			CapacityBytes:    size,
			Parameters:       req.GetParameters(),
			SourceSnapshotID: sourceSnapshot,
			SourceVolumeID:   sourceVolume,
			Zone:             zone,
			CreatedAt:        time.Now().UTC(),
		}
		st.Volumes[id] = &vol
		created = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	if created {
		s.p.logger.Info("created volume", "volume_id", vol.ID, "name", vol.Name, "capacity_bytes", vol.CapacityBytes)
	}
	return &csi.CreateVolumeResponse{Volume: csiVolume(&vol)}, nil
}

// csiVolume is the CSI form of a stored volume.
func csiVolume(v *volume) *csi.Volume {
	out := &csi.Volume{VolumeId: v.ID, CapacityBytes: v.CapacityBytes}
	if v.Zone != "" {
		out.AccessibleTopology = []*csi.Topology{{Segments: map[string]string{TopologyZoneKey: v.Zone}}}
	}
	switch {
	case v.SourceSnapshotID != "":
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: v.SourceSnapshotID},
		}}
	case v.SourceVolumeID != "":
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: v.SourceVolumeID},
		}}
	}
	return out
}

// DeleteVolume refuses while the volume is attached to any node, like a
// cloud disk. Deleting an unknown volume succeeds.
func (s *controllerServer) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	deleted := false
	err := s.p.store.update(func(st *state) error {
		if st.Volumes[id] == nil {
			return nil
		}
		for _, nodeID := range slices.Sorted(maps.Keys(st.Nodes)) {
			if a := st.Nodes[nodeID].Attachments[id]; a != nil {
				return status.Errorf(codes.FailedPrecondition, "volume %s is attached to node %s as %s", id, nodeID, a.Device)
			}
		}
		dir, err := volumeName(id)
		if err != nil {
			return err
		}
		if err := s.p.store.inStateDir(func(root *os.Root) error { return root.RemoveAll(dir) }); err != nil {
			return fmt.Errorf("removing volume data: %w", err)
		}
		delete(st.Volumes, id)
		for _, n := range st.Nodes {
			delete(n.Staged, id)
			delete(n.Published, id)
		}
		deleted = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	if deleted {
		s.p.logger.Info("deleted volume", "volume_id", id)
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// freeDevice is the lowest device name not attached on n.
func (n *node) freeDevice() string {
	used := make(map[string]bool, len(n.Attachments))
	for _, a := range n.Attachments {
		used[a.Device] = true
	}
	for i := 0; ; i++ {
		if name := fmt.Sprintf("%s%02d", devicePrefix, i); !used[name] {
			return name
		}
	}
}

// ControllerPublishVolume attaches a volume to a node after the configured
// latency. See the package documentation for the rules.
func (s *controllerServer) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	volID, nodeID := req.GetVolumeId(), req.GetNodeId()
	if volID == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if nodeID == "" {
		return nil, status.Error(codes.InvalidArgument, "node ID is required")
	}
	if err := validateCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	if err := delay(ctx, s.p.cfg.PublishLatency); err != nil {
		return nil, err
	}
	if err := s.p.hangIfFaulted(ctx, FaultHangControllerPublish, "ControllerPublishVolume", "volume_id", volID, "node_id", nodeID); err != nil {
		return nil, err
	}
	mode := req.GetVolumeCapability().GetAccessMode().GetMode()
	var device string
	attached := false
	err := s.p.store.update(func(st *state) error {
		if st.Volumes[volID] == nil {
			return status.Errorf(codes.NotFound, "volume %q not found", volID)
		}
		n := st.Nodes[nodeID]
		if n == nil {
			return status.Errorf(codes.NotFound, "node %q not found", nodeID)
		}
		if a := n.Attachments[volID]; a != nil {
			if a.Readonly != req.GetReadonly() || a.AccessMode != accessModeName(mode) {
				return status.Errorf(codes.AlreadyExists,
					"volume %s is attached to node %s with readonly=%t mode %s", volID, nodeID, a.Readonly, a.AccessMode)
			}
			device = a.Device
			return nil
		}
		for _, otherID := range slices.Sorted(maps.Keys(st.Nodes)) {
			a := st.Nodes[otherID].Attachments[volID]
			if otherID == nodeID || a == nil {
				continue
			}
			if singleNode(mode) || singleNodeName(a.AccessMode) {
				return status.Errorf(codes.FailedPrecondition,
					"volume %s is attached to node %s in mode %s", volID, otherID, a.AccessMode)
			}
		}
		if v := st.Volumes[volID]; v.Zone != "" && n.Zone != v.Zone {
			// A zonal disk attaches only to machines in its zone.
			return status.Errorf(codes.FailedPrecondition, "volume %s lives in zone %q; node %s is in zone %q",
				volID, v.Zone, nodeID, n.Zone)
		}
		if n.MaxVolumes > 0 && int64(len(n.Attachments)) >= n.MaxVolumes {
			return status.Errorf(codes.ResourceExhausted,
				"node %s has %d of %d volumes attached", nodeID, len(n.Attachments), n.MaxVolumes)
		}
		device = n.freeDevice()
		n.Attachments[volID] = &attachment{
			Device:     device,
			Readonly:   req.GetReadonly(),
			AccessMode: accessModeName(mode),
			AttachedAt: time.Now().UTC(),
		}
		attached = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	if attached {
		s.p.logger.Info("attached volume", "volume_id", volID, "node_id", nodeID, "device", device)
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{"device": device}}, nil
}

// ControllerUnpublishVolume detaches a volume from a node (from every node
// when the request names none) after the configured latency. Detaching what
// is not attached, or an unknown volume or node, succeeds.
func (s *controllerServer) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	volID, nodeID := req.GetVolumeId(), req.GetNodeId()
	if volID == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if err := delay(ctx, s.p.cfg.PublishLatency); err != nil {
		return nil, err
	}
	if err := s.p.hangIfFaulted(ctx, FaultHangControllerUnpublish, "ControllerUnpublishVolume", "volume_id", volID, "node_id", nodeID); err != nil {
		return nil, err
	}
	type detached struct{ node, device string }
	var done []detached
	err := s.p.store.update(func(st *state) error {
		for _, id := range slices.Sorted(maps.Keys(st.Nodes)) {
			n := st.Nodes[id]
			a := n.Attachments[volID]
			if (nodeID != "" && id != nodeID) || a == nil {
				continue
			}
			if _, staged := n.Staged[volID]; staged || len(n.Published[volID]) > 0 {
				// A real disk would be yanked from under its mounts.
				s.p.logger.Warn("detaching a volume still staged or published on its node",
					"volume_id", volID, "node_id", id)
			}
			delete(n.Attachments, volID)
			done = append(done, detached{id, a.Device})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, d := range done {
		s.p.logger.Info("detached volume", "volume_id", volID, "node_id", d.node, "device", d.device)
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

func (s *controllerServer) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities are required")
	}
	err := s.p.store.view(func(st *state) error {
		if st.Volumes[id] == nil {
			return status.Errorf(codes.NotFound, "volume %q not found", id)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, c := range req.GetVolumeCapabilities() {
		if why := checkCapability(c); why != "" {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: why}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ListVolumes lists volumes in ID order, with the nodes each is attached to.
func (s *controllerServer) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	resp := &csi.ListVolumesResponse{}
	err := s.p.store.view(func(st *state) error {
		ids := slices.Sorted(maps.Keys(st.Volumes))
		start, end, next, err := page(len(ids), req.GetStartingToken(), req.GetMaxEntries())
		if err != nil {
			return err
		}
		nodeIDs := slices.Sorted(maps.Keys(st.Nodes))
		for _, id := range ids[start:end] {
			entry := &csi.ListVolumesResponse_Entry{
				Volume: csiVolume(st.Volumes[id]),
				Status: &csi.ListVolumesResponse_VolumeStatus{},
			}
			for _, nodeID := range nodeIDs {
				if st.Nodes[nodeID].Attachments[id] != nil {
					entry.Status.PublishedNodeIds = append(entry.Status.PublishedNodeIds, nodeID)
				}
			}
			resp.Entries = append(resp.Entries, entry)
		}
		resp.NextToken = next
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// GetCapacity reports what is left of the simulated provider's pool.
func (s *controllerServer) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	for _, c := range req.GetVolumeCapabilities() {
		if checkCapability(c) != "" {
			return &csi.GetCapacityResponse{}, nil
		}
	}
	var available int64
	err := s.p.store.view(func(st *state) error {
		available = max(totalCapacity-usedCapacity(st), 0)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &csi.GetCapacityResponse{
		AvailableCapacity: available,
		MaximumVolumeSize: wrapperspb.Int64(available),
	}, nil
}

// ControllerExpandVolume grows a volume's recorded size; it never shrinks.
func (s *controllerServer) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if req.GetCapacityRange() == nil {
		return nil, status.Error(codes.InvalidArgument, "capacity range is required")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := validateCapability(c); err != nil {
			return nil, err
		}
	}
	size, limit, err := requestedSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	var capacity int64
	err = s.p.store.update(func(st *state) error {
		v := st.Volumes[id]
		if v == nil {
			return status.Errorf(codes.NotFound, "volume %q not found", id)
		}
		if size > v.CapacityBytes {
			if left := totalCapacity - usedCapacity(st) + v.CapacityBytes; size > left {
				return status.Errorf(codes.OutOfRange, "size %d exceeds the %d bytes left", size, left)
			}
			v.CapacityBytes = size
		} else if limit > 0 && v.CapacityBytes > limit {
			return status.Errorf(codes.OutOfRange, "volume is already %d bytes, over the limit %d", v.CapacityBytes, limit)
		}
		capacity = v.CapacityBytes
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.p.logger.Info("expanded volume", "volume_id", id, "capacity_bytes", capacity)
	// Like a block device with a file system on it: the device grew, and
	// the node where it is mounted grows the file system (NodeExpandVolume).
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: capacity, NodeExpansionRequired: true}, nil
}
