package hostpath

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
	"google.golang.org/grpc/codes"
)

func TestConfig_Validate(t *testing.T) {
	good := func() *Config {
		c := DefaultConfig()
		c.Endpoint = "unix:///run/roam/csi.sock"
		c.NodeID = "node-1"
		c.StateDir = "/var/lib/roam/hostpath"
		return c
	}
	must.NoError(t, good().Validate())

	cases := map[string]func(*Config){
		"tcp endpoint":      func(c *Config) { c.Endpoint = "tcp://127.0.0.1:1234" },
		"relative endpoint": func(c *Config) { c.Endpoint = "unix://csi.sock" },
		"empty endpoint":    func(c *Config) { c.Endpoint = "" },
		"empty node ID":     func(c *Config) { c.NodeID = "" },
		"slash in node ID":  func(c *Config) { c.NodeID = "a/b" },
		"empty state dir":   func(c *Config) { c.StateDir = "" },
		"bad mode":          func(c *Config) { c.Mode = "both" },
		"negative latency":  func(c *Config) { c.PublishLatency = -time.Second },
		"negative max":      func(c *Config) { c.MaxVolumesPerNode = -1 },
	}
	for name, breakIt := range cases {
		t.Run(name, func(t *testing.T) {
			c := good()
			breakIt(c)
			must.ErrorIs(t, c.Validate(), ErrInvalidConfig)
		})
	}

	for _, ep := range []string{"unix:///a/b.sock", "unix:/a/b.sock", "/a/b.sock"} {
		path, err := socketPath(ep)
		must.NoError(t, err)
		must.Eq(t, "/a/b.sock", path)
	}
}

func TestPlugin_ModesServeTheirServices(t *testing.T) {
	stateDir := t.TempDir()
	for _, mode := range []Mode{ModeController, ModeNode, ModeMonolith} {
		t.Run(string(mode), func(t *testing.T) {
			cfg, _ := testConfig(t, stateDir, "node-"+string(mode))
			cfg.Mode = mode
			c := dial(t, startPlugin(t, cfg))
			ctx := context.Background()

			info, err := c.id.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
			must.NoError(t, err)
			must.Eq(t, PluginName, info.GetName())

			caps, err := c.id.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
			must.NoError(t, err)
			hasController := false
			for _, c := range caps.GetCapabilities() {
				if c.GetService().GetType() == csi.PluginCapability_Service_CONTROLLER_SERVICE {
					hasController = true
				}
			}
			must.Eq(t, mode.servesController(), hasController)

			_, err = c.ctrl.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
			if mode.servesController() {
				must.NoError(t, err)
			} else {
				mustCode(t, codes.Unimplemented, err)
			}
			_, err = c.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
			if mode.servesNode() {
				must.NoError(t, err)
			} else {
				mustCode(t, codes.Unimplemented, err)
			}
		})
	}
}

// TestPlugin_InstancesShareStateSafely has two plugin instances on one state
// dir create volumes at the same time; the file lock keeps every write.
func TestPlugin_InstancesShareStateSafely(t *testing.T) {
	stateDir := t.TempDir()
	cfgA, _ := testConfig(t, stateDir, "node-a")
	a := dial(t, startPlugin(t, cfgA))
	cfgB, _ := testConfig(t, stateDir, "node-b")
	b := dial(t, startPlugin(t, cfgB))

	const perPlugin = 10
	var wg sync.WaitGroup
	errs := make(chan error, 2*perPlugin)
	for i := range perPlugin {
		for name, c := range map[string]clients{"a": a, "b": b} {
			wg.Go(func() {
				_, err := c.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
					Name:               fmt.Sprintf("%s-%d", name, i),
					VolumeCapabilities: []*csi.VolumeCapability{singleWriter},
				})
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must.NoError(t, err)
	}
	for _, c := range []clients{a, b} {
		resp, err := c.ctrl.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
		must.NoError(t, err)
		must.Len(t, 2*perPlugin, resp.GetEntries())
	}
}

func TestPlugin_StaleSocketIsReplaced(t *testing.T) {
	cfg, _ := testConfig(t, t.TempDir(), "node-a")
	path, err := socketPath(cfg.Endpoint)
	must.NoError(t, err)

	// A socket left behind by a process that died.
	lis, err := net.Listen("unix", path)
	must.NoError(t, err)
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	must.NoError(t, lis.Close())
	_, err = os.Stat(path)
	must.NoError(t, err)

	c := dial(t, startPlugin(t, cfg))
	_, err = c.id.Probe(context.Background(), &csi.ProbeRequest{})
	must.NoError(t, err)
}

func TestPlugin_RefusesToReplaceAFile(t *testing.T) {
	cfg, _ := testConfig(t, t.TempDir(), "node-a")
	path, err := socketPath(cfg.Endpoint)
	must.NoError(t, err)
	must.NoError(t, os.WriteFile(path, []byte("not a socket"), 0o644))

	p, err := New(cfg)
	must.NoError(t, err)
	must.Error(t, p.Start())
	must.NoError(t, p.Stop(context.Background()))
}

// TestPlugin_GracefulStopFinishesInFlightCalls: a stop lets an attach that is
// waiting out its latency complete, then removes the socket.
func TestPlugin_GracefulStopFinishesInFlightCalls(t *testing.T) {
	cfg, _ := testConfig(t, t.TempDir(), "node-a")
	cfg.PublishLatency = 300 * time.Millisecond
	p := startPlugin(t, cfg)
	c := dial(t, p)
	vol := createVolume(t, c, "vol", singleWriter)

	errCh := make(chan error, 1)
	go func() {
		_, err := publish(context.Background(), c, vol, "node-a", singleWriter)
		errCh <- err
	}()
	must.Wait(t, waitInFlight(p, 1))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must.NoError(t, p.Stop(ctx))
	must.NoError(t, <-errCh)
	must.NoError(t, p.Stop(ctx)) // twice is fine
	must.ErrorIs(t, p.Start(), ErrStopped)

	sock, err := socketPath(cfg.Endpoint)
	must.NoError(t, err)
	_, err = os.Stat(sock)
	must.ErrorIs(t, err, os.ErrNotExist)

	// The attach finished and was recorded.
	st, err := newStore(cfg.StateDir)
	must.NoError(t, err)
	must.NoError(t, st.view(func(s *state) error {
		if s.Nodes["node-a"].Attachments[vol] == nil {
			return errors.New("volume not attached")
		}
		return nil
	}))
}

// TestPlugin_StopDeadlineCancelsCalls: when the stop deadline passes, calls
// still waiting are cancelled and Stop reports the deadline.
func TestPlugin_StopDeadlineCancelsCalls(t *testing.T) {
	cfg, _ := testConfig(t, t.TempDir(), "node-a")
	cfg.PublishLatency = time.Hour
	p := startPlugin(t, cfg)
	c := dial(t, p)
	vol := createVolume(t, c, "vol", singleWriter)

	errCh := make(chan error, 1)
	go func() {
		_, err := publish(context.Background(), c, vol, "node-a", singleWriter)
		errCh <- err
	}()
	must.Wait(t, waitInFlight(p, 1))

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	must.ErrorIs(t, p.Stop(ctx), context.DeadlineExceeded)
	must.Error(t, <-errCh)
	must.Eq(t, 0, p.tracker.inFlight.Load())
}

func TestPlugin_ServeStopsWithContext(t *testing.T) {
	cfg, _ := testConfig(t, t.TempDir(), "node-a")
	p, err := New(cfg)
	must.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	sock, err := socketPath(cfg.Endpoint)
	must.NoError(t, err)
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error { _, err := os.Stat(sock); return err }),
		wait.Timeout(10*time.Second),
		wait.Gap(5*time.Millisecond),
	))
	c := dial(t, p)
	_, err = c.id.Probe(context.Background(), &csi.ProbeRequest{})
	must.NoError(t, err)
	cancel()
	must.NoError(t, <-done)
	done <- nil // for the cleanup
}
