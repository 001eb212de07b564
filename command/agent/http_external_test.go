package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/plugins/csi/hostpath"
)

// startHostpath runs the built-in plugin in this process, as a monolith
// on a socket of its own, and returns the socket's path and state dir.
func startHostpath(t *testing.T, nodeID string) (sock, stateDir string) {
	t.Helper()
	// Unix socket paths are short; t.TempDir can be too long.
	dir, err := os.MkdirTemp("", "roam-hp-")
	must.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := hostpath.DefaultConfig()
	cfg.Endpoint = "unix://" + filepath.Join(dir, "csi.sock")
	cfg.NodeID = nodeID
	cfg.StateDir = filepath.Join(dir, "state")
	p, err := hostpath.New(cfg)
	must.NoError(t, err)
	must.NoError(t, p.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.Stop(ctx)
	})
	return filepath.Join(dir, "csi.sock"), cfg.StateDir
}

// TestNomadAPI_CSIListExternal pages through the provider's volumes with
// Nomad's client, the unregistered one included.
func TestNomadAPI_CSIListExternal(t *testing.T) {
	t.Parallel()
	sock, _ := startHostpath(t, "ext-node")
	a := newTestAgent(t, func(c *Config) {
		c.Client.CSIPlugins = []*CSIPluginConfig{{ID: "hp", Type: "monolith", Socket: sock}}
	})
	waitForLeader(t, a)
	waitForNodeReady(t, a, a.Client().NodeID())
	c := newNomadClient(t, a)
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		p, _, err := c.CSIPlugins().Info("hp", nil)
		if err != nil {
			return err
		}
		if p.ControllersHealthy != 1 {
			return fmt.Errorf("plugin %+v", p)
		}
		return nil
	}), wait.Timeout(30*time.Second), wait.Gap(50*time.Millisecond)))

	for _, id := range []string{"one", "two", "three"} {
		_, _, err := c.CSIVolumes().Create(&nomadapi.CSIVolume{
			ID: id, PluginID: "hp", RequestedCapacityMin: 1 << 20,
			RequestedCapabilities: []*nomadapi.CSIVolumeCapability{{
				AccessMode: nomadapi.CSIVolumeAccessModeSingleNodeWriter, AttachmentMode: nomadapi.CSIVolumeAttachmentModeFilesystem,
			}},
		}, nil)
		must.NoError(t, err)
	}
	// "three" stays at the provider but leaves Roam.
	three, _, err := c.CSIVolumes().Info("three", nil)
	must.NoError(t, err)
	must.NoError(t, c.CSIVolumes().Deregister("three", false, nil))

	seen := map[string]int64{}
	q := &nomadapi.QueryOptions{PerPage: 2}
	pages := 0
	for {
		resp, qm, err := c.CSIVolumes().ListExternal("hp", q)
		must.NoError(t, err)
		must.Positive(t, qm.LastIndex)
		must.LessEq(t, 2, len(resp.Volumes))
		for _, v := range resp.Volumes {
			seen[v.ExternalID] = v.CapacityBytes
		}
		pages++
		if resp.NextToken == "" {
			break
		}
		q.NextToken = resp.NextToken
	}
	must.Eq(t, 2, pages)
	must.MapLen(t, 3, seen)
	must.Eq(t, int64(1<<20), seen[three.ExternalID])

	_, _, err = c.CSIVolumes().ListExternal("nope", &nomadapi.QueryOptions{})
	must.ErrorContains(t, err, "400")
}
