package hostpath

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/shoenig/test/must"
	"google.golang.org/grpc/codes"
)

// sentinel makes dir with keep.txt inside, for a test to check that it
// was neither removed nor replaced.
func sentinel(t *testing.T, dir string) {
	t.Helper()
	must.NoError(t, os.MkdirAll(dir, 0o755))
	must.NoError(t, os.WriteFile(filepath.Join(dir, "keep.txt"), []byte("keep"), 0o644))
}

func mustSentinel(t *testing.T, dir string) {
	t.Helper()
	fi, err := os.Lstat(dir)
	must.NoError(t, err, must.Sprintf("%s outside the plugin's dirs was removed", dir))
	must.True(t, fi.IsDir(), must.Sprintf("%s is now %s", dir, fi.Mode()))
	b, err := os.ReadFile(filepath.Join(dir, "keep.txt"))
	must.NoError(t, err, must.Sprintf("%s was emptied", dir))
	must.Eq(t, "keep", string(b))
}

// mustEmptyDir checks that dir is still an empty directory, not replaced
// by a link nor removed.
func mustEmptyDir(t *testing.T, dir string) {
	t.Helper()
	fi, err := os.Lstat(dir)
	must.NoError(t, err, must.Sprintf("%s was removed", dir))
	must.True(t, fi.IsDir(), must.Sprintf("%s is now %s", dir, fi.Mode()))
	entries, err := os.ReadDir(dir)
	must.NoError(t, err)
	must.SliceEmpty(t, entries, must.Sprintf("something was created in %s", dir))
}

// Volume and snapshot IDs in a state file shared with other processes
// (and so maybe tampered with) are not followed out of the state dir:
// deleting or snapshotting them removes and reads nothing outside.
func TestStore_HostileIDsInStateStayInStateDir(t *testing.T) {
	base := t.TempDir()
	stateDir := filepath.Join(base, "a", "state")
	// <state>/volumes/../../victim and <state>/snapshots/../../victim
	// are both base/a/victim.
	victim := filepath.Join(base, "a", "victim")
	sentinel(t, victim)
	cfg, _ := testConfig(t, stateDir, "node-a")
	p := startPlugin(t, cfg)
	c := dial(t, p)
	const hostile = "../../victim"
	must.NoError(t, p.store.update(func(st *state) error {
		st.Volumes[hostile] = &volume{ID: hostile, Name: "hostile", CapacityBytes: 1}
		st.Snapshots[hostile] = &snapshot{ID: hostile, Name: "hostile", SourceVolumeID: hostile}
		return nil
	}))
	ctx := context.Background()

	_, err := c.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: hostile})
	mustSentinel(t, victim)
	mustCode(t, codes.InvalidArgument, err)

	_, err = c.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: hostile})
	mustSentinel(t, victim)
	mustCode(t, codes.InvalidArgument, err)

	// A snapshot of it would copy the outside directory in.
	_, err = c.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "copy", SourceVolumeId: hostile})
	mustCode(t, codes.InvalidArgument, err)
	entries, err := os.ReadDir(filepath.Join(stateDir, snapshotsDir))
	must.NoError(t, err)
	must.SliceEmpty(t, entries, must.Sprint("data from outside the state dir was copied into a snapshot"))

	// A volume restored from it likewise.
	_, err = c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "restored", VolumeCapabilities: []*csi.VolumeCapability{singleWriter},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: hostile},
		}},
	})
	mustCode(t, codes.InvalidArgument, err)
	mustSentinel(t, victim)
}

// With a target root, staging and target paths outside it are refused,
// and so is a target reached through a link inside it that leads out:
// nothing outside the root is created, replaced or removed.
func TestNode_TargetRootConfines(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "co")
	outside := filepath.Join(base, "outside") // empty: publish would replace it, unpublish remove it
	must.NoError(t, os.MkdirAll(root, 0o755))
	must.NoError(t, os.MkdirAll(outside, 0o755))
	cfg, _ := testConfig(t, t.TempDir(), "node-a")
	cfg.TargetRoot = root
	c := dial(t, startPlugin(t, cfg))
	ctx := context.Background()
	vol := createVolume(t, c, "vol", mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER))
	dev, err := publish(ctx, c, vol, "node-a", mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER))
	must.NoError(t, err)
	vc := mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)

	staging := filepath.Join(root, "staging")
	_, err = c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: vol, StagingTargetPath: staging, VolumeCapability: vc, PublishContext: map[string]string{"device": dev},
	})
	must.NoError(t, err)

	// The task's link inside the root, to the directory outside.
	must.NoError(t, os.Symlink(outside, filepath.Join(root, "alloc")))
	for _, target := range []string{
		outside,
		filepath.Join(root, "..", "outside"),
		filepath.Join(root, "alloc", "target"),
		filepath.Join(root, "alloc"),
	} {
		_, err = c.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
			VolumeId: vol, StagingTargetPath: staging, TargetPath: target, VolumeCapability: vc,
		})
		mustEmptyDir(t, outside)
		must.Error(t, err, must.Sprintf("publish at %s", target))

		_, err = c.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target})
		mustEmptyDir(t, outside)
		must.Error(t, err, must.Sprintf("unpublish at %s", target))
	}
	// A staging path outside is refused too, though staging writes
	// nothing there.
	_, err = c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: vol, StagingTargetPath: outside, VolumeCapability: vc, PublishContext: map[string]string{"device": dev},
	})
	mustCode(t, codes.InvalidArgument, err)

	// Inside the root, all as usual.
	target := filepath.Join(root, "per-alloc", "a1", "vol")
	_, err = c.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: vol, StagingTargetPath: staging, TargetPath: target, VolumeCapability: vc,
	})
	must.NoError(t, err)
	fi, err := os.Lstat(target)
	must.NoError(t, err)
	must.True(t, fi.Mode()&os.ModeSymlink != 0)
	unpublishAndUnstage(t, c, vol, staging, target)
	_, err = os.Lstat(target)
	must.ErrorIs(t, err, os.ErrNotExist)
}

// A target or staging path inside the plugin's state dir is refused, with
// or without a target root: an unpublish there would remove a volume's
// data dir (an empty one is removed as a leftover target), a publish
// replace it with a link.
func TestNode_StateDirIsNoTarget(t *testing.T) {
	stateDir := t.TempDir()
	cfg, _ := testConfig(t, stateDir, "node-a")
	c := dial(t, startPlugin(t, cfg))
	ctx := context.Background()
	vol := createVolume(t, c, "vol", singleWriter)
	other := createVolume(t, c, "other", singleWriter)
	otherDir := filepath.Join(stateDir, volumesDir, other)
	mustEmptyDir(t, otherDir)

	_, err := c.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: otherDir})
	mustEmptyDir(t, otherDir)
	mustCode(t, codes.InvalidArgument, err)

	dev, err := publish(ctx, c, vol, "node-a", singleWriter)
	must.NoError(t, err)
	_, err = c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: vol, StagingTargetPath: filepath.Join(stateDir, "staging"), VolumeCapability: singleWriter,
		PublishContext: map[string]string{"device": dev},
	})
	mustCode(t, codes.InvalidArgument, err)
	staging := filepath.Join(t.TempDir(), "staging")
	_, err = c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: vol, StagingTargetPath: staging, VolumeCapability: singleWriter,
		PublishContext: map[string]string{"device": dev},
	})
	must.NoError(t, err)
	_, err = c.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: vol, StagingTargetPath: staging, TargetPath: otherDir, VolumeCapability: singleWriter,
	})
	mustEmptyDir(t, otherDir)
	mustCode(t, codes.InvalidArgument, err)

	// A relative path or one with a NUL is no path at all.
	for _, bad := range []string{"relative/target", "/tmp/a\x00b"} {
		_, err = c.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: bad})
		mustCode(t, codes.InvalidArgument, err)
	}
}

func TestEntryName(t *testing.T) {
	for _, ok := range []string{"vol-0123", "snap-ab", "data[2]", "a..b"} {
		must.NoError(t, entryName("volume ID", ok))
	}
	for _, bad := range []string{"", ".", "..", "../x", "a/b", `a\b`, "/abs", "a\x00"} {
		must.ErrorIs(t, entryName("volume ID", bad), errNotEntryName, must.Sprintf("%q", bad))
	}
}
