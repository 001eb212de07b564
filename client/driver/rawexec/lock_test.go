package rawexec

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// A client that dies after spawning a task's executor, before it records
// the handle, comes back without the handle and starts the task again.
// That second Start must adopt the executor that runs, even one that has
// not yet started the task, rather than run a second copy beside it (two
// writers on the task's volume).
func TestStart_AdoptsTheExecutorOfAStartCutShort(t *testing.T) {
	t.Parallel()
	d := testDriver(t)
	dir := filepath.Join(t.TempDir(), "task")
	scratch := t.TempDir()
	// The executor opens the task's stdout before it starts the task; a
	// FIFO with no reader holds it there, inside the window.
	fifo := filepath.Join(scratch, "stdout.fifo")
	must.NoError(t, syscall.Mkfifo(fifo, 0o600))
	starts := filepath.Join(scratch, "starts")
	cfg := TaskConfig{
		ID: t.Name(), Command: "/bin/sh", Args: []string{"-c", `echo start >> ` + starts + `; exec sleep 60`},
		Dir: dir, StdoutPath: fifo,
	}

	type started struct {
		h   *Handle
		err error
	}
	first, second := make(chan started, 1), make(chan started, 1)
	go func() { h, err := d.Start(testCtx(t), cfg); first <- started{h, err} }()
	// The executor is spawned once its spec is written.
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool {
			_, err := os.Stat(filepath.Join(dir, executorDirName, "spec.json"))
			return err == nil
		}),
		wait.Timeout(10*time.Second), wait.Gap(5*time.Millisecond),
	))
	// The restarted client's Start of the same task.
	go func() { h, err := d.Start(testCtx(t), cfg); second <- started{h, err} }()

	// Let every executor blocked on the FIFO go on.
	reader, err := os.OpenFile(fifo, os.O_RDONLY, 0)
	must.NoError(t, err)
	t.Cleanup(func() { _ = reader.Close() })
	one, two := <-first, <-second
	must.NoError(t, one.err)
	cleanupTask(t, one.h.State())
	must.NoError(t, two.err, must.Sprint("the second start of a running task must adopt it"))
	cleanupTask(t, two.h.State())
	must.EqOp(t, one.h.State().TaskPID, two.h.State().TaskPID, must.Sprint("a second copy of the task was started"))
	must.True(t, two.h.IsRunning())

	// The lock is the executor's alone: the task does not hold it.
	fds, err := os.ReadDir("/proc/" + strconv.Itoa(one.h.State().TaskPID) + "/fd")
	must.NoError(t, err)
	for _, fd := range fds {
		target, _ := os.Readlink("/proc/" + strconv.Itoa(one.h.State().TaskPID) + "/fd/" + fd.Name())
		must.False(t, strings.HasSuffix(target, lockFileName), must.Sprintf("the task inherited the executor lock as fd %s", fd.Name()))
	}

	// Killed through the adopted handle, the one task ends, and a later
	// start (the restart policy's) runs a new copy.
	must.NoError(t, two.h.Kill(testCtx(t), "SIGKILL", time.Second))
	_, err = one.h.Wait(testCtx(t))
	must.NoError(t, err)
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return !executorDirLocked(filepath.Join(dir, executorDirName)) }),
		wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond),
	))
	body, err := os.ReadFile(starts)
	must.NoError(t, err)
	must.EqOp(t, "start\n", string(body))
}

// A live executor of another task in the same directory is refused, not
// adopted.
func TestStart_RefusesAnotherTasksExecutor(t *testing.T) {
	t.Parallel()
	d := testDriver(t)
	cfg := TaskConfig{Command: "/bin/sh", Args: []string{"-c", "sleep 60"}, Dir: filepath.Join(t.TempDir(), "task")}
	h := startTask(t, d, cfg)
	_, err := d.Start(testCtx(t), TaskConfig{ID: "other", Command: "/bin/sh", Args: []string{"-c", "sleep 60"}, Dir: cfg.Dir})
	must.ErrorIs(t, err, ErrAlreadyRunning)
	must.ErrorIs(t, err, errExecutorLives)
	must.True(t, h.IsRunning())
}
