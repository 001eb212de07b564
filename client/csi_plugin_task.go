package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/roamhq/roam/structs"
)

// csiSocketName is the file a plugin task creates in its mount_dir.
const csiSocketName = "csi.sock"

// maxCSISocketPath is the longest socket path used in place. sun_path holds
// 108 bytes on Linux (104 on the BSDs) including the trailing NUL; deeply
// nested data dirs exceed it, and a plugin could not bind its socket.
const maxCSISocketPath = 100

// csiPluginPollInterval is how often a starting plugin task's socket is
// tried before the plugin is handed to the CSI manager.
const csiPluginPollInterval = 100 * time.Millisecond

// csiPluginHost is the CSI manager as plugin tasks use it.
type csiPluginHost interface {
	AddPlugin(cfg *CSIPluginConfig) error
	RemovePlugin(id string) error
}

var _ csiPluginHost = (*csiManager)(nil)

// csiPluginSocket is where a plugin task listens: csi.sock in its
// mount_dir inside the task directory, or, when that path is too long for
// a unix socket, roam-csi-<alloc ID prefix>-<task>.sock in the temp dir,
// or in /tmp when $TMPDIR is itself too deep for the socket to fit. Each is
// stable for the allocation, so a restarted client finds the plugin again.
// A mount_dir that would lead out of the task directory is an error (the
// servers refuse one; this client does not rely on it), and so are an
// allocation ID or task name that structs.ValidateID refuses, which the
// socket's name in the temp dir is made of.
func csiPluginSocket(allocID string, task *structs.Task, dirs taskDirs) (socket, dir string, err error) {
	mountDir := strings.TrimLeft(task.CSIPluginConfig.MountDir, "/")
	if mountDir == "" {
		mountDir = structs.DefaultCSIPluginMountDir
	}
	if !filepath.IsLocal(mountDir) {
		return "", "", fmt.Errorf("%w: task %q: csi_plugin mount_dir %q leads out of the task directory",
			structs.ErrInvalidRequest, task.Name, task.CSIPluginConfig.MountDir)
	}
	if err := structs.ValidateID(structs.IDKindAlloc, allocID); err != nil {
		return "", "", err
	}
	if err := structs.ValidateID(structs.IDKindTask, task.Name); err != nil {
		return "", "", err
	}
	dir = filepath.Join(dirs.TaskDir, mountDir)
	socket = filepath.Join(dir, csiSocketName)
	if len(socket) <= maxCSISocketPath {
		return socket, dir, nil
	}
	short := allocID
	if len(short) > 8 {
		short = short[:8]
	}
	name := fmt.Sprintf("roam-csi-%s-%s.sock", short, task.Name)
	socket = filepath.Join(os.TempDir(), name)
	if len(socket) > maxCSISocketPath {
		socket = filepath.Join("/tmp", name)
	}
	return socket, dir, nil
}

// csiPluginConfigFor is what the CSI manager is given for a plugin task.
func csiPluginConfigFor(allocID string, task *structs.Task, socket string) *CSIPluginConfig {
	return &CSIPluginConfig{ID: task.CSIPluginConfig.ID, Type: task.CSIPluginConfig.Type, Socket: socket, AllocID: allocID,
		ControllerConcurrency: task.CSIPluginConfig.ControllerConcurrency}
}

// prepareCSIPlugin creates a plugin task's mount_dir and removes a socket
// left by an earlier run, so the plugin can bind and the client does not
// talk to a dead one. Called before each start. The task may have put
// links in its own directory: both go through an os.Root on it, so
// neither creates nor removes anything outside it. A socket in the temp
// dir has a name of the client's making, with no directory of the task's
// on its way.
func (tr *taskRunner) prepareCSIPlugin() error {
	if tr.csiSocket == "" {
		return nil
	}
	if err := mkdirAllIn(tr.dirs.TaskDir, tr.csiDir, 0o755); err != nil {
		return fmt.Errorf("csi plugin mount dir: %w", err)
	}
	var err error
	if rel, rerr := relUnder(tr.dirs.TaskDir, tr.csiSocket); rerr == nil {
		var root *os.Root
		if root, err = os.OpenRoot(tr.dirs.TaskDir); err == nil {
			err = root.Remove(rel)
			root.Close()
		}
	} else {
		err = os.Remove(tr.csiSocket)
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("csi plugin socket: %w", err)
	}
	return nil
}

// manageCSIPlugin hands a plugin task to the CSI manager once its socket
// accepts connections, and takes it back when ctx ends. It returns whether
// the plugin was added, for the caller to remove it.
//
// A plugin ID held by another task (an older allocation of the same job
// still stopping) is retried until that one lets go.
func (tr *taskRunner) manageCSIPlugin(ctx context.Context) (added bool) {
	cfg := csiPluginConfigFor(tr.allocID, tr.task, tr.csiSocket)
	t := time.NewTicker(csiPluginPollInterval)
	defer t.Stop()
	warned := false
	for {
		if socketAccepts(ctx, tr.csiSocket) {
			err := tr.csi.AddPlugin(cfg)
			if err == nil {
				tr.logger.Info("csi plugin task registered", "plugin_id", cfg.ID, "socket", cfg.Socket)
				return true
			}
			if errors.Is(err, errCSIManagerShutdown) {
				return false
			}
			if !warned {
				tr.logger.Warn("csi plugin task not registered yet, retrying", "plugin_id", cfg.ID, "error", err)
				warned = true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// socketAccepts reports whether something listens on the unix socket.
func socketAccepts(ctx context.Context, path string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// startCSIPlugin starts manageCSIPlugin for a plugin task and returns a
// function that stops it and, unless the client is shutting down (the
// task keeps running for the next client), removes the plugin.
func (tr *taskRunner) startCSIPlugin(ctx context.Context) (stop func()) {
	if tr.csiSocket == "" || tr.csi == nil {
		return func() {}
	}
	pctx, cancel := context.WithCancel(ctx)
	added := make(chan bool, 1)
	go func() { added <- tr.manageCSIPlugin(pctx) }()
	return func() {
		cancel()
		if !<-added || ctx.Err() != nil {
			return
		}
		if err := tr.csi.RemovePlugin(tr.task.CSIPluginConfig.ID); err != nil {
			tr.logger.Warn("failed to remove csi plugin", "plugin_id", tr.task.CSIPluginConfig.ID, "error", err)
			return
		}
		tr.logger.Info("csi plugin task removed", "plugin_id", tr.task.CSIPluginConfig.ID)
	}
}
