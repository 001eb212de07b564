package rawexec

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// executorSpec is what the driver tells the executor to run (spec.json).
type executorSpec struct {
	ID string
	// Command is the resolved, absolute path of the program.
	Command string
	Args    []string
	// Env is the task's whole environment, KEY=VALUE.
	Env        []string
	Dir        string
	StdoutPath string
	StderrPath string
	StatePath  string
	ExitPath   string
	// Credential, when set, is who the task runs as.
	Credential *taskCredential `json:",omitempty"`
	// Launcher names the registered Launcher that starts the task (see
	// launcher.go), with its LaunchConfig; empty means a plain host
	// process.
	Launcher     string          `json:",omitempty"`
	LaunchConfig json.RawMessage `json:",omitempty"`
	// LockFD is the executor lock's descriptor, inherited from the driver
	// and held until the executor exits (see lock.go); 0 when there is
	// none.
	LockFD int `json:",omitempty"`
}

// taskCredential is the user and group a task runs as, with no
// supplementary groups.
type taskCredential struct {
	UID uint32
	GID uint32
}

// executorState is what the executor records once the task runs
// (state.json).
type executorState struct {
	ExecutorPID   int
	TaskPID       int
	TaskStartTime uint64
}

// RunExecutor is the body of the `roam executor <spec-file>` command: it
// runs the task described by the spec file until it exits, and records its
// PIDs and then its exit status next to the spec. It returns the executor's
// own exit code: 0 when an exit status was written (whatever the task's),
// 1 otherwise.
func RunExecutor(specPath string) int {
	// Catch, rather than ignore, the signals an agent's process group gets:
	// a caught signal is reset to its default in the task at exec, an ignored
	// one would stay ignored there. Nothing reads the channel; Notify drops
	// what does not fit.
	sigCh := make(chan os.Signal, 1)
	signal.Notify(sigCh, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigCh)

	logger := hclog.New(&hclog.LoggerOptions{
		Name:   "rawexec.executor",
		Output: os.Stderr,
		Level:  hclog.Info,
	})

	// The driver starts us as a session leader; when started otherwise, leave
	// the caller's session so its death (and its terminal) cannot reach us.
	if sid, err := unix.Getsid(0); err != nil || sid != os.Getpid() {
		if _, err := syscall.Setsid(); err != nil {
			logger.Warn("setsid failed", "error", err)
		}
	}

	var spec executorSpec
	if err := readJSONFile(specPath, &spec); err != nil {
		logger.Error("read spec", "path", specPath, "error", err)
		return 1
	}
	logger = logger.With("task_id", spec.ID)
	if spec.LockFD > 0 {
		// The lock is the executor's alone: a task that inherited it would
		// hold it past the executor's death.
		syscall.CloseOnExec(spec.LockFD)
	}

	res, err := runTask(logger, &spec)
	if err != nil {
		logger.Error("task did not start", "error", err)
		res = &ExitResult{ExitCode: -1, Err: err.Error(), FinishedAt: time.Now()}
	}
	if err := writeFileAtomic(spec.ExitPath, res); err != nil {
		logger.Error("write exit status", "error", err)
		return 1
	}
	logger.Info("task exited", "exit_code", res.ExitCode, "signal", res.Signal, "err", res.Err)
	return 0
}

// runTask starts the task, records its PIDs, and waits for it. An error
// means the task never ran.
func runTask(logger hclog.Logger, spec *executorSpec) (*ExitResult, error) {
	stdout, err := openOutput(spec.StdoutPath)
	if err != nil {
		return nil, err
	}
	defer stdout.Close()
	stderr, err := openOutput(spec.StderrPath)
	if err != nil {
		return nil, err
	}
	defer stderr.Close()

	var launcher Launcher = hostLauncher{}
	if spec.Launcher != "" {
		if launcher, err = lookupLauncher(spec.Launcher); err != nil {
			return nil, err
		}
	}
	cmd, err := launcher.Command(LaunchSpec{
		ID: spec.ID, Command: spec.Command, Args: spec.Args, Env: spec.Env, Dir: spec.Dir,
		Config: spec.LaunchConfig,
	})
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// Its own process group, so the driver can signal the task and all
	// its children at once without reaching the executor.
	cmd.SysProcAttr.Setpgid = true
	if c := spec.Credential; c != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: []uint32{}}
	}
	if err := cmd.Start(); err != nil {
		launcher.Finished(nil)
		return nil, fmt.Errorf("start %s: %w", spec.Command, err)
	}
	pid := cmd.Process.Pid
	if err := launcher.Started(pid); err != nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
		launcher.Finished(nil)
		return nil, fmt.Errorf("set up task: %w", err)
	}

	// The task is our unreaped child, so its /proc entry exists even if it
	// has already exited.
	st, err := readProcStat(pid)
	if err == nil {
		err = writeFileAtomic(spec.StatePath, executorState{
			ExecutorPID:   os.Getpid(),
			TaskPID:       pid,
			TaskStartTime: st.StartTime,
		})
	}
	if err != nil {
		// Without a state file nobody could find or stop the task.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
		launcher.Finished(nil)
		return nil, fmt.Errorf("record task state: %w", err)
	}
	logger.Info("task started", "pid", pid)

	// Wait for the task's main process without reaping it: while it is a
	// zombie its PID, and so its process group ID, cannot be reused, and the
	// rest of the group can be killed safely.
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EINTR) {
			logger.Warn("waitid", "error", err)
			break
		}
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		logger.Warn("kill leftover processes", "error", err)
	}

	res := &ExitResult{FinishedAt: time.Now()}
	err = cmd.Wait()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case !ok:
		res.ExitCode = -1
		res.Err = fmt.Sprintf("wait: %v", err)
	case ws.Signaled():
		res.Signal = int(ws.Signal())
		res.ExitCode = 128 + res.Signal
	default:
		res.ExitCode = ws.ExitStatus()
	}
	launcher.Finished(res)
	return res, nil
}

func openOutput(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open output: %w", err)
	}
	return f, nil
}
