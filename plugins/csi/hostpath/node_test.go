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

// stageAndPublish stages a volume on c's node and publishes it at target.
func stageAndPublish(t *testing.T, c clients, volID, device, staging, target string) {
	t.Helper()
	_, err := c.node.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
		VolumeId:          volID,
		PublishContext:    map[string]string{"device": device},
		StagingTargetPath: staging,
		VolumeCapability:  singleWriter,
	})
	must.NoError(t, err)
	_, err = c.node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
		VolumeId:          volID,
		PublishContext:    map[string]string{"device": device},
		StagingTargetPath: staging,
		TargetPath:        target,
		VolumeCapability:  singleWriter,
	})
	must.NoError(t, err)
}

func unpublishAndUnstage(t *testing.T, c clients, volID, staging, target string) {
	t.Helper()
	_, err := c.node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: volID, TargetPath: target})
	must.NoError(t, err)
	_, err = c.node.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: volID, StagingTargetPath: staging})
	must.NoError(t, err)
}

// TestNode_TwoNodesSeeTheSameData moves a volume between two plugin
// instances sharing a state dir: what a task wrote on node-a is there on
// node-b, like a network disk.
func TestNode_TwoNodesSeeTheSameData(t *testing.T) {
	stateDir := t.TempDir()
	cfgA, _ := testConfig(t, stateDir, "node-a")
	a := dial(t, startPlugin(t, cfgA))
	cfgB, _ := testConfig(t, stateDir, "node-b")
	cfgB.Mode = ModeNode
	b := dial(t, startPlugin(t, cfgB))

	vol := createVolume(t, a, "data", singleWriter)
	dir := t.TempDir()
	stagingA, targetA := filepath.Join(dir, "a", "staging"), filepath.Join(dir, "a", "alloc", "target")
	stagingB, targetB := filepath.Join(dir, "b", "staging"), filepath.Join(dir, "b", "alloc", "target")

	devA, err := publish(context.Background(), a, vol, "node-a", singleWriter)
	must.NoError(t, err)
	stageAndPublish(t, a, vol, devA, stagingA, targetA)
	fi, err := os.Lstat(targetA)
	must.NoError(t, err)
	must.True(t, fi.Mode()&os.ModeSymlink != 0, must.Sprint("target path is not a symlink"))
	must.NoError(t, os.WriteFile(filepath.Join(targetA, "hello.txt"), []byte("written on node-a"), 0o644))

	unpublishAndUnstage(t, a, vol, stagingA, targetA)
	_, err = os.Lstat(targetA)
	must.ErrorIs(t, err, os.ErrNotExist)
	unpublish(t, a, vol, "node-a")

	// node-b cannot stage what is not attached to it.
	_, err = b.node.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
		VolumeId: vol, StagingTargetPath: stagingB, VolumeCapability: singleWriter,
	})
	mustCode(t, codes.FailedPrecondition, err)

	devB, err := publish(context.Background(), a, vol, "node-b", singleWriter)
	must.NoError(t, err)
	// An empty directory at the target (as a CO may create) is replaced.
	must.NoError(t, os.MkdirAll(targetB, 0o755))
	stageAndPublish(t, b, vol, devB, stagingB, targetB)
	got, err := os.ReadFile(filepath.Join(targetB, "hello.txt"))
	must.NoError(t, err)
	must.Eq(t, "written on node-a", string(got))

	unpublishAndUnstage(t, b, vol, stagingB, targetB)
	_, err = os.Lstat(targetB)
	must.ErrorIs(t, err, os.ErrNotExist)
}

func TestNode_StageAndPublishChecks(t *testing.T) {
	cfg, _ := testConfig(t, t.TempDir(), "node-a")
	c := dial(t, startPlugin(t, cfg))
	ctx := context.Background()
	vol := createVolume(t, c, "vol", singleWriter)
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")

	dev, err := publish(ctx, c, vol, "node-a", singleWriter)
	must.NoError(t, err)

	// The publish context's device must be the one attached.
	_, err = c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: vol, StagingTargetPath: staging, VolumeCapability: singleWriter,
		PublishContext: map[string]string{"device": "/dev/roam99"},
	})
	mustCode(t, codes.FailedPrecondition, err)

	// Publishing needs staging first.
	_, err = c.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: vol, StagingTargetPath: staging, TargetPath: target, VolumeCapability: singleWriter,
	})
	mustCode(t, codes.FailedPrecondition, err)

	// A non-empty directory at the target is not ours to replace.
	must.NoError(t, os.MkdirAll(target, 0o755))
	must.NoError(t, os.WriteFile(filepath.Join(target, "keep"), nil, 0o644))
	_, err = c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: vol, StagingTargetPath: staging, VolumeCapability: singleWriter,
		PublishContext: map[string]string{"device": dev},
	})
	must.NoError(t, err)
	_, err = c.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: vol, StagingTargetPath: staging, TargetPath: target, VolumeCapability: singleWriter,
	})
	mustCode(t, codes.FailedPrecondition, err)
	must.NoError(t, os.RemoveAll(target))

	// Publish is idempotent; a different readonly flag at the same target
	// is not compatible.
	for range 2 {
		_, err = c.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
			VolumeId: vol, StagingTargetPath: staging, TargetPath: target, VolumeCapability: singleWriter,
		})
		must.NoError(t, err)
	}
	_, err = c.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: vol, StagingTargetPath: staging, TargetPath: target, VolumeCapability: singleWriter, Readonly: true,
	})
	mustCode(t, codes.AlreadyExists, err)

	// Unstaging while published is refused, as unmounting a busy device
	// would be.
	_, err = c.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging})
	mustCode(t, codes.FailedPrecondition, err)

	unpublishAndUnstage(t, c, vol, staging, target)
	// Both are idempotent.
	unpublishAndUnstage(t, c, vol, staging, target)
}
