package hostpath

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
	"google.golang.org/grpc/codes"
)

func TestControllerPublish_DevicePoolAndLimit(t *testing.T) {
	cfg, _ := testConfig(t, t.TempDir(), "node-a")
	cfg.MaxVolumesPerNode = 3
	c := dial(t, startPlugin(t, cfg))

	info, err := c.node.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
	must.NoError(t, err)
	must.Eq(t, "node-a", info.GetNodeId())
	must.Eq(t, 3, info.GetMaxVolumesPerNode())

	var vols []string
	for i := range 4 {
		vols = append(vols, createVolume(t, c, fmt.Sprintf("vol-%d", i), singleWriter))
	}
	for i, want := range []string{"/dev/roam00", "/dev/roam01", "/dev/roam02"} {
		dev, err := publish(context.Background(), c, vols[i], "node-a", singleWriter)
		must.NoError(t, err)
		must.Eq(t, want, dev)
	}

	_, err = publish(context.Background(), c, vols[3], "node-a", singleWriter)
	mustCode(t, codes.ResourceExhausted, err)
	must.SliceEmpty(t, publishedNodes(t, c, vols[3]))

	// Detaching frees the device name, and the next attach takes the lowest
	// free one, as a cloud provider's device allocator would.
	unpublish(t, c, vols[1], "node-a")
	dev, err := publish(context.Background(), c, vols[3], "node-a", singleWriter)
	must.NoError(t, err)
	must.Eq(t, "/dev/roam01", dev)
}

func TestControllerPublish_IdempotentAndCompatible(t *testing.T) {
	stateDir := t.TempDir()
	cfg, _ := testConfig(t, stateDir, "node-a")
	c := dial(t, startPlugin(t, cfg))
	vol := createVolume(t, c, "vol", singleWriter)

	first, err := publish(context.Background(), c, vol, "node-a", singleWriter)
	must.NoError(t, err)
	again, err := publish(context.Background(), c, vol, "node-a", singleWriter)
	must.NoError(t, err)
	must.Eq(t, first, again)
	must.Eq(t, []string{"node-a"}, publishedNodes(t, c, vol))

	// Same node, different readonly flag: incompatible.
	_, err = c.ctrl.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{
		VolumeId: vol, NodeId: "node-a", VolumeCapability: singleWriter, Readonly: true,
	})
	mustCode(t, codes.AlreadyExists, err)

	// A volume cannot be deleted while attached.
	_, err = c.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: vol})
	mustCode(t, codes.FailedPrecondition, err)

	// Unpublish is idempotent, also for unknown volumes and nodes.
	unpublish(t, c, vol, "node-a")
	unpublish(t, c, vol, "node-a")
	unpublish(t, c, "no-such-volume", "node-a")
	unpublish(t, c, vol, "no-such-node")
	must.SliceEmpty(t, publishedNodes(t, c, vol))

	_, err = c.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: vol})
	must.NoError(t, err)

	calls, err := ReadCalls(stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, map[string]int64{
		"CreateVolume":              1,
		"ControllerPublishVolume":   3,
		"ControllerUnpublishVolume": 4,
		"DeleteVolume":              2,
	}, calls)
}

func TestControllerPublish_NotFound(t *testing.T) {
	cfg, _ := testConfig(t, t.TempDir(), "node-a")
	c := dial(t, startPlugin(t, cfg))
	vol := createVolume(t, c, "vol", singleWriter)

	_, err := publish(context.Background(), c, "no-such-volume", "node-a", singleWriter)
	mustCode(t, codes.NotFound, err)
	_, err = publish(context.Background(), c, vol, "no-such-node", singleWriter)
	mustCode(t, codes.NotFound, err)
	_, err = publish(context.Background(), c, vol, "", singleWriter)
	mustCode(t, codes.InvalidArgument, err)
}

// TestControllerPublish_SingleNodeAttachedElsewhere uses two plugin
// instances, as two processes on one machine would be: a monolith on node-a
// and a node plugin on node-b, sharing a state dir.
func TestControllerPublish_SingleNodeAttachedElsewhere(t *testing.T) {
	stateDir := t.TempDir()
	cfgA, _ := testConfig(t, stateDir, "node-a")
	a := dial(t, startPlugin(t, cfgA))
	cfgB, _ := testConfig(t, stateDir, "node-b")
	cfgB.Mode = ModeNode
	startPlugin(t, cfgB)

	single := createVolume(t, a, "single", singleWriter)
	_, err := publish(context.Background(), a, single, "node-a", singleWriter)
	must.NoError(t, err)
	_, err = publish(context.Background(), a, single, "node-b", singleWriter)
	mustCode(t, codes.FailedPrecondition, err)
	// Asking for a multi-node mode does not get around a single-node
	// attachment either.
	_, err = publish(context.Background(), a, single, "node-b", mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER))
	mustCode(t, codes.FailedPrecondition, err)

	// Once detached from node-a it can move to node-b.
	unpublish(t, a, single, "node-a")
	_, err = publish(context.Background(), a, single, "node-b", singleWriter)
	must.NoError(t, err)
	must.Eq(t, []string{"node-b"}, publishedNodes(t, a, single))

	multi := mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	shared := createVolume(t, a, "shared", multi)
	for _, n := range []string{"node-a", "node-b"} {
		_, err := publish(context.Background(), a, shared, n, multi)
		must.NoError(t, err)
	}
	must.Eq(t, []string{"node-a", "node-b"}, publishedNodes(t, a, shared))

	// Unpublish without a node ID detaches from every node.
	_, err = a.ctrl.ControllerUnpublishVolume(context.Background(), &csi.ControllerUnpublishVolumeRequest{VolumeId: shared})
	must.NoError(t, err)
	must.SliceEmpty(t, publishedNodes(t, a, shared))
}

func TestControllerPublish_LatencyHonoursCancellation(t *testing.T) {
	cfg, _ := testConfig(t, t.TempDir(), "node-a")
	cfg.PublishLatency = time.Hour
	p := startPlugin(t, cfg)
	c := dial(t, p)
	vol := createVolume(t, c, "vol", singleWriter)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := publish(ctx, c, vol, "node-a", singleWriter)
	mustCode(t, codes.DeadlineExceeded, err)

	ctx, cancel = context.WithCancel(context.Background())
	errCh := make(chan error, 1)
	go func() {
		_, err := publish(ctx, c, vol, "node-a", singleWriter)
		errCh <- err
	}()
	must.Wait(t, waitInFlight(p, 1))
	cancel()
	mustCode(t, codes.Canceled, <-errCh)

	// The handlers themselves returned (the plugin saw the cancellation),
	// and neither call attached anything.
	must.Wait(t, waitInFlight(p, 0))
	must.SliceEmpty(t, publishedNodes(t, c, vol))
	must.Eq(t, 0, p.Overlaps())
}

func TestControllerPublish_LatencyDelaysTheCall(t *testing.T) {
	cfg, _ := testConfig(t, t.TempDir(), "node-a")
	cfg.PublishLatency = 200 * time.Millisecond
	c := dial(t, startPlugin(t, cfg))
	vol := createVolume(t, c, "vol", singleWriter)

	start := time.Now()
	_, err := publish(context.Background(), c, vol, "node-a", singleWriter)
	must.NoError(t, err)
	must.GreaterEq(t, cfg.PublishLatency, time.Since(start))

	start = time.Now()
	unpublish(t, c, vol, "node-a")
	must.GreaterEq(t, cfg.PublishLatency, time.Since(start))
}

func TestCreateVolume_NameIdempotencyAndSnapshots(t *testing.T) {
	cfg, _ := testConfig(t, t.TempDir(), "node-a")
	c := dial(t, startPlugin(t, cfg))
	ctx := context.Background()

	req := &csi.CreateVolumeRequest{
		Name:               "data",
		VolumeCapabilities: []*csi.VolumeCapability{singleWriter},
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 1 << 20},
	}
	first, err := c.ctrl.CreateVolume(ctx, req)
	must.NoError(t, err)
	again, err := c.ctrl.CreateVolume(ctx, req)
	must.NoError(t, err)
	must.Eq(t, first.GetVolume().GetVolumeId(), again.GetVolume().GetVolumeId())

	req.CapacityRange = &csi.CapacityRange{RequiredBytes: 2 << 20}
	_, err = c.ctrl.CreateVolume(ctx, req)
	mustCode(t, codes.AlreadyExists, err)

	block := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	_, err = c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "blk", VolumeCapabilities: []*csi.VolumeCapability{block}})
	mustCode(t, codes.InvalidArgument, err)

	snap, err := c.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: first.GetVolume().GetVolumeId()})
	must.NoError(t, err)
	must.True(t, snap.GetSnapshot().GetReadyToUse())
	restored, err := c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               "restored",
		VolumeCapabilities: []*csi.VolumeCapability{singleWriter},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()},
		}},
	})
	must.NoError(t, err)
	must.Eq(t, snap.GetSnapshot().GetSnapshotId(), restored.GetVolume().GetContentSource().GetSnapshot().GetSnapshotId())
}

// waitInFlight waits for the number of destructive calls in flight in p.
func waitInFlight(p *Plugin, want int64) *wait.Constraint {
	return wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			if got := p.tracker.inFlight.Load(); got != want {
				return fmt.Errorf("%d destructive calls in flight, want %d", got, want)
			}
			return nil
		}),
		wait.Timeout(10*time.Second),
		wait.Gap(5*time.Millisecond),
	)
}

// A new volume's root is writable by any user, whatever the umask (the
// usual 022 would make it 0755), so a task run as nobody can write to the
// volume it claims.
func TestCreateVolume_RootIsWorldWritable(t *testing.T) {
	stateDir := t.TempDir()
	cfg, _ := testConfig(t, stateDir, "node-a")
	c := dial(t, startPlugin(t, cfg))
	v, err := c.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name: "shared", VolumeCapabilities: []*csi.VolumeCapability{singleWriter},
	})
	must.NoError(t, err)
	st, err := newStore(stateDir)
	must.NoError(t, err)
	dir, err := st.volumeDir(v.GetVolume().GetVolumeId())
	must.NoError(t, err)
	fi, err := os.Stat(dir)
	must.NoError(t, err)
	must.Eq(t, os.FileMode(0o777), fi.Mode().Perm())
}
