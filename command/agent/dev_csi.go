package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-memdb"

	"github.com/roamhq/roam/client"
	"github.com/roamhq/roam/state"
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
// dev agent with both halves whose config asks for it (DevCSIPlugin,
// which `roam agent -dev` sets).
func (a *Agent) wantDevCSIPlugin() bool {
	return a.config.DevMode && a.config.DevCSIPlugin && a.server != nil && a.client != nil
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
		req := &structs.JobRegisterRequest{Job: job}
		if a.server.Config().ACLEnabled {
			// With ACLs on, nothing may register a job before `roam acl
			// bootstrap` made a management token. The dev agent is the
			// only server and holds that token in its own state already;
			// it uses it for this one call, in process, never logged.
			a.logger.Info("dev mode: acls are on; the csi-hostpath plugin job starts once a management token exists (roam acl bootstrap)")
			secret, err := devManagementSecret(ctx, a.server.State)
			if err != nil {
				if ctx.Err() == nil {
					a.logger.Error("dev mode: not starting the csi-hostpath plugin", "error", err)
				}
				return
			}
			req.AuthToken = secret
		}
		var resp structs.JobRegisterResponse
		if err := a.RPC("Job.Register", req, &resp); err != nil {
			if ctx.Err() == nil {
				a.logger.Error("dev mode: failed to register the csi-hostpath plugin job", "error", fmt.Errorf("register %s: %w", job.ID, err))
			}
			return
		}
		a.logger.Info("dev mode: running the built-in CSI plugin as a system job",
			"job_id", job.ID, "plugin_id", devCSIPluginID, "binary", roam)
	}()
}

// devManagementSecret waits until store holds a management token and
// returns its secret, or ctx's error. store is called again after every
// change, so a snapshot restore that replaces the store is followed.
func devManagementSecret(ctx context.Context, store func() *state.StateStore) (string, error) {
	for {
		st := store()
		ws := memdb.NewWatchSet()
		ws.Add(st.AbandonCh())
		tokens, err := st.ACLTokens(ws)
		if err != nil {
			return "", fmt.Errorf("dev mode: read acl tokens: %w", err)
		}
		for _, tok := range tokens {
			if tok.Type == structs.ACLManagementToken && tok.SecretID != "" {
				return tok.SecretID, nil
			}
		}
		if err := ws.WatchCtx(ctx); err != nil {
			return "", err
		}
	}
}
