package rawexec

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// ExitResult is how a task ended; it is also the executor's exit.json.
type ExitResult struct {
	// ExitCode is the task's exit code; 128+Signal when a signal ended it;
	// -1 when it never ran.
	ExitCode int
	// Signal is the number of the signal that ended the task, or 0.
	Signal int
	// Err says why the task could not be run.
	Err string
	// OOMKilled is set when the kernel killed a process of the task for
	// lack of memory within its limit (MemoryLimit bytes); only isolating
	// launchers can tell.
	OOMKilled   bool  `json:",omitempty"`
	MemoryLimit int64 `json:",omitempty"`
	// FinishedAt is when the executor saw the task end.
	FinishedAt time.Time
}

// Successful reports an exit by the task itself with code 0.
func (r *ExitResult) Successful() bool {
	return r.ExitCode == 0 && r.Signal == 0 && r.Err == ""
}

// HandleState is everything needed to find a task again after a client
// restart. It is plain JSON; the client persists it next to the alloc.
type HandleState struct {
	ID                string
	ExecutorPID       int
	ExecutorStartTime uint64
	TaskPID           int
	// TaskStartTime is the task's start time from /proc/<pid>/stat; with
	// TaskPID it tells the task from a process that reused its PID.
	TaskStartTime uint64
	StatePath     string
	ExitPath      string
	KillSignal    string
	KillTimeout   time.Duration
}

// Handle is a running or finished task. Its methods are safe for
// concurrent use.
type Handle struct {
	logger hclog.Logger
	// ownsChild is set when this process started the executor and so must
	// reap it.
	ownsChild bool

	mu             sync.Mutex
	state          HandleState
	result         *ExitResult
	executorReaped bool
}

// State returns what to persist to re-attach later.
func (h *Handle) State() HandleState {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state
}

// IsRunning reports whether the task has neither exited nor been lost.
func (h *Handle) IsRunning() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	done, _ := h.checkLocked()
	return !done
}

// Wait blocks until the task exits and returns how it ended, or ctx ends.
// If the task is gone without a recorded result the error is ErrTaskGone.
// Any number of callers may wait.
func (h *Handle) Wait(ctx context.Context) (*ExitResult, error) {
	var res *ExitResult
	var lost error
	err := poll(ctx, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		done, r := h.checkLocked()
		if done {
			res = r
			if r == nil {
				lost = fmt.Errorf("rawexec: task %q: %w", h.state.ID, ErrTaskGone)
			}
		}
		return done
	})
	if err != nil {
		return nil, err
	}
	if lost != nil {
		return nil, lost
	}
	h.reapExited(ctx)
	cp := *res
	return &cp, nil
}

// reapExitedTimeout bounds how long Wait waits for an executor that has
// written the exit status to exit too; it has nothing left to do but exit.
const reapExitedTimeout = 2 * time.Second

// reapExited reaps an executor this process started once the task is over,
// so that finished tasks leave no zombies behind in a long-running client.
func (h *Handle) reapExited(ctx context.Context) {
	h.mu.Lock()
	owned := h.ownsChild && !h.executorReaped
	h.mu.Unlock()
	if !owned {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, reapExitedTimeout)
	defer cancel()
	err := poll(ctx, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.reapLocked()
		return h.executorReaped
	})
	if err != nil {
		h.logger.Warn("executor still running after the task's exit; will reap it later", "executor_pid", h.state.ExecutorPID)
	}
}

// Kill sends sig (empty: the task's kill signal) to the task's process
// group, waits up to timeout (0: the task's kill timeout) for the task to
// exit, then SIGKILLs the group. It returns once the exit status is
// recorded or the group is gone; Wait then gives the result. Killing a
// task that has already exited does nothing.
func (h *Handle) Kill(ctx context.Context, sig string, timeout time.Duration) error {
	h.mu.Lock()
	st := h.state
	h.mu.Unlock()
	if sig == "" {
		sig = st.KillSignal
	}
	s, err := parseSignal(sig, syscall.SIGINT)
	if err != nil {
		return fmt.Errorf("rawexec: kill task %q: %w", st.ID, err)
	}
	if timeout <= 0 {
		timeout = st.KillTimeout
	}
	if timeout <= 0 {
		timeout = DefaultKillTimeout
	}
	if h.killDone() {
		return nil
	}

	h.logger.Debug("killing task", "signal", s, "timeout", timeout)
	if err := h.signalGroup(s); err != nil {
		return err
	}
	graceCtx, cancel := context.WithTimeout(ctx, timeout)
	err = poll(graceCtx, h.killDone)
	cancel()
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("rawexec: kill task %q: %w", st.ID, ctx.Err())
	}
	h.logger.Info("task outlived its kill timeout; sending SIGKILL", "timeout", timeout)
	if err := h.signalGroup(syscall.SIGKILL); err != nil {
		return err
	}
	if err := poll(ctx, h.killDone); err != nil {
		return fmt.Errorf("rawexec: kill task %q: %w", st.ID, err)
	}
	return nil
}

// Signal sends sig (a name such as SIGHUP) to the task's process group
// while the task runs.
func (h *Handle) Signal(sig string) error {
	s, err := parseSignal(sig, syscall.SIGHUP)
	if err != nil {
		return fmt.Errorf("rawexec: signal task %q: %w", h.state.ID, err)
	}
	return h.signalGroup(s)
}

// signalGroup signals the task's process group, but only while its leader
// is the task: once it is gone its PID may belong to someone else, and the
// executor takes care of what is left in the group.
func (h *Handle) signalGroup(sig syscall.Signal) error {
	if !h.taskAlive() {
		return nil
	}
	err := syscall.Kill(-h.state.TaskPID, sig)
	if err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("rawexec: signal task %q with %s: %w", h.state.ID, sig, err)
	}
	return nil
}

// killDone reports an exit recorded, or a task and process group that are
// gone.
func (h *Handle) killDone() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	done, _ := h.checkLocked()
	if done {
		return true
	}
	return !h.taskAlive() && !groupExists(h.state.TaskPID)
}

// checkLocked looks for the end of the task: it returns done with the
// result, or done with nil when the task and its executor are gone without
// a result.
func (h *Handle) checkLocked() (done bool, res *ExitResult) {
	if h.result != nil {
		return true, h.result
	}
	h.reapLocked()
	if h.loadExitLocked() {
		return true, h.result
	}
	if h.taskAlive() || h.executorAliveLocked() {
		return false, nil
	}
	// The executor may have written the file just before exiting.
	if h.loadExitLocked() {
		return true, h.result
	}
	return true, nil
}

// loadExitLocked reads the exit file if it is there.
func (h *Handle) loadExitLocked() bool {
	if h.result != nil {
		return true
	}
	var res ExitResult
	err := readJSONFile(h.state.ExitPath, &res)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			h.logger.Warn("unreadable exit status", "path", h.state.ExitPath, "error", err)
		}
		return false
	}
	h.result = &res
	return true
}

// reapLocked collects the executor's exit status if this process is its
// parent and it has exited, so it does not linger as a zombie.
func (h *Handle) reapLocked() {
	if !h.ownsChild || h.executorReaped {
		return
	}
	var ws syscall.WaitStatus
	pid, err := syscall.Wait4(h.state.ExecutorPID, &ws, syscall.WNOHANG, nil)
	if pid == h.state.ExecutorPID || errors.Is(err, syscall.ECHILD) {
		h.executorReaped = true
		if pid == h.state.ExecutorPID && (ws.Signaled() || ws.ExitStatus() != 0) {
			h.logger.Warn("executor exited abnormally", "status", ws.ExitStatus(), "signal", ws.Signal())
		}
	}
}

func (h *Handle) taskAlive() bool {
	return h.state.TaskPID > 0 && processAlive(h.state.TaskPID, h.state.TaskStartTime)
}

// ExecutorAlive reports whether the task's executor still runs: the one
// process that records the task's exit and cleans up after it.
func (h *Handle) ExecutorAlive() bool { return h.executorAlive() }

func (h *Handle) executorAlive() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.executorAliveLocked()
}

func (h *Handle) executorAliveLocked() bool {
	if h.executorReaped || h.state.ExecutorPID <= 0 {
		return false
	}
	return processAlive(h.state.ExecutorPID, h.state.ExecutorStartTime)
}

// awaitStart waits until the executor reports the task's PIDs, or reports
// that it could not start it, or dies.
func (h *Handle) awaitStart(ctx context.Context) error {
	var startErr error
	err := poll(ctx, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		var st executorState
		if err := readJSONFile(h.state.StatePath, &st); err == nil {
			h.state.TaskPID = st.TaskPID
			h.state.TaskStartTime = st.TaskStartTime
			return true
		}
		h.reapLocked()
		if h.loadExitLocked() {
			// An exit without a state file: the task never ran.
			startErr = fmt.Errorf("executor could not run the task: %s", h.result.Err)
			return true
		}
		if !h.executorAliveLocked() {
			startErr = errors.New("executor exited without starting the task")
			return true
		}
		return false
	})
	if err != nil {
		return fmt.Errorf("waiting for the executor: %w", err)
	}
	return startErr
}

// abandon stops an executor whose start failed, and its task if any.
func (h *Handle) abandon() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.taskAlive() {
		_ = syscall.Kill(-h.state.TaskPID, syscall.SIGKILL)
	}
	if h.executorAliveLocked() {
		_ = syscall.Kill(h.state.ExecutorPID, syscall.SIGKILL)
	}
	if h.ownsChild && !h.executorReaped {
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(h.state.ExecutorPID, &ws, 0, nil)
		h.executorReaped = true
	}
}

// poll calls cond every pollInterval until it returns true or ctx ends.
func poll(ctx context.Context, cond func() bool) error {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
