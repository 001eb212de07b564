package rawexec

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// The test binary doubles as the executor and as a stand-in client, so the
// tests run real processes without building roam.
const (
	// envDriverChild makes the test binary a client that starts one task
	// in the named directory, records its HandleState, and blocks until
	// killed.
	envDriverChild = "ROAM_TEST_DRIVER_CHILD"
)

func TestMain(m *testing.M) {
	// The child's executors inherit envDriverChild: they must still run as
	// executors, which RunTestMain handles.
	executor := len(os.Args) == 3 && os.Args[1] == "executor"
	if dir := os.Getenv(envDriverChild); dir != "" && !executor {
		os.Exit(driverChild(dir))
	}
	os.Exit(RunTestMain(m))
}

// driverChild plays a client that is about to be killed with SIGKILL.
func driverChild(dir string) int {
	d, err := New(Config{ExecutorPath: os.Args[0], Logger: hclog.New(&hclog.LoggerOptions{Output: os.Stderr})})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	h, err := d.Start(context.Background(), TaskConfig{
		ID:      "child-task",
		Command: "/bin/sh",
		Args:    []string{"-c", "sleep 60"},
		Dir:     filepath.Join(dir, "task"),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := writeFileAtomic(filepath.Join(dir, "handle.json"), h.State()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Block until the test kills us; stdin is a pipe the test holds open.
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

func testDriver(t *testing.T) *Driver {
	t.Helper()
	d, err := New(Config{
		ExecutorPath: os.Args[0],
		StartTimeout: 20 * time.Second,
		Logger:       hclog.New(&hclog.LoggerOptions{Name: t.Name(), Output: hclog.DefaultOutput, Level: hclog.Debug}),
	})
	must.NoError(t, err)
	return d
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startTask starts cfg with defaults filled in and makes sure the task and
// its executor are gone when the test ends.
func startTask(t *testing.T, d *Driver, cfg TaskConfig) *Handle {
	t.Helper()
	if cfg.ID == "" {
		cfg.ID = t.Name()
	}
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(t.TempDir(), "task")
	}
	h, err := d.Start(testCtx(t), cfg)
	must.NoError(t, err)
	cleanupTask(t, h.State())
	return h
}

// cleanupTask kills what is left of a task and its executor at the end of
// the test.
func cleanupTask(t *testing.T, st HandleState) {
	t.Cleanup(func() {
		if processAlive(st.TaskPID, st.TaskStartTime) {
			_ = syscall.Kill(-st.TaskPID, syscall.SIGKILL)
		}
		if processAlive(st.ExecutorPID, st.ExecutorStartTime) {
			_ = syscall.Kill(st.ExecutorPID, syscall.SIGKILL)
		}
	})
}

// groupMembers lists the live processes in process group pgid.
func groupMembers(t *testing.T, pgid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	must.NoError(t, err)
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readProcStat(pid)
		if err != nil || st.State == 'Z' {
			continue
		}
		if st.PGID == pgid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(cond),
		wait.Timeout(20*time.Second),
		wait.Gap(20*time.Millisecond),
	), must.Sprint("waiting for ", what))
}

func roundTrip(t *testing.T, st HandleState) HandleState {
	t.Helper()
	b, err := json.Marshal(st)
	must.NoError(t, err)
	var out HandleState
	must.NoError(t, json.Unmarshal(b, &out))
	return out
}
