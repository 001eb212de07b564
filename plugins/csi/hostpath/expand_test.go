package hostpath

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/shoenig/test/must"
	"google.golang.org/grpc/codes"
)

// TestExpand_FileSystemGrowsOnTheNode: ControllerExpandVolume grows the
// device only; the size a task sees in the volume changes when the node
// expands the published volume, and a node expand past the device is
// refused.
func TestExpand_FileSystemGrowsOnTheNode(t *testing.T) {
	stateDir := t.TempDir()
	cfg, _ := testConfig(t, stateDir, "node-a")
	c := dial(t, startPlugin(t, cfg))
	ctx := context.Background()
	resp, err := c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "grow", VolumeCapabilities: []*csi.VolumeCapability{singleWriter},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20},
	})
	must.NoError(t, err)
	vol := resp.GetVolume().GetVolumeId()
	dev, err := publish(ctx, c, vol, "node-a", singleWriter)
	must.NoError(t, err)
	base := t.TempDir()
	staging, target := filepath.Join(base, "staging"), filepath.Join(base, "target")
	stageAndPublish(t, c, vol, dev, staging, target)
	fsSize := func() string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(target, FSSizeFile))
		must.NoError(t, err)
		return strings.TrimSpace(string(b))
	}
	must.Eq(t, "1048576", fsSize())

	cresp, err := c.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
		VolumeId: vol, CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20},
	})
	must.NoError(t, err)
	must.Eq(t, int64(4<<20), cresp.GetCapacityBytes())
	must.True(t, cresp.GetNodeExpansionRequired())
	must.Eq(t, "1048576", fsSize(), must.Sprint("the device grew, not the file system"))

	_, err = c.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
		VolumeId: vol, VolumePath: target, CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20},
	})
	mustCode(t, codes.OutOfRange, err)
	_, err = c.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
		VolumeId: vol, VolumePath: filepath.Join(base, "elsewhere"), CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20},
	})
	mustCode(t, codes.NotFound, err)
	nresp, err := c.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
		VolumeId: vol, VolumePath: target, CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20},
	})
	must.NoError(t, err)
	must.Eq(t, int64(4<<20), nresp.GetCapacityBytes())
	must.Eq(t, "4194304", fsSize())
}

// TestCreate_CloneCopiesTheData: a clone holds the source's bytes at the
// time of the clone, at least the source's size, and an unknown source is
// NOT_FOUND.
func TestCreate_CloneCopiesTheData(t *testing.T) {
	stateDir := t.TempDir()
	cfg, _ := testConfig(t, stateDir, "node-a")
	c := dial(t, startPlugin(t, cfg))
	ctx := context.Background()
	resp, err := c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "src", VolumeCapabilities: []*csi.VolumeCapability{singleWriter},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20},
	})
	must.NoError(t, err)
	src := resp.GetVolume().GetVolumeId()
	must.NoError(t, os.WriteFile(filepath.Join(stateDir, volumesDir, src, "token"), []byte("hello"), 0o644))

	clone := func(name, source string) (*csi.CreateVolumeResponse, error) {
		return c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: name, VolumeCapabilities: []*csi.VolumeCapability{singleWriter},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
				Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: source}}},
		})
	}
	cresp, err := clone("copy", src)
	must.NoError(t, err)
	copyID := cresp.GetVolume().GetVolumeId()
	must.Eq(t, int64(2<<20), cresp.GetVolume().GetCapacityBytes())
	must.Eq(t, src, cresp.GetVolume().GetContentSource().GetVolume().GetVolumeId())
	b, err := os.ReadFile(filepath.Join(stateDir, volumesDir, copyID, "token"))
	must.NoError(t, err)
	must.Eq(t, "hello", string(b))

	// The copy is its own: a later write to the source does not show.
	must.NoError(t, os.WriteFile(filepath.Join(stateDir, volumesDir, src, "token"), []byte("changed"), 0o644))
	b, err = os.ReadFile(filepath.Join(stateDir, volumesDir, copyID, "token"))
	must.NoError(t, err)
	must.Eq(t, "hello", string(b))

	// Idempotent by name, and a different source under the name is refused.
	again, err := clone("copy", src)
	must.NoError(t, err)
	must.Eq(t, copyID, again.GetVolume().GetVolumeId())
	_, err = c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "copy", VolumeCapabilities: []*csi.VolumeCapability{singleWriter},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}})
	mustCode(t, codes.AlreadyExists, err)

	_, err = clone("nowhere", "vol-missing")
	mustCode(t, codes.NotFound, err)
}

// TestZones: a node in a zone reports it; a volume created with a zone
// requirement lives in that zone and attaches only to its nodes.
func TestZones(t *testing.T) {
	stateDir := t.TempDir()
	cfgA, _ := testConfig(t, stateDir, "node-a")
	cfgA.Zone = "a"
	cfgB, _ := testConfig(t, stateDir, "node-b")
	cfgB.Zone = "b"
	a := dial(t, startPlugin(t, cfgA))
	startPlugin(t, cfgB)
	ctx := context.Background()

	info, err := a.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	must.NoError(t, err)
	must.Eq(t, map[string]string{TopologyZoneKey: "a"}, info.GetAccessibleTopology().GetSegments())
	caps, err := a.id.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	must.NoError(t, err)
	found := false
	for _, c := range caps.GetCapabilities() {
		if c.GetService().GetType() == csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS {
			found = true
		}
	}
	must.True(t, found)

	zoneB := &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{TopologyZoneKey: "b"}}}}
	resp, err := a.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "zonal", VolumeCapabilities: []*csi.VolumeCapability{singleWriter}, AccessibilityRequirements: zoneB,
	})
	must.NoError(t, err)
	vol := resp.GetVolume()
	must.SliceLen(t, 1, vol.GetAccessibleTopology())
	must.Eq(t, "b", vol.GetAccessibleTopology()[0].GetSegments()[TopologyZoneKey])

	_, err = publish(ctx, a, vol.GetVolumeId(), "node-a", singleWriter)
	mustCode(t, codes.FailedPrecondition, err)
	_, err = publish(ctx, a, vol.GetVolumeId(), "node-b", singleWriter)
	must.NoError(t, err)

	_, err = a.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "odd", VolumeCapabilities: []*csi.VolumeCapability{singleWriter},
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{"rack": "1"}}}},
	})
	mustCode(t, codes.InvalidArgument, err)
}
