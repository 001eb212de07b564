package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/rpc"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/plugins/csi/hostpath"
	"github.com/roamhq/roam/structs"
)

// testHostpath starts a built-in plugin process on a socket in a temp dir
// and stops it when the test ends.
func testHostpath(t *testing.T, mode hostpath.Mode, nodeID, stateDir string, fn func(*hostpath.Config)) *hostpath.Plugin {
	t.Helper()
	cfg := hostpath.DefaultConfig()
	cfg.Mode = mode
	cfg.NodeID = nodeID
	cfg.StateDir = stateDir
	cfg.Endpoint = "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: nodeID, Level: hclog.Error})
	if fn != nil {
		fn(cfg)
	}
	p, err := hostpath.New(cfg)
	must.NoError(t, err)
	must.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	return p
}

// testCSIManager starts a manager with fast timers, counting OnChange.
func testCSIManager(t *testing.T, changes *atomic.Int64) *csiManager {
	t.Helper()
	m := newCSIManager(csiManagerConfig{
		FingerprintInterval:   50 * time.Millisecond,
		ControllerCallTimeout: 30 * time.Second,
		OnChange: func() {
			if changes != nil {
				changes.Add(1)
			}
		},
		Logger: hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn}),
	})
	t.Cleanup(func() { must.NoError(t, m.shutdown(context.Background())) })
	return m
}

func addPlugin(t *testing.T, m *csiManager, id, typ string, p *hostpath.Plugin) {
	t.Helper()
	must.NoError(t, m.AddPlugin(&CSIPluginConfig{ID: id, Type: typ, Socket: p.Endpoint()}))
}

// hostpathEndpoint starts a monolith plugin "hp" for nodeID on a state
// dir of its own, with fn's changes to its config, behind a manager and the
// ClientCSI service; it returns the state dir too.
func hostpathEndpoint(t *testing.T, nodeID string, fn func(*hostpath.Config)) (string, *csiManager, *ClientCSI) {
	t.Helper()
	dir := t.TempDir()
	p := testHostpath(t, hostpath.ModeMonolith, nodeID, dir, fn)
	m := testCSIManager(t, nil)
	addPlugin(t, m, "hp", CSIPluginTypeMonolith, p)
	return dir, m, &ClientCSI{mgr: m}
}

// waitPublishCalls waits until nodeID's plugin on dir has started n
// ControllerPublishVolume calls.
func waitPublishCalls(t *testing.T, dir, nodeID string, n int64) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		calls, err := hostpath.ReadCalls(dir, nodeID)
		return err == nil && calls["ControllerPublishVolume"] == n
	}), wait.Timeout(5*time.Second), wait.Gap(5*time.Millisecond)))
}

// waitCSI waits until the manager's fingerprints satisfy ok.
func waitCSI(t *testing.T, m *csiManager, desc string, ok func(ctrl, node map[string]*structs.CSIInfo) bool) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return ok(m.Infos()) }),
		wait.Timeout(10*time.Second),
		wait.Gap(10*time.Millisecond),
	), must.Sprint(desc))
}

func healthy(infos map[string]*structs.CSIInfo, id string) bool {
	return infos[id] != nil && infos[id].Healthy
}

// hostpathState is the part of the plugin's state.json the tests read.
type hostpathState struct {
	Nodes map[string]struct {
		Attachments map[string]struct {
			Device string `json:"device"`
		} `json:"attachments"`
		Staged    map[string]string         `json:"staged"`
		Published map[string]map[string]any `json:"published"`
	} `json:"nodes"`
}

func readHostpathState(t *testing.T, stateDir string) *hostpathState {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stateDir, "state.json"))
	must.NoError(t, err)
	var st hostpathState
	must.NoError(t, json.Unmarshal(b, &st))
	return &st
}

// createVolume creates a volume through the handler and returns its ID.
func createVolume(t *testing.T, ep *ClientCSI, pluginID, name string) string {
	t.Helper()
	var resp structs.ClientCSIControllerCreateVolumeResponse
	must.NoError(t, ep.ControllerCreateVolume(&structs.ClientCSIControllerCreateVolumeRequest{
		PluginID: pluginID,
		Name:     name,
		Capabilities: []*structs.CSIVolumeCapability{{
			AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
		}},
		CapacityMin: 1 << 20,
	}, &resp))
	must.NotEq(t, "", resp.ExternalVolumeID)
	return resp.ExternalVolumeID
}

func attachRequest(pluginID, volID, nodeID string) *structs.ClientCSIControllerAttachVolumeRequest {
	return &structs.ClientCSIControllerAttachVolumeRequest{
		PluginID:        pluginID,
		VolumeID:        volID,
		ClientCSINodeID: nodeID,
		AccessMode:      structs.CSIAccessModeSingleNodeWriter,
		AttachmentMode:  structs.CSIAttachmentModeFilesystem,
	}
}

func TestCSIManager_FingerprintMonolith(t *testing.T) {
	p := testHostpath(t, hostpath.ModeMonolith, "node-a", t.TempDir(), func(c *hostpath.Config) { c.MaxVolumesPerNode = 7 })
	var changes atomic.Int64
	m := testCSIManager(t, &changes)
	addPlugin(t, m, "hp", CSIPluginTypeMonolith, p)

	waitCSI(t, m, "controller and node healthy", func(ctrl, node map[string]*structs.CSIInfo) bool {
		return healthy(ctrl, "hp") && healthy(node, "hp")
	})
	ctrl, node := m.Infos()
	c := ctrl["hp"]
	must.Eq(t, hostpath.PluginName, c.Provider)
	must.True(t, c.RequiresControllerPlugin)
	must.NotNil(t, c.ControllerInfo)
	must.True(t, c.ControllerInfo.SupportsAttachDetach)
	must.True(t, c.ControllerInfo.SupportsCreateDelete)
	n := node["hp"]
	must.NotNil(t, n.NodeInfo)
	must.Eq(t, &structs.CSINodeInfo{ID: "node-a", MaxVolumes: 7, RequiresNodeStageVolume: true}, n.NodeInfo)
	must.Positive(t, changes.Load())

	// Nothing changes on later fingerprints, so nothing is reported.
	before := changes.Load()
	waitCSI(t, m, "a later fingerprint", func(ctrl, _ map[string]*structs.CSIInfo) bool {
		return ctrl["hp"].UpdateTime.After(c.UpdateTime)
	})
	must.Eq(t, before, changes.Load())
}

func TestCSIManager_SplitControllerAndNode(t *testing.T) {
	stateDir := t.TempDir()
	ctrlPlugin := testHostpath(t, hostpath.ModeController, "ctrl", stateDir, nil)
	nodePlugin := testHostpath(t, hostpath.ModeNode, "node-b", stateDir, nil)
	ctrlMgr := testCSIManager(t, nil)
	nodeMgr := testCSIManager(t, nil)
	addPlugin(t, ctrlMgr, "hp", CSIPluginTypeController, ctrlPlugin)
	addPlugin(t, nodeMgr, "hp", CSIPluginTypeNode, nodePlugin)

	waitCSI(t, ctrlMgr, "controller healthy", func(ctrl, node map[string]*structs.CSIInfo) bool {
		return healthy(ctrl, "hp") && len(node) == 0
	})
	waitCSI(t, nodeMgr, "node healthy", func(ctrl, node map[string]*structs.CSIInfo) bool {
		return healthy(node, "hp") && len(ctrl) == 0
	})
	_, node := nodeMgr.Infos()
	must.Eq(t, "node-b", node["hp"].NodeInfo.ID)
	must.True(t, node["hp"].NodeInfo.RequiresNodeStageVolume)

	// The controller on one client attaches to the node on the other.
	ep := &ClientCSI{mgr: ctrlMgr}
	vol := createVolume(t, ep, "hp", "split-vol")
	var resp structs.ClientCSIControllerAttachVolumeResponse
	must.NoError(t, ep.ControllerAttachVolume(attachRequest("hp", vol, "node-b"), &resp))
	must.Eq(t, "/dev/roam00", resp.PublishContext["device"])

	// A node-only plugin has no controller lane.
	err := (&ClientCSI{mgr: nodeMgr}).ControllerAttachVolume(attachRequest("hp", vol, "node-b"), &resp)
	must.ErrorIs(t, err, structs.ErrCSIPluginNotFound)
}

func TestClient_CSIPluginHealthReachesServerAtOnce(t *testing.T) {
	p := testHostpath(t, hostpath.ModeMonolith, "node-c", t.TempDir(), nil)
	srv := testServer(t, nil)
	cfg := TestConfig(t, srv.Addr())
	cfg.CSIFingerprintInterval = 50 * time.Millisecond
	cfg.CSIPlugins = map[string]*CSIPluginConfig{
		"hp": {ID: "hp", Type: CSIPluginTypeMonolith, Socket: p.Endpoint()},
	}
	c := testClient(t, cfg)
	waitRegistered(t, c)

	node := waitForNode(t, srv, c.NodeID(), 10*time.Second, "csi plugin healthy", func(n *structs.Node) bool {
		return n != nil && n.CSINodePlugins["hp"] != nil && n.CSINodePlugins["hp"].Healthy &&
			n.CSIControllerPlugins["hp"] != nil && n.CSIControllerPlugins["hp"].Healthy
	})
	must.Eq(t, int64(16), node.CSINodePlugins["hp"].NodeInfo.MaxVolumes)
	must.True(t, node.CSINodePlugins["hp"].NodeInfo.RequiresNodeStageVolume)

	// Heartbeats do not carry the node; only a re-register can get this
	// to the server.
	must.NoError(t, p.Stop(context.Background()))
	node = waitForNode(t, srv, c.NodeID(), 10*time.Second, "csi plugin unhealthy", func(n *structs.Node) bool {
		return n != nil && n.CSINodePlugins["hp"] != nil && !n.CSINodePlugins["hp"].Healthy
	})
	must.False(t, node.CSIControllerPlugins["hp"].Healthy)
	must.Eq(t, "node-c", node.CSINodePlugins["hp"].NodeInfo.ID, must.Sprint("last known node info kept"))
}

func TestClientCSI_ControllerAttachVolume(t *testing.T) {
	dir, _, ep := hostpathEndpoint(t, "node-d", nil)

	vol := createVolume(t, ep, "hp", "vol-1")
	var resp structs.ClientCSIControllerAttachVolumeResponse
	must.NoError(t, ep.ControllerAttachVolume(attachRequest("hp", vol, "node-d"), &resp))
	must.Eq(t, map[string]string{"device": "/dev/roam00"}, resp.PublishContext)

	// Errors arrive translated once, and survive a trip over RPC as their
	// code.
	err := ep.ControllerAttachVolume(attachRequest("hp", "no-such-volume", "node-d"), &resp)
	must.ErrorIs(t, err, structs.ErrCSINotFound)
	must.ErrorIs(t, structs.FromRPCError(rpc.ServerError(structs.EncodeRPCError(err))), structs.ErrCSINotFound)

	var detach structs.ClientCSIControllerDetachVolumeResponse
	must.NoError(t, ep.ControllerDetachVolume(&structs.ClientCSIControllerDetachVolumeRequest{
		PluginID: "hp", VolumeID: vol, ClientCSINodeID: "node-d",
	}, &detach))
	must.MapEmpty(t, readHostpathState(t, dir).Nodes["node-d"].Attachments)
}

func TestClientCSI_UnknownPlugin(t *testing.T) {
	m := testCSIManager(t, nil)
	ep := &ClientCSI{mgr: m}
	var resp structs.ClientCSIControllerAttachVolumeResponse
	err := ep.ControllerAttachVolume(attachRequest("nope", "v", "n"), &resp)
	must.ErrorIs(t, err, structs.ErrCSIPluginNotFound)
	must.ErrorIs(t, structs.FromRPCError(rpc.ServerError(structs.EncodeRPCError(err))), structs.ErrCSIPluginNotFound)
	var snaps structs.ClientCSIControllerListSnapshotsResponse
	must.ErrorIs(t, ep.ControllerListSnapshots(&structs.ClientCSIControllerListSnapshotsRequest{PluginID: "nope"}, &snaps),
		structs.ErrCSIPluginNotFound)
	var detach structs.ClientCSINodeDetachVolumeResponse
	must.ErrorIs(t, ep.NodeDetachVolume(&structs.ClientCSINodeDetachVolumeRequest{PluginID: "nope"}, &detach),
		structs.ErrCSIPluginNotFound)
}

// attachConcurrently attaches n fresh volumes to nodeID at once with attach
// and fails the test on any error.
func attachConcurrently(t *testing.T, vols []string, attach func(vol string) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(vols))
	for _, v := range vols {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- attach(v)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must.NoError(t, err)
	}
}

func TestClientCSI_LaneSerializesControllerCalls(t *testing.T) {
	const n = 20
	latency := func(c *hostpath.Config) {
		c.PublishLatency = 20 * time.Millisecond
		c.MaxVolumesPerNode = 2 * n
	}

	// Through the handler: the lane lets one call at a time reach the plugin.
	dir := t.TempDir()
	p := testHostpath(t, hostpath.ModeMonolith, "node-e", dir, latency)
	m := testCSIManager(t, nil)
	addPlugin(t, m, "hp", CSIPluginTypeMonolith, p)
	ep := &ClientCSI{mgr: m}
	vols := make([]string, n)
	for i := range vols {
		vols[i] = createVolume(t, ep, "hp", fmt.Sprintf("lane-%d", i))
	}
	attachConcurrently(t, vols, func(vol string) error {
		var resp structs.ClientCSIControllerAttachVolumeResponse
		return ep.ControllerAttachVolume(attachRequest("hp", vol, "node-e"), &resp)
	})
	overlaps, err := hostpath.ReadOverlaps(dir, "node-e")
	must.NoError(t, err)
	must.Eq(t, int64(0), overlaps)
	calls, err := hostpath.ReadCalls(dir, "node-e")
	must.NoError(t, err)
	must.Eq(t, int64(n), calls["ControllerPublishVolume"])

	// Control: the same calls straight to a plugin overlap, so the detector
	// would have caught a lane that let them through.
	cdir := t.TempDir()
	cp := testHostpath(t, hostpath.ModeMonolith, "node-f", cdir, latency)
	cm := testCSIManager(t, nil)
	addPlugin(t, cm, "hp", CSIPluginTypeMonolith, cp)
	cep := &ClientCSI{mgr: cm}
	cvols := make([]string, n)
	for i := range cvols {
		cvols[i] = createVolume(t, cep, "hp", fmt.Sprintf("direct-%d", i))
	}
	direct, err := dialCSIPlugin(cp.Endpoint())
	must.NoError(t, err)
	t.Cleanup(func() { _ = direct.close() })
	vc, err := csiVolumeCapability(structs.CSIAccessModeSingleNodeWriter, structs.CSIAttachmentModeFilesystem, nil)
	must.NoError(t, err)
	attachConcurrently(t, cvols, func(vol string) error {
		_, err := direct.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{
			VolumeId: vol, NodeId: "node-f", VolumeCapability: vc,
		})
		return err
	})
	overlaps, err = hostpath.ReadOverlaps(cdir, "node-f")
	must.NoError(t, err)
	must.Positive(t, overlaps)
}

func TestClientCSI_CallerCancelDoesNotCutCall(t *testing.T) {
	dir, _, ep := hostpathEndpoint(t, "node-g", func(c *hostpath.Config) {
		c.PublishLatency = 300 * time.Millisecond
	})
	vol := createVolume(t, ep, "hp", "cancelled")
	vol2 := createVolume(t, ep, "hp", "next")

	ctx, cancel := context.WithCancel(context.Background())
	errCh := make(chan error, 1)
	go func() {
		var resp structs.ClientCSIControllerAttachVolumeResponse
		errCh <- ep.controllerAttachVolume(ctx, attachRequest("hp", vol, "node-g"), &resp)
	}()
	// Cancel once the call has reached the plugin, as a departing leader's
	// session would end mid-call.
	waitPublishCalls(t, dir, "node-g", 1)
	cancel()
	err := <-errCh
	must.ErrorIs(t, err, context.Canceled)
	must.ErrorIs(t, err, structs.ErrCSIUnavailable)

	// The next call for the plugin, from anyone, starts only after the
	// first finished; by then the first volume is attached.
	var resp structs.ClientCSIControllerAttachVolumeResponse
	must.NoError(t, ep.ControllerAttachVolume(attachRequest("hp", vol2, "node-g"), &resp))
	st := readHostpathState(t, dir)
	must.Eq(t, "/dev/roam00", st.Nodes["node-g"].Attachments[vol].Device)
	must.Eq(t, "/dev/roam01", st.Nodes["node-g"].Attachments[vol2].Device)
	overlaps, err := hostpath.ReadOverlaps(dir, "node-g")
	must.NoError(t, err)
	must.Eq(t, int64(0), overlaps)
}

// testVolumeSetup is a controller plugin and a node plugin on one state
// dir, a client's volume manager on the node plugin, and a claim function
// that attaches through the controller as the server's claim will.
type testVolumeSetup struct {
	stateDir string
	ep       *ClientCSI
	vols     *csiVolumeManager
	claims   atomic.Int64
}

func newTestVolumeSetup(t *testing.T) *testVolumeSetup {
	t.Helper()
	s := &testVolumeSetup{stateDir: t.TempDir()}
	ctrlPlugin := testHostpath(t, hostpath.ModeController, "ctrl", s.stateDir, nil)
	nodePlugin := testHostpath(t, hostpath.ModeNode, "node-h", s.stateDir, nil)
	ctrlMgr := testCSIManager(t, nil)
	addPlugin(t, ctrlMgr, "hp", CSIPluginTypeController, ctrlPlugin)
	nodeMgr := testCSIManager(t, nil)
	addPlugin(t, nodeMgr, "hp", CSIPluginTypeNode, nodePlugin)
	s.ep = &ClientCSI{mgr: ctrlMgr}
	s.vols = newCSIVolumeManager(csiVolumeManagerConfig{
		DataDir: t.TempDir(),
		Plugins: nodeMgr,
		Claim: func(ctx context.Context, alloc *structs.Allocation, req *structs.VolumeRequest) (*CSIMountClaim, error) {
			s.claims.Add(1)
			var resp structs.ClientCSIControllerAttachVolumeResponse
			areq := attachRequest("hp", req.Source, "node-h")
			areq.AccessMode, areq.AttachmentMode = req.AccessMode, req.AttachmentMode
			if err := s.ep.controllerAttachVolume(ctx, areq, &resp); err != nil {
				return nil, err
			}
			return &CSIMountClaim{
				Volume:         &structs.CSIVolume{ID: "roam-" + req.Source, ExternalID: req.Source, PluginID: "hp"},
				PublishContext: resp.PublishContext,
			}, nil
		},
		Logger: hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn}),
	})
	return s
}

func volumeRequest(ext string) map[string]*structs.VolumeRequest {
	return map[string]*structs.VolumeRequest{"data": {
		Name: "data", Type: "csi", Source: ext,
		AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
	}}
}

func TestCSIVolumes_RoundTrip(t *testing.T) {
	s := newTestVolumeSetup(t)
	ext := createVolume(t, s.ep, "hp", "round-trip")
	alloc := &structs.Allocation{ID: "alloc-1"}

	paths, err := s.vols.Mount(context.Background(), alloc, volumeRequest(ext))
	must.NoError(t, err)
	must.Eq(t, filepath.Join(s.vols.cfg.DataDir, "csi", "hp", "per-alloc", "alloc-1", "roam-"+ext), paths["data"])
	st := readHostpathState(t, s.stateDir).Nodes["node-h"]
	must.Eq(t, filepath.Join(s.vols.cfg.DataDir, "csi", "hp", "staging", "roam-"+ext), st.Staged[ext])

	// Data written through the published path lands in the volume.
	must.NoError(t, os.WriteFile(filepath.Join(paths["data"], "hello.txt"), []byte("hi"), 0o644))
	b, err := os.ReadFile(filepath.Join(s.stateDir, "volumes", ext, "hello.txt"))
	must.NoError(t, err)
	must.Eq(t, "hi", string(b))

	must.NoError(t, s.vols.Unmount(context.Background(), alloc))
	st = readHostpathState(t, s.stateDir).Nodes["node-h"]
	must.MapEmpty(t, st.Staged)
	must.MapEmpty(t, st.Published)
	_, err = os.Lstat(paths["data"])
	must.True(t, errors.Is(err, os.ErrNotExist))

	// A second unmount has nothing left to do.
	must.NoError(t, s.vols.Unmount(context.Background(), alloc))
}

func TestCSIVolumes_SharedVolumeUnstagesAfterLastUser(t *testing.T) {
	s := newTestVolumeSetup(t)
	ext := createVolume(t, s.ep, "hp", "shared")
	a1, a2 := &structs.Allocation{ID: "alloc-1"}, &structs.Allocation{ID: "alloc-2"}

	// Both mounts at once: operations on one volume take turns.
	var wg sync.WaitGroup
	for _, a := range []*structs.Allocation{a1, a2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.vols.Mount(context.Background(), a, volumeRequest(ext))
			must.NoError(t, err)
		}()
	}
	wg.Wait()
	st := readHostpathState(t, s.stateDir).Nodes["node-h"]
	must.MapLen(t, 2, st.Published[ext])
	must.MapContainsKey(t, st.Staged, ext)

	must.NoError(t, s.vols.Unmount(context.Background(), a1))
	st = readHostpathState(t, s.stateDir).Nodes["node-h"]
	must.MapLen(t, 1, st.Published[ext])
	must.MapContainsKey(t, st.Staged, ext, must.Sprint("still staged for the second allocation"))

	must.NoError(t, s.vols.Unmount(context.Background(), a2))
	st = readHostpathState(t, s.stateDir).Nodes["node-h"]
	must.MapEmpty(t, st.Published)
	must.MapEmpty(t, st.Staged)
}

func TestClientCSI_NodeDetachVolume(t *testing.T) {
	s := newTestVolumeSetup(t)
	ext := createVolume(t, s.ep, "hp", "detach")
	alloc := &structs.Allocation{ID: "alloc-1"}
	_, err := s.vols.Mount(context.Background(), alloc, volumeRequest(ext))
	must.NoError(t, err)

	ep := &ClientCSI{mgr: s.vols.cfg.Plugins, vols: s.vols}
	req := &structs.ClientCSINodeDetachVolumeRequest{PluginID: "hp", VolumeID: "roam-" + ext, ExternalID: ext, AllocID: "alloc-1"}
	var resp structs.ClientCSINodeDetachVolumeResponse
	must.NoError(t, ep.NodeDetachVolume(req, &resp))
	st := readHostpathState(t, s.stateDir).Nodes["node-h"]
	must.MapEmpty(t, st.Published)
	must.MapEmpty(t, st.Staged)
	// Again, with no record left: NOT_FOUND and "not staged" count as done.
	must.NoError(t, ep.NodeDetachVolume(req, &resp))
}

// lateNodePlugin is a volume manager on a node whose plugin is not yet
// registered, sharing s's controller and claim; released counts the claims
// it gave back.
func lateNodePlugin(t *testing.T, s *testVolumeSetup, wait time.Duration) (vols *csiVolumeManager, register func(), released *atomic.Int64) {
	t.Helper()
	mgr := testCSIManager(t, nil)
	released = &atomic.Int64{}
	vols = newCSIVolumeManager(csiVolumeManagerConfig{
		DataDir: t.TempDir(),
		Plugins: mgr,
		Claim:   s.vols.cfg.Claim,
		Release: func(context.Context, *structs.Allocation, string) error {
			released.Add(1)
			return nil
		},
		PluginWait: wait,
		Logger:     hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn}),
	})
	register = func() {
		addPlugin(t, mgr, "hp", CSIPluginTypeNode, testHostpath(t, hostpath.ModeNode, "node-h", s.stateDir, nil))
	}
	return vols, register, released
}

// A mount whose node plugin is still starting waits for it, bounded, and
// gives the claim back only when it never comes.
func TestCSIVolumes_MountWaitsForNodePlugin(t *testing.T) {
	s := newTestVolumeSetup(t)
	ext := createVolume(t, s.ep, "hp", "late")
	vols, register, released := lateNodePlugin(t, s, time.Minute)

	done := make(chan error, 1)
	go func() {
		_, err := vols.Mount(context.Background(), &structs.Allocation{ID: "alloc-late"}, volumeRequest(ext))
		done <- err
	}()
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return s.claims.Load() == 1 }),
		wait.Timeout(10*time.Second), wait.Gap(5*time.Millisecond)))
	register()
	must.NoError(t, <-done)
	must.Eq(t, int64(0), released.Load())

	// With no plugin ever, the mount fails once the wait is over and the
	// claim of a new allocation goes back.
	never, _, gaveBack := lateNodePlugin(t, s, 50*time.Millisecond)
	ext2 := createVolume(t, s.ep, "hp", "never")
	_, err := never.Mount(context.Background(), &structs.Allocation{ID: "alloc-never"}, volumeRequest(ext2))
	must.ErrorIs(t, err, structs.ErrCSIPluginNotFound)
	must.StrContains(t, err.Error(), "waited 50ms")
	must.Eq(t, int64(1), gaveBack.Load())
}

// A restored allocation's volumes are re-established whatever it takes,
// and never released on the way: its tasks are running on them.
func TestCSIVolumes_RemountNeverReleases(t *testing.T) {
	s := newTestVolumeSetup(t)
	ext := createVolume(t, s.ep, "hp", "restored")
	vols, register, released := lateNodePlugin(t, s, time.Minute)

	done := make(chan error, 1)
	var paths map[string]string
	go func() {
		var err error
		paths, err = vols.Remount(context.Background(), &structs.Allocation{ID: "alloc-restored"}, volumeRequest(ext))
		done <- err
	}()
	// Claimed, and waiting for the plugin (restored alongside).
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return s.claims.Load() == 1 }),
		wait.Timeout(10*time.Second), wait.Gap(5*time.Millisecond)))
	register()
	must.NoError(t, <-done)
	must.Eq(t, int64(0), released.Load())
	must.Eq(t, filepath.Join(vols.cfg.DataDir, "csi", "hp", "per-alloc", "alloc-restored", "roam-"+ext), paths["data"])

	// A plugin that does not come back within the wait ends the remount,
	// still without releasing: the caller re-attaches the tasks anyway.
	gone, _, goneBack := lateNodePlugin(t, s, 20*time.Millisecond)
	_, err := gone.Remount(context.Background(), &structs.Allocation{ID: "alloc-no-plugin"}, volumeRequest(ext))
	must.ErrorIs(t, err, structs.ErrCSIPluginNotFound)
	must.Eq(t, int64(0), goneBack.Load())

	// Nor does a client that stops while it waits.
	stuck, _, stuckBack := lateNodePlugin(t, s, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	base := s.claims.Load()
	go func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for s.claims.Load() < base+1 {
			<-tick.C
		}
		cancel()
	}()
	_, err = stuck.Remount(ctx, &structs.Allocation{ID: "alloc-stuck"}, volumeRequest(ext))
	must.ErrorIs(t, err, context.Canceled)
	must.Eq(t, int64(0), stuckBack.Load())

	// A claim the servers refuse (the allocation stopped while the client
	// was down) is their answer: no retry, and still no release.
	refused, _, refusedBack := lateNodePlugin(t, s, 20*time.Millisecond)
	attempts := 0
	refused.cfg.Claim = func(context.Context, *structs.Allocation, *structs.VolumeRequest) (*CSIMountClaim, error) {
		attempts++
		return nil, fmt.Errorf("%w: allocation alloc-gone is terminal and may not claim volumes", structs.ErrInvalidRequest)
	}
	_, err = refused.Remount(context.Background(), &structs.Allocation{ID: "alloc-gone"}, volumeRequest(ext))
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.Eq(t, 1, attempts)
	must.Eq(t, int64(0), refusedBack.Load())
}

// A controller call to a plugin that has stopped never reaches it, and says
// so as an absent plugin (the servers then try the next controller), not
// as the plugin's answer.
func TestClientCSI_StoppedPluginIsAbsent(t *testing.T) {
	dir := t.TempDir()
	p := testHostpath(t, hostpath.ModeMonolith, "node-s", dir, nil)
	m := testCSIManager(t, nil)
	addPlugin(t, m, "hp", CSIPluginTypeMonolith, p)
	ep := &ClientCSI{mgr: m}
	vol := createVolume(t, ep, "hp", "stopped")

	must.NoError(t, p.Stop(context.Background()))
	var resp structs.ClientCSIControllerAttachVolumeResponse
	err := ep.ControllerAttachVolume(attachRequest("hp", vol, "node-s"), &resp)
	must.ErrorIs(t, err, structs.ErrCSIPluginNotFound)
	must.StrContains(t, err.Error(), `"hp"`)
	calls, err := hostpath.ReadCalls(dir, "node-s")
	must.NoError(t, err)
	must.Eq(t, int64(0), calls["ControllerPublishVolume"])
}

// A mount that fails after staging unstages before it gives the claim
// back: a release tells the servers the node let go of the volume, and
// they then detach it at the controller without asking the node again.
func TestCSIVolumes_FailedPublishUnstagesBeforeRelease(t *testing.T) {
	s := newTestVolumeSetup(t)
	ext := createVolume(t, s.ep, "hp", "half")
	var released atomic.Int64
	var stagedAtRelease bool
	s.vols.cfg.Release = func(context.Context, *structs.Allocation, string) error {
		released.Add(1)
		_, stagedAtRelease = readHostpathState(t, s.stateDir).Nodes["node-h"].Staged[ext]
		return nil
	}
	alloc := &structs.Allocation{ID: "alloc-half"}
	// A regular file where the plugin must publish makes NodePublishVolume
	// fail after NodeStageVolume succeeded.
	target, err := s.vols.targetPath("hp", alloc.ID, "roam-"+ext)
	must.NoError(t, err)
	must.NoError(t, os.MkdirAll(filepath.Dir(target), 0o700))
	must.NoError(t, os.WriteFile(target, []byte("in the way"), 0o600))

	_, err = s.vols.Mount(context.Background(), alloc, volumeRequest(ext))
	must.Error(t, err)
	log, cerr := hostpath.ReadCallLog(s.stateDir, "node-h")
	must.NoError(t, cerr)
	var seen []string
	for _, r := range log {
		seen = append(seen, r.Method)
	}
	must.SliceContains(t, seen, "NodeStageVolume", must.Sprint("the mount got as far as staging"))
	must.SliceContains(t, seen, "NodeUnstageVolume")
	must.Eq(t, int64(1), released.Load())
	must.False(t, stagedAtRelease, must.Sprint("released while the volume was still staged on the node"))
}

// A controller call from a leader term below one the client has seen is
// refused unrun, whether it arrives late or was queued in the lane when the
// newer term's call arrived; calls without a term (reads from outside a
// leader's lane) are not checked.
func TestClientCSI_StaleLeaderTermRefused(t *testing.T) {
	dir, m, ep := hostpathEndpoint(t, "node-t", func(c *hostpath.Config) {
		c.PublishLatency = 300 * time.Millisecond
	})
	vols := make(map[string]string)
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		vols[name] = createVolume(t, ep, "hp", "term-"+name)
	}
	attach := func(name string, term uint64) chan error {
		errCh := make(chan error, 1)
		req := attachRequest("hp", vols[name], "node-t")
		req.LeaderTerm = term
		go func() {
			var resp structs.ClientCSIControllerAttachVolumeResponse
			errCh <- ep.ControllerAttachVolume(req, &resp)
		}()
		return errCh
	}
	lane, err := m.controllerPlugin("hp")
	must.NoError(t, err)
	queued := func(n int) {
		must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
			lane.lane.mu.Lock()
			defer lane.lane.mu.Unlock()
			return len(lane.lane.queue) == n
		}), wait.Timeout(5*time.Second), wait.Gap(2*time.Millisecond)))
	}

	// Term 4's call runs; another of term 4 waits behind it; then term 5's
	// call arrives and waits behind both.
	a := attach("a", 4)
	waitPublishCalls(t, dir, "node-t", 1)
	b := attach("b", 4)
	queued(1)
	c := attach("c", 5)
	queued(2)

	must.NoError(t, <-a, must.Sprint("a call already running finishes"))
	err = <-b
	must.ErrorIs(t, err, structs.ErrStaleLeaderTerm, must.Sprint("term 4's queued call ran after term 5's arrived"))
	must.True(t, structs.IsRetryable(err))
	must.NoError(t, <-c)

	// Term 4 again, arriving now: refused at once.
	err = <-attach("d", 4)
	must.ErrorIs(t, err, structs.ErrStaleLeaderTerm)
	must.StrContains(t, err.Error(), "term 4")
	must.StrContains(t, err.Error(), "term 5")
	// No term: not checked.
	must.NoError(t, <-attach("e", 0))

	st := readHostpathState(t, dir)
	for name, want := range map[string]bool{"a": true, "b": false, "c": true, "d": false, "e": true} {
		_, attached := st.Nodes["node-t"].Attachments[vols[name]]
		must.Eq(t, want, attached, must.Sprintf("volume %s", name))
	}
	calls, err := hostpath.ReadCalls(dir, "node-t")
	must.NoError(t, err)
	must.Eq(t, int64(3), calls["ControllerPublishVolume"])
}

// A heartbeat answer's leader term counts as seen: a controller call from
// an earlier term that arrives after it is refused.
func TestClient_HeartbeatTermRefusesEarlierCalls(t *testing.T) {
	dir, m, ep := hostpathEndpoint(t, "node-h", nil)
	c := &Client{csi: m, logger: hclog.NewNullLogger()}
	vol := createVolume(t, ep, "hp", "hb")

	c.noteContact(time.Now(), &structs.NodeUpdateResponse{LeaderTerm: 7})
	c.noteContact(time.Now(), &structs.NodeUpdateResponse{LeaderTerm: 3}) // an older answer, late: ignored
	req := attachRequest("hp", vol, "node-h")
	req.LeaderTerm = 6
	var resp structs.ClientCSIControllerAttachVolumeResponse
	must.ErrorIs(t, ep.ControllerAttachVolume(req, &resp), structs.ErrStaleLeaderTerm)
	calls, err := hostpath.ReadCalls(dir, "node-h")
	must.NoError(t, err)
	must.Eq(t, int64(0), calls["ControllerPublishVolume"])

	req.LeaderTerm = 7
	must.NoError(t, ep.ControllerAttachVolume(req, &resp))
}

// The highest leader term survives a client restart (the state DB keeps
// it), so a deposed leader's call still on its way is refused by the
// restarted client too.
func TestCSIManager_LeaderTermSurvivesRestart(t *testing.T) {
	dataDir := t.TempDir()
	db, err := openStateDB(dataDir)
	must.NoError(t, err)
	m := newCSIManager(csiManagerConfig{SaveTerm: db.putLeaderTerm})
	must.NoError(t, m.admitTerm("hp", "ControllerPublishVolume", 9))
	must.NoError(t, m.shutdown(context.Background()))
	must.NoError(t, db.close())

	db, err = openStateDB(dataDir)
	must.NoError(t, err)
	t.Cleanup(func() { _ = db.close() })
	term, err := db.leaderTerm()
	must.NoError(t, err)
	must.Eq(t, uint64(9), term)
	m = newCSIManager(csiManagerConfig{LeaderTerm: term, SaveTerm: db.putLeaderTerm})
	t.Cleanup(func() { _ = m.shutdown(context.Background()) })
	must.ErrorIs(t, m.admitTerm("hp", "ControllerPublishVolume", 8), structs.ErrStaleLeaderTerm)
}

// A heartbeat answer that resets the term (servers rebuilt, whose terms
// started again) replaces it only if the client still holds the term it
// reported; one that raced a newer leader's call changes nothing.
func TestClient_HeartbeatResetsTermOfRebuiltServers(t *testing.T) {
	dataDir := t.TempDir()
	db, err := openStateDB(dataDir)
	must.NoError(t, err)
	t.Cleanup(func() { _ = db.close() })
	m := newCSIManager(csiManagerConfig{LeaderTerm: 40, SaveTerm: db.putLeaderTerm})
	t.Cleanup(func() { _ = m.shutdown(context.Background()) })
	c := &Client{csi: m, logger: hclog.NewNullLogger()}
	must.ErrorIs(t, m.admitTerm("hp", "ControllerPublishVolume", 2), structs.ErrStaleLeaderTerm)

	c.noteContact(time.Now(), &structs.NodeUpdateResponse{LeaderTerm: 2, LeaderTermResetFrom: 40})
	must.Eq(t, uint64(2), m.LeaderTerm())
	must.NoError(t, m.admitTerm("hp", "ControllerPublishVolume", 2))
	term, err := db.leaderTerm()
	must.NoError(t, err)
	must.Eq(t, uint64(2), term)

	// A newer leader's call came in between: a late reset is void.
	must.NoError(t, m.admitTerm("hp", "ControllerPublishVolume", 3))
	c.noteContact(time.Now(), &structs.NodeUpdateResponse{LeaderTerm: 1, LeaderTermResetFrom: 2})
	must.Eq(t, uint64(3), m.LeaderTerm())
	must.ErrorIs(t, m.admitTerm("hp", "ControllerPublishVolume", 2), structs.ErrStaleLeaderTerm)
}

// A client restarted with two allocations sharing a staged volume: the
// servers' NodeDetachVolume for the one that stopped must not unstage the
// volume under the other, whose tasks still run on it, before that one's
// Remount re-records it. The state DB's record of the mounts is what the
// restarted manager knows them by.
func TestCSIVolumes_DetachAfterRestartKeepsSharedStaging(t *testing.T) {
	s := newTestVolumeSetup(t)
	ext := createVolume(t, s.ep, "hp", "shared-restart")
	db, err := openStateDB(t.TempDir())
	must.NoError(t, err)
	t.Cleanup(func() { _ = db.close() })
	stopped := testAlloc("node-h", structs.JobTypeService, nil, shTask("t", "true"))
	running := testAlloc("node-h", structs.JobTypeService, nil, shTask("t", "true"))
	for _, a := range []*structs.Allocation{stopped, running} {
		must.NoError(t, db.putAlloc(a))
	}
	cfg := s.vols.cfg
	cfg.Store = db
	before := newCSIVolumeManager(cfg)
	for _, a := range []*structs.Allocation{stopped, running} {
		_, err := before.Mount(context.Background(), a, volumeRequest(ext))
		must.NoError(t, err)
	}

	// The client restarts: a new manager on the same data dir and DB.
	after := newCSIVolumeManager(cfg)
	ep := &ClientCSI{mgr: cfg.Plugins, vols: after}
	req := &structs.ClientCSINodeDetachVolumeRequest{PluginID: "hp", VolumeID: "roam-" + ext, ExternalID: ext, AllocID: stopped.ID}
	var resp structs.ClientCSINodeDetachVolumeResponse
	must.NoError(t, ep.NodeDetachVolume(req, &resp))
	st := readHostpathState(t, s.stateDir).Nodes["node-h"]
	must.MapContainsKey(t, st.Staged, ext, must.Sprint("unstaged under the running allocation"))
	must.MapLen(t, 1, st.Published[ext])

	// The running one's Remount re-establishes it; its stop then unstages
	// the volume, though this manager never staged it itself.
	_, err = after.Remount(context.Background(), running, volumeRequest(ext))
	must.NoError(t, err)
	must.NoError(t, after.Unmount(context.Background(), running))
	st = readHostpathState(t, s.stateDir).Nodes["node-h"]
	must.MapEmpty(t, st.Published)
	must.MapEmpty(t, st.Staged)
	mounts, errs := db.csiMounts()
	must.SliceEmpty(t, errs)
	must.MapEmpty(t, mounts)
}

// A restored allocation that is stopped before any Remount (the servers
// stopped it while the client was down) unstages the volume it was the
// last user of: the restarted manager does not know whether it is staged,
// and must not leave it staged behind the released claim.
func TestCSIVolumes_UnmountAfterRestartUnstages(t *testing.T) {
	s := newTestVolumeSetup(t)
	ext := createVolume(t, s.ep, "hp", "restart-unmount")
	db, err := openStateDB(t.TempDir())
	must.NoError(t, err)
	t.Cleanup(func() { _ = db.close() })
	alloc := testAlloc("node-h", structs.JobTypeService, nil, shTask("t", "true"))
	must.NoError(t, db.putAlloc(alloc))
	cfg := s.vols.cfg
	cfg.Store = db
	_, err = newCSIVolumeManager(cfg).Mount(context.Background(), alloc, volumeRequest(ext))
	must.NoError(t, err)

	after := newCSIVolumeManager(cfg)
	must.NoError(t, after.Unmount(context.Background(), alloc))
	st := readHostpathState(t, s.stateDir).Nodes["node-h"]
	must.MapEmpty(t, st.Published)
	must.MapEmpty(t, st.Staged, must.Sprint("left staged behind the released claim"))
}

// A create from a snapshot without capacity_min asks the plugin for the
// snapshot's size, not for 0 bytes: a plugin that, like most real ones,
// refuses a volume smaller than its snapshot creates it.
func TestClientCSI_CreateFromSnapshotAsksForItsSize(t *testing.T) {
	_, _, ep := hostpathEndpoint(t, "node-a", func(c *hostpath.Config) { c.StrictSourceSize = true })
	src := createVolume(t, ep, "hp", "source") // 1 MiB
	var snap structs.ClientCSIControllerCreateSnapshotResponse
	must.NoError(t, ep.ControllerCreateSnapshot(&structs.ClientCSIControllerCreateSnapshotRequest{
		PluginID: "hp", ExternalVolumeID: src, Name: "snap",
	}, &snap))
	must.Eq(t, int64(1<<20), snap.Snapshot.SizeBytes)

	create := func(name, snapshotID string, min, max int64) (*structs.ClientCSIControllerCreateVolumeResponse, error) {
		var resp structs.ClientCSIControllerCreateVolumeResponse
		err := ep.ControllerCreateVolume(&structs.ClientCSIControllerCreateVolumeRequest{
			PluginID: "hp", Name: name, SnapshotID: snapshotID, CapacityMin: min, CapacityMax: max,
			Capabilities: []*structs.CSIVolumeCapability{{
				AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
			}},
		}, &resp)
		return &resp, err
	}

	resp, err := create("restored", snap.Snapshot.ID, 0, 0)
	must.NoError(t, err)
	must.Eq(t, snap.Snapshot.SizeBytes, resp.CapacityBytes)

	// capacity_max alone still bounds it, and a snapshot over it is
	// refused by name before the plugin is asked to create anything.
	resp, err = create("bounded", snap.Snapshot.ID, 0, 2<<20)
	must.NoError(t, err)
	must.Eq(t, snap.Snapshot.SizeBytes, resp.CapacityBytes)
	_, err = create("too-small", snap.Snapshot.ID, 0, 1<<19)
	must.ErrorIs(t, err, structs.ErrCSIInvalidArgument)
	must.ErrorContains(t, err, fmt.Sprintf("snapshot %q is 1048576 bytes, more than capacity_max 524288", snap.Snapshot.ID))

	// An unknown snapshot is named as such.
	_, err = create("orphan", "snap-unknown", 0, 0)
	must.ErrorIs(t, err, structs.ErrCSINotFound)
	must.ErrorContains(t, err, `snapshot "snap-unknown": plugin "hp" lists no such snapshot`)

	// A capacity_min the caller gave is the caller's: under the snapshot's
	// size, the plugin refuses it.
	_, err = create("explicit", snap.Snapshot.ID, 1<<19, 0)
	must.ErrorIs(t, err, structs.ErrCSIInvalidArgument)
	must.ErrorContains(t, err, "greater than the requested volume size 524288")
}

// A leader's controller call runs only while the servers cannot have
// declared this node down: once they may (the lease lapses, no heartbeat
// having got through), the next leader may call another node's
// controller, so a call still running here is cancelled at the plugin,
// and one whose turn comes later is not run. A heartbeat that gets
// through extends a running call's lease.
func TestClientCSI_ControllerCallEndsWhenTheLeaseLapses(t *testing.T) {
	dir, m, ep := hostpathEndpoint(t, "node-a", func(c *hostpath.Config) { c.PublishLatency = time.Minute })
	var lease atomic.Int64 // UnixNano; 0: not known
	m.cfg.Lease = func() time.Time {
		if n := lease.Load(); n != 0 {
			return time.Unix(0, n)
		}
		return time.Time{}
	}
	waitCSI(t, m, "controller healthy", func(ctrl, _ map[string]*structs.CSIInfo) bool { return healthy(ctrl, "hp") })
	vol := createVolume(t, ep, "hp", "leased")
	attach := func() error {
		req := attachRequest("hp", vol, "node-a")
		req.LeaderTerm = 3
		var resp structs.ClientCSIControllerAttachVolumeResponse
		return ep.ControllerAttachVolume(req, &resp)
	}

	// Cut off mid-call: the call ends when the lease does, its outcome
	// unknown, not a minute later when the plugin would have finished.
	lease.Store(time.Now().Add(500 * time.Millisecond).UnixNano())
	start := time.Now()
	err := attach()
	must.ErrorIs(t, err, structs.ErrOutcomeUnknown)
	must.ErrorIs(t, err, errLeaseLapsed)
	must.Less(t, 20*time.Second, time.Since(start))

	// With the lease lapsed, a call is refused before it reaches the plugin.
	err = attach()
	must.ErrorIs(t, err, errLeaseLapsed)
	must.ErrorContains(t, err, "not run")
	calls, err := hostpath.ReadCalls(dir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(1), calls["ControllerPublishVolume"])

	// A heartbeat during the call extends its lease: it runs on.
	start = time.Now()
	lease.Store(start.Add(1500 * time.Millisecond).UnixNano())
	done := make(chan error, 1)
	go func() { done <- attach() }()
	waitPublishCalls(t, dir, "node-a", 2)
	extended := start.Add(4 * time.Second)
	lease.Store(extended.UnixNano())
	must.ErrorIs(t, <-done, errLeaseLapsed)
	must.False(t, time.Now().Before(extended), must.Sprint("the call ended at its first lease, not the extended one"))
	// Reads (term 0) are not bounded by the lease.
	lease.Store(time.Now().Add(-time.Second).UnixNano())
	var list structs.ClientCSIControllerListSnapshotsResponse
	must.NoError(t, ep.ControllerListSnapshots(&structs.ClientCSIControllerListSnapshotsRequest{PluginID: "hp"}, &list))
}

// A leader's call whose lease is near its end has this client heartbeat
// at once: after a leader change the new leader calls as soon as it has
// taken over, before the heartbeat loop's next turn, and a heartbeat that
// gets through lets the call run on. A lapsed lease renewed before the
// call's turn lets it run; one that cannot be renewed keeps it unrun.
func TestClientCSI_ControllerCallRenewsItsLease(t *testing.T) {
	dir, m, ep := hostpathEndpoint(t, "node-a", func(c *hostpath.Config) { c.PublishLatency = 1500 * time.Millisecond })
	var lease atomic.Int64
	m.cfg.Lease = func() time.Time { return time.Unix(0, lease.Load()) }
	var renewals atomic.Int32
	reachable := atomic.Bool{}
	m.cfg.Renew = func(ctx context.Context) error {
		renewals.Add(1)
		if !reachable.Load() {
			<-ctx.Done()
			return context.Cause(ctx)
		}
		lease.Store(time.Now().Add(10 * time.Second).UnixNano())
		return nil
	}
	waitCSI(t, m, "controller healthy", func(ctrl, _ map[string]*structs.CSIInfo) bool { return healthy(ctrl, "hp") })
	vol := createVolume(t, ep, "hp", "renewed")
	attach := func() error {
		req := attachRequest("hp", vol, "node-a")
		req.LeaderTerm = 3
		var resp structs.ClientCSIControllerAttachVolumeResponse
		return ep.ControllerAttachVolume(req, &resp)
	}

	// The lease ends mid-call; the heartbeat near its end gets through.
	reachable.Store(true)
	lease.Store(time.Now().Add(1200 * time.Millisecond).UnixNano())
	must.NoError(t, attach())
	must.Positive(t, renewals.Load())

	// Lapsed at the call's turn, renewed before it: the call runs.
	lease.Store(time.Now().Add(-time.Second).UnixNano())
	must.NoError(t, attach())

	// Lapsed, and no server answers: not run.
	reachable.Store(false)
	lease.Store(time.Now().Add(-time.Second).UnixNano())
	err := attach()
	must.ErrorIs(t, err, errLeaseLapsed)
	must.ErrorContains(t, err, "not run")
	calls, err := hostpath.ReadCalls(dir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(2), calls["ControllerPublishVolume"])
}

func TestControllerLease(t *testing.T) {
	last := time.Unix(1000, 0)
	cases := []struct {
		name      string
		last      time.Time
		free, ttl time.Duration
		want      time.Time
	}{
		{"unknown contact", time.Time{}, 20 * time.Second, 10 * time.Second, time.Time{}},
		{"unknown window", last, 0, 10 * time.Second, time.Time{}},
		{"window less the margin", last, 20 * time.Second, 10 * time.Second, last.Add(18 * time.Second)},
		{"short window, quarter margin", last, 4 * time.Second, time.Second, last.Add(3 * time.Second)},
		{"never less than the TTL", last, 20 * time.Second, 100 * time.Second, last.Add(100 * time.Second)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, controllerLease(tc.last, tc.free, tc.ttl))
		})
	}
}

func TestTermlessAdmitted(t *testing.T) {
	cases := []struct {
		method, minServer string
		refused           bool
	}{
		{"ControllerPublishVolume", "", false},      // a leader before the report: may be old
		{"ControllerPublishVolume", "0.1.0", false}, // an old server is in the cluster
		{"ControllerPublishVolume", "bogus", false},
		{"ControllerPublishVolume", "0.2.0", true},
		{"ControllerUnpublishVolume", "0.3.0", true},
		{"CreateVolume", "0.2.0", true},
		{"DeleteVolume", "0.2.0", true},
		{"ControllerExpandVolume", "0.2.0", true},
		{"CreateSnapshot", "0.2.0", true},
		{"DeleteSnapshot", "0.2.0", true},
		{"ListVolumes", "0.2.0", false}, // changes nothing: sent outside the lanes, without a term
		{"ValidateVolumeCapabilities", "0.2.0", false},
		{"ListSnapshots", "0.2.0", false},
	}
	for _, c := range cases {
		err := termlessAdmitted("hp", c.method, c.minServer)
		if c.refused {
			must.ErrorIs(t, err, structs.ErrStaleLeaderTerm, must.Sprintf("%s with servers at %q", c.method, c.minServer))
		} else {
			must.NoError(t, err, must.Sprintf("%s with servers at %q", c.method, c.minServer))
		}
	}
}

// A publish without a leader term runs while a server older than the
// lane-term gate may be in the cluster, and is refused, unrun, once the
// leader reports every server has it.
func TestClient_TermlessCallFencedOnceEveryServerSendsTerms(t *testing.T) {
	dir, m, ep := hostpathEndpoint(t, "node-g", nil)
	c := &Client{csi: m, logger: hclog.NewNullLogger()}
	vol := createVolume(t, ep, "hp", "gate")
	req := attachRequest("hp", vol, "node-g")
	req.LeaderTerm = 0
	var resp structs.ClientCSIControllerAttachVolumeResponse

	c.noteContact(time.Now(), &structs.NodeUpdateResponse{LeaderTerm: 3, MinServerVersion: "0.1.0"})
	must.NoError(t, ep.ControllerAttachVolume(req, &resp))
	calls, err := hostpath.ReadCalls(dir, "node-g")
	must.NoError(t, err)
	must.Eq(t, int64(1), calls["ControllerPublishVolume"])

	c.noteContact(time.Now(), &structs.NodeUpdateResponse{LeaderTerm: 3, MinServerVersion: structs.Version})
	err = ep.ControllerAttachVolume(req, &resp)
	must.ErrorIs(t, err, structs.ErrStaleLeaderTerm)
	must.ErrorContains(t, err, "carries no leader term")
	calls, err = hostpath.ReadCalls(dir, "node-g")
	must.NoError(t, err)
	must.Eq(t, int64(1), calls["ControllerPublishVolume"])

	req.LeaderTerm = 3
	must.NoError(t, ep.ControllerAttachVolume(req, &resp))
}
