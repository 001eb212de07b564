package client

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/nomad"
	"github.com/roamhq/roam/structs"
)

// waitServerAlloc waits until the server holds one allocation of jobID
// that satisfies ok, and returns it.
func waitServerAlloc(t *testing.T, srv *nomad.Server, jobID string, ok func(*structs.Allocation) error) *structs.Allocation {
	t.Helper()
	var found *structs.Allocation
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			allocs, err := srv.State().AllocsByJob(nil, structs.DefaultNamespace, jobID)
			if err != nil {
				return err
			}
			if len(allocs) != 1 {
				return fmt.Errorf("%d allocations of %s, want 1", len(allocs), jobID)
			}
			found = allocs[0]
			return ok(found)
		}),
		wait.Timeout(30*time.Second),
		wait.Gap(20*time.Millisecond),
	))
	return found
}

func clientStatusIs(status string) func(*structs.Allocation) error {
	return func(a *structs.Allocation) error {
		if a.ClientStatus != status {
			return fmt.Errorf("alloc %s client status %q (%s), want %q; tasks %s", a.ID, a.ClientStatus, a.ClientDescription, status, describeTasks(a.TaskStates))
		}
		return nil
	}
}

// TestClient_RunsAllocationsFromServer runs a real server and client: a
// batch job completes with its output in the logs, and a service job runs
// until it is stopped.
func TestClient_RunsAllocationsFromServer(t *testing.T) {
	srv := testServer(t, nil)
	cfg := TestConfig(t, srv.Addr())
	cfg.ExecutorPath = os.Args[0]
	c := testClient(t, cfg)
	waitRegistered(t, c)

	node := waitForNode(t, srv, c.NodeID(), 5*time.Second, "ready", isReady)
	must.Eq(t, "1", node.Attributes["driver.raw_exec"])
	must.NotNil(t, node.Drivers["raw_exec"])
	must.True(t, node.Drivers["raw_exec"].Detected)
	must.True(t, node.Drivers["raw_exec"].Healthy)

	register := func(job *structs.Job) {
		t.Helper()
		var resp structs.JobRegisterResponse
		must.NoError(t, srv.RPC("Job.Register", &structs.JobRegisterRequest{Job: job}, &resp))
	}
	task := func(script string) *structs.Task {
		return &structs.Task{
			Name: "main", Driver: "raw_exec",
			Config:      map[string]any{"command": "/bin/sh", "args": []any{"-c", script}},
			KillTimeout: 2 * time.Second, KillSignal: "SIGTERM",
		}
	}

	// A batch job runs to completion; its output is in the logs.
	register(&structs.Job{
		ID: "hello", Type: structs.JobTypeBatch, Datacenters: []string{"dc1"},
		TaskGroups: []*structs.TaskGroup{{Name: "g", Count: 1, Tasks: []*structs.Task{task(`echo "hello from $ROAM_JOB_ID"`)}}},
	})
	done := waitServerAlloc(t, srv, "hello", clientStatusIs(structs.AllocClientStatusComplete))
	rc, err := c.AllocLogs(done.ID, "main", "stdout", "start", 0)
	must.NoError(t, err)
	out, err := io.ReadAll(rc)
	rc.Close()
	must.NoError(t, err)
	must.Eq(t, "hello from hello\n", string(out))

	// A service job runs until the job is stopped.
	register(&structs.Job{
		ID: "sleeper", Type: structs.JobTypeService, Datacenters: []string{"dc1"},
		TaskGroups: []*structs.TaskGroup{{Name: "g", Count: 1, Tasks: []*structs.Task{task(`echo $$ > "$ROAM_ALLOC_DIR/pid"; exec sleep 60`)}}},
	})
	running := waitServerAlloc(t, srv, "sleeper", clientStatusIs(structs.AllocClientStatusRunning))
	pidFile := filepath.Join(cfg.DataDir, "alloc", running.ID, "alloc", "pid")
	killOnCleanup(t, pidFile)
	pid, err := strconv.Atoi(strings.TrimSpace(waitFile(t, pidFile)))
	must.NoError(t, err)
	must.True(t, processAlive(pid))

	var dresp structs.JobDeregisterResponse
	must.NoError(t, srv.RPC("Job.Deregister", &structs.JobDeregisterRequest{JobID: "sleeper"}, &dresp))
	stopped := waitServerAlloc(t, srv, "sleeper", clientStatusIs(structs.AllocClientStatusComplete))
	must.Eq(t, "stopped by server", stopped.ClientDescription)
	must.False(t, processAlive(pid))
}
