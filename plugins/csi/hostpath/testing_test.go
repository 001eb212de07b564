package hostpath

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// lockedBuffer collects log output from many goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testConfig is a monolith config with its socket in a fresh temp dir and
// logs captured in the returned buffer (printed if the test fails).
func testConfig(t *testing.T, stateDir, nodeID string) (*Config, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("plugin %s logs:\n%s", nodeID, logs.String())
		}
	})
	cfg := DefaultConfig()
	cfg.Endpoint = "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	cfg.NodeID = nodeID
	cfg.StateDir = stateDir
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: logs})
	return cfg, logs
}

// startPlugin starts a plugin and stops it when the test ends.
func startPlugin(t *testing.T, cfg *Config) *Plugin {
	t.Helper()
	p, err := New(cfg)
	must.NoError(t, err)
	must.NoError(t, p.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		must.NoError(t, p.Stop(ctx))
	})
	return p
}

// clients are the CSI clients of one plugin.
type clients struct {
	id   csi.IdentityClient
	ctrl csi.ControllerClient
	node csi.NodeClient
}

func dial(t *testing.T, p *Plugin) clients {
	t.Helper()
	conn, err := grpc.NewClient(p.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	must.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return clients{
		id:   csi.NewIdentityClient(conn),
		ctrl: csi.NewControllerClient(conn),
		node: csi.NewNodeClient(conn),
	}
}

func mountCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

var singleWriter = mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

func createVolume(t *testing.T, c clients, name string, vc *csi.VolumeCapability) string {
	t.Helper()
	resp, err := c.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name:               name,
		VolumeCapabilities: []*csi.VolumeCapability{vc},
	})
	must.NoError(t, err)
	return resp.GetVolume().GetVolumeId()
}

func publish(ctx context.Context, c clients, volID, nodeID string, vc *csi.VolumeCapability) (string, error) {
	resp, err := c.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
		VolumeId:         volID,
		NodeId:           nodeID,
		VolumeCapability: vc,
	})
	return resp.GetPublishContext()["device"], err
}

func unpublish(t *testing.T, c clients, volID, nodeID string) {
	t.Helper()
	_, err := c.ctrl.ControllerUnpublishVolume(context.Background(), &csi.ControllerUnpublishVolumeRequest{
		VolumeId: volID,
		NodeId:   nodeID,
	})
	must.NoError(t, err)
}

// mustCode asserts that err is a gRPC status with code want.
func mustCode(t *testing.T, want codes.Code, err error) {
	t.Helper()
	must.Error(t, err)
	must.Eq(t, want, status.Code(err), must.Sprintf("error: %v", err))
}

// publishedNodes lists the nodes a volume is attached to.
func publishedNodes(t *testing.T, c clients, volID string) []string {
	t.Helper()
	resp, err := c.ctrl.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	must.NoError(t, err)
	for _, e := range resp.GetEntries() {
		if e.GetVolume().GetVolumeId() == volID {
			return e.GetStatus().GetPublishedNodeIds()
		}
	}
	t.Fatalf("volume %s not listed", volID)
	return nil
}

func countLines(s, substr string) int {
	n := 0
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}
