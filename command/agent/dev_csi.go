package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/roamhq/roam/client"
	"github.com/roamhq/roam/structs"
)

// devCSIPluginJobID is the system job `roam agent -dev` runs so that a
// newcomer has CSI volumes without setting up a plugin.
const devCSIPluginJobID = "csi-hostpath"

// devCSIPluginID is the plugin ID volumes name in dev mode.
const devCSIPluginID = "hostpath"

// devCSIPluginJob runs this very binary's built-in hostpath plugin as a
// plugin task. raw_exec does not expand variables in args, so a shell
// passes the client-chosen $CSI_ENDPOINT on; the binary, node ID, state
// dir and target root (the client's <data_dir>/csi, where it keeps every
// staging and target path) come in as positional parameters, free of
// quoting.
func devCSIPluginJob(roam, nodeID, stateDir, targetRoot string) *structs.Job {
	script := `exec "$0" plugin csi-hostpath -endpoint "$CSI_ENDPOINT" -node-id "$1" -state-dir "$2" -target-root "$3"`
	return &structs.Job{
		ID:   devCSIPluginJobID,
		Name: devCSIPluginJobID,
		Type: structs.JobTypeSystem,
		TaskGroups: []*structs.TaskGroup{{
			Name:  "plugin",
			Count: 1,
			Tasks: []*structs.Task{{
				Name:   "plugin",
				Driver: "raw_exec",
				Config: map[string]any{
					"command": "/bin/sh",
					"args":    []any{"-c", script, roam, nodeID, stateDir, targetRoot},
				},
				KillSignal:  "SIGTERM",
				KillTimeout: 10 * time.Second,
				CSIPluginConfig: &structs.TaskCSIPluginConfig{
					ID:   devCSIPluginID,
					Type: structs.CSIPluginTypeMonolith,
				},
			}},
		}},
	}
}

// wantDevCSIPlugin reports whether this agent runs the dev plugin job: a
// dev agent with both halves, started from the roam binary. A test binary
// is no roam binary, and test agents use the dev configuration.
func (a *Agent) wantDevCSIPlugin() bool {
	return a.config.DevMode && a.server != nil && a.client != nil && !testing.Testing()
}

// startDevCSIPlugin registers the dev plugin job once the local node is
// registered, in the background, until ctx ends.
func (a *Agent) startDevCSIPlugin(ctx context.Context, cl *client.Client) {
	roam, err := os.Executable()
	if err != nil {
		a.logger.Warn("dev mode: not starting the csi-hostpath plugin", "error", err)
		return
	}
	dataDir, err := filepath.Abs(a.config.DataDir)
	if err != nil {
		a.logger.Warn("dev mode: not starting the csi-hostpath plugin", "error", err)
		return
	}
	job := devCSIPluginJob(roam, cl.NodeID(), filepath.Join(dataDir, "csi-hostpath"), filepath.Join(dataDir, "csi"))
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		select {
		case <-cl.Registered():
		case <-ctx.Done():
			return
		}
		var resp structs.JobRegisterResponse
		if err := a.RPC("Job.Register", &structs.JobRegisterRequest{Job: job}, &resp); err != nil {
			if ctx.Err() == nil {
				a.logger.Error("dev mode: failed to register the csi-hostpath plugin job", "error", fmt.Errorf("register %s: %w", job.ID, err))
			}
			return
		}
		a.logger.Info("dev mode: running the built-in CSI plugin as a system job",
			"job_id", job.ID, "plugin_id", devCSIPluginID, "binary", roam)
	}()
}
