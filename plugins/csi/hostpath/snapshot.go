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
	"google.golang.org/protobuf/types/known/timestamppb"
)

// csiSnapshot is the CSI form of a stored snapshot. Snapshots are copies
// taken synchronously, so they are always ready to use.
func csiSnapshot(s *snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     s.ID,
		SourceVolumeId: s.SourceVolumeID,
		SizeBytes:      s.SizeBytes,
		CreationTime:   timestamppb.New(s.CreatedAt),
		ReadyToUse:     true,
	}
}

// CreateSnapshot copies a volume's data into StateDir/snapshots/<id>.
func (s *controllerServer) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	name, source := req.GetName(), req.GetSourceVolumeId()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if source == "" {
		return nil, status.Error(codes.InvalidArgument, "source volume ID is required")
	}
	id, err := newID("snap-")
	if err != nil {
		return nil, err
	}
	var snap snapshot
	created := false
	err = s.p.store.update(func(st *state) error {
		for _, existing := range st.Snapshots {
			if existing.Name != name {
				continue
			}
			if existing.SourceVolumeID != source {
				return status.Errorf(codes.AlreadyExists, "snapshot %q exists as %s of volume %s", name, existing.ID, existing.SourceVolumeID)
			}
			snap = *existing
			return nil
		}
		vol := st.Volumes[source]
		if vol == nil {
			return status.Errorf(codes.NotFound, "volume %q not found", source)
		}
		volDir, err := volumeName(source)
		if err != nil {
			return err
		}
		snapDir, err := snapshotName(id)
		if err != nil {
			return err
		}
		err = s.p.store.inStateDir(func(root *os.Root) error {
			if err := mkVolumeDir(root, volDir); err != nil {
				return fmt.Errorf("creating volume dir: %w", err)
			}
			if err := replaceTree(root, volDir, snapDir); err != nil {
				return fmt.Errorf("copying volume %s: %w", source, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
		snap = snapshot{
			ID:             id,
			Name:           name,
			SourceVolumeID: source,
			SizeBytes:      vol.CapacityBytes,
			CreatedAt:      time.Now().UTC(),
		}
		st.Snapshots[id] = &snap
		created = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	if created {
		s.p.logger.Info("created snapshot", "snapshot_id", snap.ID, "volume_id", source)
	}
	return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(&snap)}, nil
}

// DeleteSnapshot removes a snapshot; deleting an unknown one succeeds.
// Snapshots are independent copies, so volumes made from one are unaffected.
func (s *controllerServer) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot ID is required")
	}
	deleted := false
	err := s.p.store.update(func(st *state) error {
		if st.Snapshots[id] == nil {
			return nil
		}
		dir, err := snapshotName(id)
		if err != nil {
			return err
		}
		if err := s.p.store.inStateDir(func(root *os.Root) error { return root.RemoveAll(dir) }); err != nil {
			return fmt.Errorf("removing snapshot data: %w", err)
		}
		delete(st.Snapshots, id)
		deleted = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	if deleted {
		s.p.logger.Info("deleted snapshot", "snapshot_id", id)
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

// ListSnapshots lists snapshots in ID order, filtered by snapshot ID or
// source volume ID when given.
func (s *controllerServer) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	resp := &csi.ListSnapshotsResponse{}
	err := s.p.store.view(func(st *state) error {
		var ids []string
		for _, id := range slices.Sorted(maps.Keys(st.Snapshots)) {
			snap := st.Snapshots[id]
			if want := req.GetSnapshotId(); want != "" && id != want {
				continue
			}
			if want := req.GetSourceVolumeId(); want != "" && snap.SourceVolumeID != want {
				continue
			}
			ids = append(ids, id)
		}
		start, end, next, err := page(len(ids), req.GetStartingToken(), req.GetMaxEntries())
		if err != nil {
			return err
		}
		for _, id := range ids[start:end] {
			resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: csiSnapshot(st.Snapshots[id])})
		}
		resp.NextToken = next
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}
