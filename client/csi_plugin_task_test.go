package client

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func TestCSIPluginSocket(t *testing.T) {
	task := &structs.Task{Name: "plugin", CSIPluginConfig: &structs.TaskCSIPluginConfig{ID: "hp", Type: "node", MountDir: "/csi"}}
	allocID := "0123456789abcdef"

	sock, dir, err := csiPluginSocket(allocID, task, taskDirs{TaskDir: "/d/alloc/a/plugin"})
	must.NoError(t, err)
	must.Eq(t, "/d/alloc/a/plugin/csi/csi.sock", sock)
	must.Eq(t, "/d/alloc/a/plugin/csi", dir)

	// Too long for sun_path: a short path under the temp dir instead.
	long := "/" + strings.Repeat("x", 120) + "/plugin"
	sock, dir, err = csiPluginSocket(allocID, task, taskDirs{TaskDir: long})
	must.NoError(t, err)
	must.Eq(t, filepath.Join(os.TempDir(), "roam-csi-01234567-plugin.sock"), sock)
	must.Eq(t, long+"/csi", dir)

	// A temp dir too deep for the socket (the plugin's bind would fail
	// with EINVAL): /tmp instead.
	deep := t.TempDir() + "/" + strings.Repeat("y", 80)
	t.Setenv("TMPDIR", deep)
	sock, _, err = csiPluginSocket(allocID, task, taskDirs{TaskDir: long})
	must.NoError(t, err)
	must.Eq(t, "/tmp/roam-csi-01234567-plugin.sock", sock)
}

// TestClient_CSIPluginTask runs a plugin as a task of a system job (the
// test binary serves the hostpath plugin): the node reports it healthy to
// a real server, and once the job stops the node no longer reports it.
func TestClient_CSIPluginTask(t *testing.T) {
	srv := testServer(t, nil)
	cfg := TestConfig(t, srv.Addr())
	cfg.ExecutorPath = os.Args[0]
	cfg.CSIFingerprintInterval = 100 * time.Millisecond
	c := testClient(t, cfg)
	waitRegistered(t, c)
	waitForNode(t, srv, c.NodeID(), 10*time.Second, "ready", isReady)

	job := &structs.Job{
		ID: "csi-hostpath", Type: structs.JobTypeSystem, Datacenters: []string{"dc1"},
		TaskGroups: []*structs.TaskGroup{{Name: "plugin", Count: 1, Tasks: []*structs.Task{{
			Name: "plugin", Driver: "raw_exec",
			Config: map[string]any{"command": os.Args[0]},
			Env: map[string]string{
				testCSIPluginEnv:      "1",
				testCSIPluginNodeEnv:  c.NodeID(),
				testCSIPluginStateEnv: t.TempDir(),
			},
			KillTimeout: 5 * time.Second, KillSignal: "SIGTERM",
			CSIPluginConfig: &structs.TaskCSIPluginConfig{ID: "hostpath", Type: structs.CSIPluginTypeMonolith},
		}}}},
	}
	var resp structs.JobRegisterResponse
	must.NoError(t, srv.RPC("Job.Register", &structs.JobRegisterRequest{Job: job}, &resp))

	node := waitForNode(t, srv, c.NodeID(), 30*time.Second, "plugin task healthy", func(n *structs.Node) bool {
		return n != nil && healthy(n.CSINodePlugins, "hostpath") && healthy(n.CSIControllerPlugins, "hostpath")
	})
	must.Eq(t, c.NodeID(), node.CSINodePlugins["hostpath"].NodeInfo.ID)

	alloc := waitServerAlloc(t, srv, "csi-hostpath", clientStatusIs(structs.AllocClientStatusRunning))
	ar := c.allocs.getRunner(alloc.ID)
	must.NotNil(t, ar)
	endpoint := ar.lookupTask("plugin").env["CSI_ENDPOINT"]
	must.StrHasPrefix(t, "unix://", endpoint)
	_, err := os.Stat(strings.TrimPrefix(endpoint, "unix://"))
	must.NoError(t, err, must.Sprint("the plugin listens where CSI_ENDPOINT says"))

	var dresp structs.JobDeregisterResponse
	must.NoError(t, srv.RPC("Job.Deregister", &structs.JobDeregisterRequest{JobID: "csi-hostpath"}, &dresp))
	waitServerAlloc(t, srv, "csi-hostpath", clientStatusIs(structs.AllocClientStatusComplete))
	waitForNode(t, srv, c.NodeID(), 10*time.Second, "plugin removed", func(n *structs.Node) bool {
		return n != nil && n.CSINodePlugins["hostpath"] == nil && n.CSIControllerPlugins["hostpath"] == nil
	})
}
