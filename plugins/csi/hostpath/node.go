package hostpath

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// nodeServer is the CSI node service, served in node and monolith modes.
type nodeServer struct {
	csi.UnimplementedNodeServer
	p *Plugin
}

var _ csi.NodeServer = (*nodeServer)(nil)

func (s *nodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	resp := &csi.NodeGetInfoResponse{
		NodeId:            s.p.cfg.NodeID,
		MaxVolumesPerNode: s.p.cfg.MaxVolumesPerNode,
	}
	if s.p.cfg.Zone != "" {
		resp.AccessibleTopology = &csi.Topology{Segments: map[string]string{TopologyZoneKey: s.p.cfg.Zone}}
	}
	return resp, nil
}

func (s *nodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	resp := &csi.NodeGetCapabilitiesResponse{}
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
	} {
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

// thisNode returns this plugin's node in st, or FAILED_PRECONDITION if it is
// not registered (the state file was replaced under a running plugin).
func (s *nodeServer) thisNode(st *state) (*node, error) {
	n := st.Nodes[s.p.cfg.NodeID]
	if n == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "node %q is not registered in the plugin state", s.p.cfg.NodeID)
	}
	return n, nil
}

// NodeStageVolume checks that the volume is attached to this node (under
// the device in the publish context, if one is given) and records the
// staging path. It writes nothing at the staging path.
func (s *nodeServer) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetStagingTargetPath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if path == "" {
		return nil, status.Error(codes.InvalidArgument, "staging target path is required")
	}
	path, err := s.p.checkCOPath("staging target path", path)
	if err != nil {
		return nil, err
	}
	if err := validateCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	err = s.p.store.update(func(st *state) error {
		if st.Volumes[id] == nil {
			return status.Errorf(codes.NotFound, "volume %q not found", id)
		}
		n, err := s.thisNode(st)
		if err != nil {
			return err
		}
		a := n.Attachments[id]
		if a == nil {
			return status.Errorf(codes.FailedPrecondition, "volume %s is not attached to node %s", id, n.ID)
		}
		if dev := req.GetPublishContext()["device"]; dev != "" && dev != a.Device {
			return status.Errorf(codes.FailedPrecondition, "volume %s is attached as %s, not %s", id, a.Device, dev)
		}
		if staged, ok := n.Staged[id]; ok && staged != path {
			return status.Errorf(codes.FailedPrecondition, "volume %s is already staged at %s", id, staged)
		}
		n.Staged[id] = path
		// Staging mounts the file system, grown to the device's size as a
		// node plugin does when it stages a volume expanded meanwhile.
		return s.p.store.writeFSSize(st.Volumes[id])
	})
	if err != nil {
		return nil, err
	}
	s.p.logger.Debug("staged volume", "volume_id", id, "staging_path", path)
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume forgets the staging record. It refuses while the volume
// is still published on this node, as unmounting a busy device would.
func (s *nodeServer) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetStagingTargetPath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if path == "" {
		return nil, status.Error(codes.InvalidArgument, "staging target path is required")
	}
	path, err := s.p.checkCOPath("staging target path", path)
	if err != nil {
		return nil, err
	}
	err = s.p.store.update(func(st *state) error {
		if st.Volumes[id] == nil {
			return status.Errorf(codes.NotFound, "volume %q not found", id)
		}
		n := st.Nodes[s.p.cfg.NodeID]
		if n == nil || n.Staged[id] != path {
			return nil
		}
		if targets := n.Published[id]; len(targets) > 0 {
			return status.Errorf(codes.FailedPrecondition, "volume %s is still published at %v", id, slices.Sorted(maps.Keys(targets)))
		}
		delete(n.Staged, id)
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.p.logger.Debug("unstaged volume", "volume_id", id, "staging_path", path)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume makes target_path a symlink to the volume's data dir.
// See the package documentation.
func (s *nodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	}
	if err := validateCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	target, err := s.p.checkCOPath("target path", target)
	if err != nil {
		return nil, err
	}
	staging := req.GetStagingTargetPath()
	if staging == "" {
		return nil, status.Error(codes.FailedPrecondition, "staging target path is required: the volume must be staged first")
	}
	if staging, err = s.p.checkCOPath("staging target path", staging); err != nil {
		return nil, err
	}
	mode := accessModeName(req.GetVolumeCapability().GetAccessMode().GetMode())
	err = s.p.store.update(func(st *state) error {
		if st.Volumes[id] == nil {
			return status.Errorf(codes.NotFound, "volume %q not found", id)
		}
		n, err := s.thisNode(st)
		if err != nil {
			return err
		}
		if n.Attachments[id] == nil {
			return status.Errorf(codes.FailedPrecondition, "volume %s is not attached to node %s", id, n.ID)
		}
		if got, ok := n.Staged[id]; !ok || got != staging {
			return status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", id, staging)
		}
		pubs := n.Published[id]
		if pub := pubs[target]; pub != nil {
			if pub.Readonly != req.GetReadonly() || pub.AccessMode != mode {
				return status.Errorf(codes.AlreadyExists, "volume %s is published at %s with readonly=%t mode %s",
					id, target, pub.Readonly, pub.AccessMode)
			}
			return s.makeLink(id, target)
		}
		for other, pub := range pubs {
			if mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER.String() ||
				pub.AccessMode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER.String() {
				return status.Errorf(codes.FailedPrecondition, "volume %s is already published at %s for a single writer", id, other)
			}
		}
		if err := s.makeLink(id, target); err != nil {
			return err
		}
		if pubs == nil {
			pubs = map[string]*publication{}
			n.Published[id] = pubs
		}
		pubs[target] = &publication{Readonly: req.GetReadonly(), AccessMode: mode}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.p.logger.Debug("published volume", "volume_id", id, "target_path", target, "readonly", req.GetReadonly())
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume removes the symlink at target_path and the record.
func (s *nodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	}
	target, err := s.p.checkCOPath("target path", target)
	if err != nil {
		return nil, err
	}
	// Before the state lock: a hung unpublish holds up nothing else.
	if err := s.p.hangIfFaulted(ctx, FaultHangNodeUnpublish, "NodeUnpublishVolume", "volume_id", id, "target_path", target); err != nil {
		return nil, err
	}
	err = s.p.store.update(func(st *state) error {
		if st.Volumes[id] == nil {
			return status.Errorf(codes.NotFound, "volume %q not found", id)
		}
		if err := s.removeLink(id, target); err != nil {
			return err
		}
		if n := st.Nodes[s.p.cfg.NodeID]; n != nil {
			delete(n.Published[id], target)
			if len(n.Published[id]) == 0 {
				delete(n.Published, id)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.p.logger.Debug("unpublished volume", "volume_id", id, "target_path", target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// makeLink makes target a symlink to the volume's data dir, creating the
// data dir in the state dir. An existing link to it is kept; an empty
// directory at target is replaced; anything else is refused. Everything
// at target is done through an os.Root (openTarget).
func (s *nodeServer) makeLink(id, target string) error {
	name, err := volumeName(id)
	if err != nil {
		return err
	}
	dir := filepath.Join(s.p.store.dir, name)
	t, err := s.p.openTarget(target, true)
	if err != nil {
		return fmt.Errorf("opening target path: %w", err)
	}
	defer t.close()
	fi, err := t.root.Lstat(t.rel)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if parent := filepath.Dir(t.rel); parent != "." {
			if err := t.root.MkdirAll(parent, 0o755); err != nil {
				return fmt.Errorf("creating target parent: %w", err)
			}
		}
	case err != nil:
		return fmt.Errorf("inspecting target path: %w", err)
	case fi.Mode()&os.ModeSymlink != 0:
		dest, err := t.root.Readlink(t.rel)
		if err != nil {
			return fmt.Errorf("reading target link: %w", err)
		}
		if dest == dir {
			return nil
		}
		return status.Errorf(codes.FailedPrecondition, "target path %s is a link to %s", target, dest)
	case fi.IsDir():
		empty, err := isEmptyDir(t.root, t.rel)
		if err != nil {
			return fmt.Errorf("inspecting target path: %w", err)
		}
		if !empty {
			return status.Errorf(codes.FailedPrecondition, "target path %s is a directory that is not empty", target)
		}
		if err := t.root.Remove(t.rel); err != nil {
			return fmt.Errorf("replacing target dir: %w", err)
		}
	default:
		return status.Errorf(codes.FailedPrecondition, "target path %s exists and is not a directory", target)
	}
	if err := s.p.store.inStateDir(func(root *os.Root) error { return mkVolumeDir(root, name) }); err != nil {
		return fmt.Errorf("creating volume dir: %w", err)
	}
	if err := t.root.Symlink(dir, t.rel); err != nil {
		return fmt.Errorf("linking target path: %w", err)
	}
	return nil
}

// removeLink removes what makeLink made at target. A missing target is
// fine; an empty directory is removed too (the spec asks that target_path
// be gone); anything else is refused. Through an os.Root, as makeLink.
func (s *nodeServer) removeLink(id, target string) error {
	dir, err := s.p.store.volumeDir(id)
	if err != nil {
		return err
	}
	t, err := s.p.openTarget(target, false)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening target path: %w", err)
	}
	defer t.close()
	fi, err := t.root.Lstat(t.rel)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("inspecting target path: %w", err)
	case fi.Mode()&os.ModeSymlink != 0:
		dest, err := t.root.Readlink(t.rel)
		if err != nil {
			return fmt.Errorf("reading target link: %w", err)
		}
		if dest != dir {
			return status.Errorf(codes.FailedPrecondition, "target path %s links to %s, not to this volume", target, dest)
		}
	case fi.IsDir():
		empty, err := isEmptyDir(t.root, t.rel)
		if err != nil {
			return fmt.Errorf("inspecting target path: %w", err)
		}
		if !empty {
			return status.Errorf(codes.FailedPrecondition, "target path %s is a directory that is not empty", target)
		}
	default:
		return status.Errorf(codes.FailedPrecondition, "target path %s is not a link this plugin made", target)
	}
	if err := t.root.Remove(t.rel); err != nil {
		return fmt.Errorf("removing target path: %w", err)
	}
	return nil
}

func isEmptyDir(root *os.Root, name string) (bool, error) {
	f, err := root.Open(name)
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}
