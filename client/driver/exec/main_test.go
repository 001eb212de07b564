package exec

import (
	"context"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/client/driver/rawexec"
)

// The test binary doubles as the executor and as exec-init, so the tests
// run real isolated processes without building roam. They need root, as
// the driver does; CI runs them as root.
func TestMain(m *testing.M) { os.Exit(RunTestMain(m)) }

// testCgroupParent keeps this package's cgroups apart from a client's.
const testCgroupParent = "/roam-test-exec"

func testDriver(t *testing.T, mod func(*Config)) *Driver {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the exec driver needs root; run the tests as root (CI does)")
	}
	cfg := Config{
		ExecutorPath: os.Args[0],
		StartTimeout: 20 * time.Second,
		Logger:       hclog.New(&hclog.LoggerOptions{Name: t.Name(), Output: hclog.DefaultOutput, Level: hclog.Debug}),
		CgroupParent: testCgroupParent,
	}
	if mod != nil {
		mod(&cfg)
	}
	d, err := New(cfg)
	must.NoError(t, err)
	return d
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// taskLayout makes an allocation dir as the client does: a shared alloc/
// dir and a task dir with local/, both the task user's.
func taskLayout(t *testing.T, cfg *TaskConfig) {
	t.Helper()
	if cfg.ID == "" {
		cfg.ID = "a1b2c3/" + strings.ReplaceAll(t.Name(), "/", "_")
	}
	base := t.TempDir()
	must.NoError(t, os.Chmod(base, 0o711))
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(base, "task")
	}
	if cfg.SharedDir == "" {
		cfg.SharedDir = filepath.Join(base, "alloc")
	}
	if cfg.Resources.MemoryMB == 0 {
		cfg.Resources.MemoryMB = 64
	}
	if cfg.StdoutPath == "" {
		cfg.StdoutPath = filepath.Join(base, "stdout")
		cfg.StderrPath = filepath.Join(base, "stderr")
	}
	uid, gid, err := rawexec.LookupUser(TaskUser(cfg.User))
	must.NoError(t, err)
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "local"), cfg.SharedDir} {
		must.NoError(t, os.MkdirAll(d, 0o755))
		must.NoError(t, os.Chown(d, int(uid), int(gid)))
	}
}

// startTask starts cfg and makes sure nothing of it is left when the test
// ends.
func startTask(t *testing.T, d *Driver, cfg TaskConfig) (*rawexec.Handle, TaskConfig) {
	t.Helper()
	taskLayout(t, &cfg)
	h, err := d.Start(testCtx(t), cfg)
	must.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = h.Kill(ctx, "SIGKILL", time.Second)
	})
	return h, cfg
}

// run starts a shell script as a task, waits for it to end, and returns
// its result and output.
func run(t *testing.T, d *Driver, cfg TaskConfig, script string) (*rawexec.ExitResult, string, string) {
	t.Helper()
	cfg.Command = "/bin/sh"
	cfg.Args = []string{"-c", script}
	h, cfg := startTask(t, d, cfg)
	res, err := h.Wait(testCtx(t))
	must.NoError(t, err)
	out, err := os.ReadFile(cfg.StdoutPath)
	must.NoError(t, err)
	errOut, _ := os.ReadFile(cfg.StderrPath)
	return res, string(out), string(errOut)
}

// taskCgroup opens the cgroup the driver made for a task, to look at it
// from the outside.
func taskCgroup(t *testing.T, d *Driver, id string) cgroups.Manager {
	t.Helper()
	m, err := manager.New(&cgroups.Cgroup{Path: d.parent + "/" + cgroupName(id), Resources: &cgroups.Resources{SkipDevices: true}})
	must.NoError(t, err)
	return m
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(cond),
		wait.Timeout(30*time.Second),
		wait.Gap(20*time.Millisecond),
	), must.Sprint("waiting for ", what))
}

func processGone(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err != nil
}

func osexecRun(path string) error { return osexec.Command(path).Run() }

// cgroupExists looks for the task's cgroup in the pids hierarchy (v1) or
// the unified one (v2).
func cgroupExists(m cgroups.Manager) bool {
	_, err := os.Stat(pidsDir(m))
	return err == nil
}
