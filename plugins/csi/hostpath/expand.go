package hostpath

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FSSizeFile is the file, at the root of every volume's data, that holds
// the size in bytes of the volume's simulated file system, in decimal with
// a newline. A directory has no size of its own, so this is how a task
// sees its volume's size: it is the device's size (capacity_bytes) as of
// the last NodeStageVolume or NodeExpandVolume, never ControllerExpand
// alone, just as a real file system grows only once the node resizes it.
const FSSizeFile = ".roam-fs-size"

// writeFSSize records v's capacity as its file system's size, in v's data
// dir. The state lock must be held.
func (s *store) writeFSSize(v *volume) error {
	if v == nil {
		return nil
	}
	name, err := volumeName(v.ID)
	if err != nil {
		return err
	}
	return s.inStateDir(func(root *os.Root) error {
		if err := mkVolumeDir(root, name); err != nil {
			return fmt.Errorf("creating volume dir: %w", err)
		}
		tmp := filepath.Join(name, FSSizeFile+".tmp")
		if err := root.WriteFile(tmp, []byte(strconv.FormatInt(v.CapacityBytes, 10)+"\n"), 0o644); err != nil {
			return fmt.Errorf("writing file system size: %w", err)
		}
		if err := root.Rename(tmp, filepath.Join(name, FSSizeFile)); err != nil {
			return fmt.Errorf("writing file system size: %w", err)
		}
		return nil
	})
}

// NodeExpandVolume grows the file system of a volume published on this
// node to the device's size, while it stays published. The volume path
// must be one the volume is published at here (NOT_FOUND otherwise, as
// the spec has it); a required size above the device's is OUT_OF_RANGE:
// ControllerExpandVolume grows the device first.
func (s *nodeServer) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if path == "" {
		return nil, status.Error(codes.InvalidArgument, "volume path is required")
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
	if req.GetCapacityRange() == nil {
		size = 0
	}
	var capacity int64
	err = s.p.store.update(func(st *state) error {
		v := st.Volumes[id]
		if v == nil {
			return status.Errorf(codes.NotFound, "volume %q not found", id)
		}
		// The volume is looked up first: an unknown one is NOT_FOUND
		// whatever the path, as csi-sanity checks.
		if path, err = s.p.checkCOPath("volume path", path); err != nil {
			return err
		}
		n, err := s.thisNode(st)
		if err != nil {
			return err
		}
		if n.Published[id][path] == nil {
			if staged, ok := n.Staged[id]; !ok || staged != path {
				return status.Errorf(codes.NotFound, "volume %s is not published or staged at %s on node %s", id, path, n.ID)
			}
		}
		if size > v.CapacityBytes {
			return status.Errorf(codes.OutOfRange, "volume %s is %d bytes, below the %d required: expand it at the controller first",
				id, v.CapacityBytes, size)
		}
		if limit > 0 && v.CapacityBytes > limit {
			return status.Errorf(codes.OutOfRange, "volume %s is %d bytes, over the limit %d", id, v.CapacityBytes, limit)
		}
		capacity = v.CapacityBytes
		return s.p.store.writeFSSize(v)
	})
	if err != nil {
		return nil, err
	}
	s.p.logger.Info("expanded file system", "volume_id", id, "volume_path", path, "capacity_bytes", capacity)
	return &csi.NodeExpandVolumeResponse{CapacityBytes: capacity}, nil
}

// TopologyZoneKey is the topology segment the plugin's zones are under.
const TopologyZoneKey = "topology.hostpath.csi/zone"

// chooseZone picks the zone of a new volume from its accessibility
// requirements: the first preferred topology's zone, else the first
// requisite one's; "" (every zone) without requirements. A topology
// naming other segments than the zone is INVALID_ARGUMENT.
func chooseZone(req *csi.TopologyRequirement) (string, error) {
	for _, list := range [][]*csi.Topology{req.GetPreferred(), req.GetRequisite()} {
		for _, t := range list {
			for k := range t.GetSegments() {
				if k != TopologyZoneKey {
					return "", status.Errorf(codes.InvalidArgument, "topology segment %q is not %q", k, TopologyZoneKey)
				}
			}
		}
	}
	if p := req.GetPreferred(); len(p) > 0 {
		return p[0].GetSegments()[TopologyZoneKey], nil
	}
	if r := req.GetRequisite(); len(r) > 0 {
		return r[0].GetSegments()[TopologyZoneKey], nil
	}
	return "", nil
}
