package rawexec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// The executor lock closes the window between a task's start and the
// moment the client records its handle. The driver takes an exclusive
// flock on the task's executor.lock before it spawns the executor and
// hands the locked file to it (ExtraFiles), so from before the executor
// exists until it exits the lock is held by whoever owns the task: the
// driver, then the executor. A client that dies in that window leaves the
// lock held by the executor, and the restarted client's Start of the same
// task finds it held and adopts the running executor instead of starting
// a second copy of the task beside it.
const (
	lockFileName = "executor.lock"
	// executorLockFD is the lock's descriptor in the executor: the first
	// of ExtraFiles.
	executorLockFD = 3
)

// errExecutorLives means another process holds a task dir's executor
// lock: an executor of that dir is alive (or a driver is starting one).
var errExecutorLives = errors.New("an executor holds this task directory")

// lockExecutorDir takes exeDir's executor lock without waiting. The lock
// lasts as long as the returned file, or a copy of it in a child, is open.
func lockExecutorDir(exeDir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(exeDir, lockFileName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open executor lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errExecutorLives
		}
		return nil, fmt.Errorf("lock executor dir: %w", err)
	}
	return f, nil
}

// executorDirLocked reports whether a live process holds exeDir's lock.
func executorDirLocked(exeDir string) bool {
	f, err := lockExecutorDir(exeDir)
	if err != nil {
		return errors.Is(err, errExecutorLives)
	}
	f.Close()
	return false
}

// adopt returns a handle for the live executor that holds exeDir's lock,
// when it runs the task cfg names: the task a client started just before
// it died, whose handle it had not recorded. The executor may not have
// started the task yet; adopt waits for that as Start does. An executor of
// another task is ErrAlreadyRunning.
func (d *Driver) adopt(ctx context.Context, cfg TaskConfig, exeDir string) (*Handle, error) {
	fail := func(err error) (*Handle, error) {
		return nil, fmt.Errorf("rawexec: start task %q: %w", cfg.ID, err)
	}
	var spec executorSpec
	if err := readJSONFile(filepath.Join(exeDir, "spec.json"), &spec); err != nil || spec.ID != cfg.ID {
		return fail(fmt.Errorf("%w (%w)", ErrAlreadyRunning, errExecutorLives))
	}
	startCtx, cancel := context.WithTimeout(ctx, d.startTimeout)
	defer cancel()
	err := poll(startCtx, func() bool {
		for _, p := range []string{spec.StatePath, spec.ExitPath} {
			if _, err := os.Stat(p); err == nil {
				return true
			}
		}
		// Gone before it reported anything: Reattach says so.
		return !executorDirLocked(exeDir)
	})
	if err != nil {
		return fail(fmt.Errorf("waiting for the running executor: %w", err))
	}
	h, err := d.Reattach(HandleState{
		ID: cfg.ID, StatePath: spec.StatePath, ExitPath: spec.ExitPath,
		KillSignal: cfg.KillSignal, KillTimeout: cfg.KillTimeout,
	})
	if err != nil {
		return nil, err
	}
	h.logger.Info("adopted the running executor of a task started before a client restart",
		"executor_pid", h.state.ExecutorPID, "task_pid", h.state.TaskPID)
	return h, nil
}
