package client

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/plugins/csi/hostpath"
	"github.com/roamhq/roam/structs"
)

// syncLog collects a plugin's log lines from its goroutines.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), substr)
}

// twoPluginSetup is one client's volume manager over two monolith plugins,
// hpa and hpb, each its own storage provider (state dir), with hpa's logs
// kept so a test can see when its calls hang.
type twoPluginSetup struct {
	stateDirs map[string]string
	ep        *ClientCSI
	vols      *csiVolumeManager
	logA      *syncLog
}

func newTwoPluginSetup(t *testing.T, nodeCallTimeout time.Duration) *twoPluginSetup {
	t.Helper()
	s := &twoPluginSetup{stateDirs: map[string]string{"hpa": t.TempDir(), "hpb": t.TempDir()}, logA: &syncLog{}}
	mgr := testCSIManager(t, nil)
	for _, id := range []string{"hpa", "hpb"} {
		p := testHostpath(t, hostpath.ModeMonolith, "node-h", s.stateDirs[id], func(c *hostpath.Config) {
			if id == "hpa" {
				c.Logger = hclog.New(&hclog.LoggerOptions{Name: id, Level: hclog.Warn, Output: s.logA})
			}
		})
		addPlugin(t, mgr, id, CSIPluginTypeMonolith, p)
	}
	waitCSI(t, mgr, "both plugins healthy", func(_, node map[string]*structs.CSIInfo) bool {
		return healthy(node, "hpa") && healthy(node, "hpb")
	})
	s.vols = newCSIVolumeManager(csiVolumeManagerConfig{
		DataDir: t.TempDir(),
		Plugins: mgr,
		Claim: func(ctx context.Context, alloc *structs.Allocation, req *structs.VolumeRequest) (*CSIMountClaim, error) {
			// Source is "<plugin>/<external ID>".
			pluginID, ext, _ := strings.Cut(req.Source, "/")
			var resp structs.ClientCSIControllerAttachVolumeResponse
			areq := attachRequest(pluginID, ext, "node-h")
			if err := s.ep.controllerAttachVolume(ctx, areq, &resp); err != nil {
				return nil, err
			}
			return &CSIMountClaim{
				Volume:         &structs.CSIVolume{ID: "roam-" + ext, ExternalID: ext, PluginID: pluginID},
				PublishContext: resp.PublishContext,
			}, nil
		},
		NodeCallTimeout: nodeCallTimeout,
		Logger:          hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn}),
	})
	s.ep = &ClientCSI{mgr: mgr, vols: s.vols}
	return s
}

// mount creates a volume of pluginID and mounts it for allocID; it returns
// the detach request the server would send for it.
func (s *twoPluginSetup) mount(t *testing.T, pluginID, allocID string) *structs.ClientCSINodeDetachVolumeRequest {
	t.Helper()
	ext := createVolume(t, s.ep, pluginID, allocID)
	_, err := s.vols.Mount(context.Background(), &structs.Allocation{ID: allocID}, volumeRequest(pluginID+"/"+ext))
	must.NoError(t, err)
	return &structs.ClientCSINodeDetachVolumeRequest{PluginID: pluginID, VolumeID: "roam-" + ext, ExternalID: ext, AllocID: allocID}
}

// published reports whether the volume is still published on the node.
func (s *twoPluginSetup) published(t *testing.T, req *structs.ClientCSINodeDetachVolumeRequest) bool {
	t.Helper()
	return len(readHostpathState(t, s.stateDirs[req.PluginID]).Nodes["node-h"].Published[req.ExternalID]) > 0
}

// A node plugin whose NodeUnpublishVolume hangs holds up only its own
// volume: the server's NodeDetachVolume for it returns, after the client's
// node call timeout, an error saying the plugin did not finish, while
// another plugin's volume is detached and a new volume of the hung plugin
// is mounted in the meantime. With the plugin well again, the retried
// detach succeeds.
func TestClientCSI_HungNodePluginDelaysOnlyItsVolumes(t *testing.T) {
	const timeout = 2 * time.Second
	s := newTwoPluginSetup(t, timeout)
	reqA := s.mount(t, "hpa", "alloc-a")
	reqB := s.mount(t, "hpb", "alloc-b")

	must.NoError(t, hostpath.SetFault(s.stateDirs["hpa"], "", hostpath.FaultHangNodeUnpublish, hostpath.FaultUntilCancel))
	type result struct {
		err  error
		took time.Duration
		at   time.Time
	}
	doneA := make(chan result, 1)
	startA := time.Now()
	go func() {
		err := s.ep.NodeDetachVolume(reqA, &structs.ClientCSINodeDetachVolumeResponse{})
		doneA <- result{err, time.Since(startA), time.Now()}
	}()
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return s.logA.count("fault injected: call hangs") >= 1 }),
		wait.Timeout(10*time.Second),
		wait.Gap(5*time.Millisecond),
	), must.Sprint("plugin hpa never started hanging"))

	// Meanwhile: hpb's volume detaches, and hpa mounts another volume.
	startB := time.Now()
	must.NoError(t, s.ep.NodeDetachVolume(reqB, &structs.ClientCSINodeDetachVolumeResponse{}))
	tookB := time.Since(startB)
	doneB := time.Now()
	must.False(t, s.published(t, reqB))
	reqA2 := s.mount(t, "hpa", "alloc-a2")
	mountedA2 := time.Now()

	var a result
	select {
	case a = <-doneA:
	case <-time.After(15 * timeout):
		t.Fatalf("hpa's detach did not return within %s of a %s node call timeout", 15*timeout, timeout)
	}
	t.Logf("hung detach of hpa took %s; hpb's detach took %s meanwhile", a.took.Round(time.Millisecond), tookB.Round(time.Millisecond))
	must.ErrorIs(t, a.err, structs.ErrCSIUnavailable, must.Sprintf("hung detach: %v", a.err))
	must.True(t, doneB.Before(a.at), must.Sprint("hpb's detach waited for hpa's hung one"))
	must.True(t, mountedA2.Before(a.at), must.Sprint("a mount on hpa waited for its hung unpublish"))
	must.GreaterEq(t, timeout, a.took, must.Sprint("the hung detach returned before the node call timeout"))
	must.True(t, s.published(t, reqA), must.Sprint("the failed detach must leave the volume as it was"))

	// Well again: the detach the server retries goes through.
	must.NoError(t, hostpath.SetFault(s.stateDirs["hpa"], "", hostpath.FaultHangNodeUnpublish, ""))
	must.NoError(t, s.ep.NodeDetachVolume(reqA, &structs.ClientCSINodeDetachVolumeResponse{}))
	must.False(t, s.published(t, reqA))
	must.True(t, s.published(t, reqA2))
}

// The client's own unmount (an allocation that stopped) is bounded the same
// way: it fails with ErrCSIUnavailable, keeps the mount recorded, and a
// second unmount once the plugin is well releases it.
func TestCSIVolumes_UnmountHungPluginTimesOut(t *testing.T) {
	const timeout = time.Second
	s := newTwoPluginSetup(t, timeout)
	reqA := s.mount(t, "hpa", "alloc-a")
	alloc := &structs.Allocation{ID: "alloc-a"}

	must.NoError(t, hostpath.SetFault(s.stateDirs["hpa"], "", hostpath.FaultHangNodeUnpublish, hostpath.FaultUntilCancel))
	errCh := make(chan error, 1)
	go func() { errCh <- s.vols.Unmount(context.Background(), alloc) }()
	var err error
	select {
	case err = <-errCh:
	case <-time.After(15 * timeout):
		t.Fatalf("unmount on a hung plugin did not return within %s of a %s node call timeout", 15*timeout, timeout)
	}
	must.ErrorIs(t, err, structs.ErrCSIUnavailable)
	must.True(t, s.published(t, reqA))

	must.NoError(t, hostpath.SetFault(s.stateDirs["hpa"], "", hostpath.FaultHangNodeUnpublish, ""))
	must.NoError(t, s.vols.Unmount(context.Background(), alloc))
	must.False(t, s.published(t, reqA))
}

// Waiting for a volume's turn is bounded like a plugin call, and says the
// same thing: not done, may be retried.
func TestCSIVolumes_LockWaitIsUnavailable(t *testing.T) {
	m := newCSIVolumeManager(csiVolumeManagerConfig{DataDir: t.TempDir()})
	_, unlock, err := m.lock(context.Background(), "hp", "vol")
	must.NoError(t, err)
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, _, err = m.lock(ctx, "hp", "vol")
	must.ErrorIs(t, err, structs.ErrCSIUnavailable)
	must.True(t, errors.Is(err, context.DeadlineExceeded))
}
