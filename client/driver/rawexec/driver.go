package rawexec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
	"strconv"
)

// Errors returned by the driver. Wrapped errors name the task; compare with
// errors.Is.
var (
	// ErrTaskGone means a task is no longer running and its exit status is
	// unknown: its executor died without recording one, or the PID in a
	// persisted handle now belongs to another process.
	ErrTaskGone = errors.New("task is gone and its exit status is unknown")
	// ErrCommandNotFound means the task's command does not exist.
	ErrCommandNotFound = errors.New("command not found")
	// ErrNotExecutable means the task's command exists but cannot be run.
	ErrNotExecutable = errors.New("command is not an executable file")
	// ErrAlreadyRunning means the task directory belongs to a task that is
	// still running; re-attach to it instead of starting it again.
	ErrAlreadyRunning = errors.New("a task is already running in this task directory")
)

const (
	// DefaultKillSignal is sent first when a task is killed.
	DefaultKillSignal = "SIGINT"
	// DefaultKillTimeout is how long a killed task has to exit before
	// SIGKILL.
	DefaultKillTimeout = 5 * time.Second
	// DefaultStartTimeout bounds how long Start waits for the executor to
	// report that the task runs.
	DefaultStartTimeout = 30 * time.Second

	// pollInterval is how often handles look at the exit file and at
	// process liveness.
	pollInterval = 50 * time.Millisecond

	executorDirName = ".rawexec"
)

// Config configures a Driver.
type Config struct {
	// ExecutorPath is the binary run as `<path> executor <spec-file>`.
	// Empty means this process's own executable; tests point it at a binary
	// that calls RunExecutor.
	ExecutorPath string
	// StartTimeout bounds how long Start waits for the task to be running;
	// 0 means DefaultStartTimeout.
	StartTimeout time.Duration
	// Logger is required in production; nil means no logs.
	Logger hclog.Logger
	// Disabled refuses to start tasks (ErrDisabled); tasks started before
	// can still be recovered and stopped.
	Disabled bool
	// DefaultUser is the account a task that names none runs as; empty
	// means the client's own.
	DefaultUser string
}

// ErrDisabled is returned by Start on a driver that is not enabled.
var ErrDisabled = errors.New("raw_exec is not enabled on this client")

// DefaultConfig returns a Config that works as is.
func DefaultConfig() Config {
	return Config{StartTimeout: DefaultStartTimeout}
}

// Validate reports a bad value without changing anything.
func (c Config) Validate() error {
	if c.StartTimeout < 0 {
		return fmt.Errorf("rawexec: StartTimeout %s is negative", c.StartTimeout)
	}
	return nil
}

// Driver starts raw_exec tasks and re-attaches to them. It keeps no state
// of its own: everything lives in handles and in the task directories, so
// any number of Drivers (one per client incarnation) may coexist.
type Driver struct {
	executor     string
	startTimeout time.Duration
	logger       hclog.Logger
	disabled     bool
	defaultUser  string
}

// New returns a driver.
func New(cfg Config) (*Driver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Driver{
		executor:     cfg.ExecutorPath,
		startTimeout: cfg.StartTimeout,
		logger:       cfg.Logger,
		disabled:     cfg.Disabled,
		defaultUser:  cfg.DefaultUser,
	}
	if d.executor == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("rawexec: find executor binary: %w", err)
		}
		d.executor = exe
	}
	if d.startTimeout == 0 {
		d.startTimeout = DefaultStartTimeout
	}
	if d.logger == nil {
		d.logger = hclog.NewNullLogger()
	}
	d.logger = d.logger.Named("rawexec")
	return d, nil
}

// TaskConfig describes one task to start.
type TaskConfig struct {
	// ID names the task (alloc ID and task name) in logs.
	ID string
	// Command is the program: an absolute path, a path relative to Dir, or
	// a bare name looked up in the task's PATH.
	Command string
	Args    []string
	// Env is added to PATH, LANG, LC_ALL and TZ of the client's own
	// environment (and overrides them); nothing else of it is passed on.
	Env map[string]string
	// User, when set, is the account the task runs as (the executor stays
	// the client's). The caller makes the task's directories writable to
	// it.
	User string
	// Dir is the task directory and working directory; Start creates it.
	Dir string
	// StdoutPath and StderrPath receive the task's output, appended; empty
	// means stdout.log and stderr.log in Dir.
	StdoutPath string
	StderrPath string
	// KillSignal is sent first by Kill ("SIGINT", "TERM", …); empty means
	// DefaultKillSignal.
	KillSignal string
	// KillTimeout is how long Kill waits before SIGKILL; 0 means
	// DefaultKillTimeout.
	KillTimeout time.Duration
	// Launcher, when set, names the registered Launcher the executor
	// starts the task with, and LaunchConfig is its configuration
	// (encoded as JSON). Command is then passed on as it is, to be
	// resolved by the launcher, and must be absolute.
	Launcher     string
	LaunchConfig any
}

// Start starts the task under a new executor and returns once the task is
// running (or has already finished). The context bounds only the start; the
// task outlives it, and this process.
//
// A command that does not exist or is not executable fails here, before
// anything is spawned; a failure to exec it that only the executor sees
// (a bad binary format, say) is returned from Start as well.
func (d *Driver) Start(ctx context.Context, cfg TaskConfig) (*Handle, error) {
	if cfg.ID == "" {
		return nil, errors.New("rawexec: task ID is empty")
	}
	if d.disabled {
		return nil, fmt.Errorf("rawexec: start task %q: %w (enable it with plugin \"raw_exec\" { config { enabled = true } })", cfg.ID, ErrDisabled)
	}
	fail := func(err error) (*Handle, error) {
		return nil, fmt.Errorf("rawexec: start task %q: %w", cfg.ID, err)
	}
	if cfg.Command == "" {
		return fail(errors.New("command is empty"))
	}
	if cfg.Dir == "" {
		return fail(errors.New("task dir is empty"))
	}
	if cfg.KillTimeout < 0 {
		return fail(fmt.Errorf("kill timeout %s is negative", cfg.KillTimeout))
	}
	if _, err := parseSignal(cfg.KillSignal, syscall.SIGINT); err != nil {
		return fail(fmt.Errorf("kill signal: %w", err))
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return fail(fmt.Errorf("task dir: %w", err))
	}
	env := taskEnv(cfg.Env)
	command := cfg.Command
	var launchConfig json.RawMessage
	if cfg.Launcher == "" {
		if command, err = resolveCommand(cfg.Command, dir, env); err != nil {
			return fail(err)
		}
	} else {
		if !filepath.IsAbs(command) {
			return fail(fmt.Errorf("launcher %q: command %q is not absolute", cfg.Launcher, command))
		}
		if launchConfig, err = json.Marshal(cfg.LaunchConfig); err != nil {
			return fail(fmt.Errorf("launcher %q: encode config: %w", cfg.Launcher, err))
		}
	}

	exeDir := filepath.Join(dir, executorDirName)
	if err := os.MkdirAll(exeDir, 0o755); err != nil {
		return fail(fmt.Errorf("create task dir: %w", err))
	}
	lock, err := lockExecutorDir(exeDir)
	if errors.Is(err, errExecutorLives) {
		return d.adopt(ctx, cfg, exeDir)
	}
	if err != nil {
		return fail(err)
	}
	// From cmd.Start on, the executor's copy holds the lock (see lock.go).
	defer lock.Close()
	var cred *taskCredential
	if cfg.User != "" {
		uid, gid, err := LookupUser(cfg.User)
		if err != nil {
			return fail(err)
		}
		cred = &taskCredential{UID: uid, GID: gid}
	}
	spec := executorSpec{
		ID:         cfg.ID,
		Credential: cred,
		Command:    command,
		Args:       cfg.Args,
		Env:        env,
		Dir:        dir,
		StdoutPath: absOr(cfg.StdoutPath, dir, "stdout.log"),
		StderrPath: absOr(cfg.StderrPath, dir, "stderr.log"),
		StatePath:  filepath.Join(exeDir, "state.json"),
		ExitPath:   filepath.Join(exeDir, "exit.json"),
		LockFD:     executorLockFD,

		Launcher:     cfg.Launcher,
		LaunchConfig: launchConfig,
	}
	if err := d.clearPrevious(spec.StatePath, spec.ExitPath); err != nil {
		return fail(err)
	}
	specPath := filepath.Join(exeDir, "spec.json")
	if err := writeFileAtomic(specPath, spec); err != nil {
		return fail(err)
	}

	logPath := filepath.Join(exeDir, "executor.log")
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fail(fmt.Errorf("open executor log: %w", err))
	}
	cmd := &exec.Cmd{
		Path:   d.executor,
		Args:   []string{d.executor, "executor", specPath},
		Dir:    dir,
		Stdout: logFile,
		Stderr: logFile,
		// The executor lock, as executorLockFD.
		ExtraFiles: []*os.File{lock},
		// A session of its own from the first instruction, so nothing aimed
		// at the client's process group or terminal reaches it.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	err = cmd.Start()
	logFile.Close()
	if err != nil {
		return fail(fmt.Errorf("start executor %s: %w", d.executor, err))
	}
	execPID := cmd.Process.Pid
	// The executor is reaped with wait4 by the handle (see reapLocked), not
	// by os/exec, which would need a goroutine blocked until the task ends.
	_ = cmd.Process.Release()

	h := &Handle{
		logger:    d.logger.With("task_id", cfg.ID),
		ownsChild: true,
		state: HandleState{
			ID:          cfg.ID,
			ExecutorPID: execPID,
			StatePath:   spec.StatePath,
			ExitPath:    spec.ExitPath,
			KillSignal:  cfg.KillSignal,
			KillTimeout: cfg.KillTimeout,
		},
	}
	// Unreaped, so present in /proc even if it exited already.
	if st, err := readProcStat(execPID); err == nil {
		h.state.ExecutorStartTime = st.StartTime
	}

	startCtx, cancel := context.WithTimeout(ctx, d.startTimeout)
	defer cancel()
	if err := h.awaitStart(startCtx); err != nil {
		h.abandon()
		return fail(fmt.Errorf("%w%s", err, logTail(logPath)))
	}
	h.logger.Info("task started", "executor_pid", execPID, "task_pid", h.state.TaskPID)
	return h, nil
}

// clearPrevious removes the state and exit files a previous run of a task
// in the same directory left, unless that task still runs.
func (d *Driver) clearPrevious(statePath, exitPath string) error {
	var st executorState
	err := readJSONFile(statePath, &st)
	switch {
	case err == nil:
		if _, exitErr := os.Stat(exitPath); exitErr != nil && processAlive(st.TaskPID, st.TaskStartTime) {
			return fmt.Errorf("%w (pid %d)", ErrAlreadyRunning, st.TaskPID)
		}
	case !errors.Is(err, fs.ErrNotExist):
		d.logger.Warn("ignoring unreadable state of a previous run", "path", statePath, "error", err)
	}
	for _, p := range []string{statePath, exitPath} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove previous %s: %w", filepath.Base(p), err)
		}
	}
	return nil
}

// Reattach returns a handle for a task started by an earlier Driver, from
// the HandleState its handle reported. If the task has exited, the handle
// is already exited with the recorded result. If its process is gone
// without a recorded result, or its PID now names another process, the
// error is ErrTaskGone.
func (d *Driver) Reattach(state HandleState) (*Handle, error) {
	if state.ExitPath == "" {
		return nil, fmt.Errorf("rawexec: reattach task %q: handle state has no exit path", state.ID)
	}
	h := &Handle{logger: d.logger.With("task_id", state.ID), state: state}
	if h.loadExitLocked() {
		return h, nil
	}
	// A client killed inside Start may have persisted no PIDs; the
	// executor's state file has them.
	if h.state.TaskPID == 0 && h.state.StatePath != "" {
		var st executorState
		if err := readJSONFile(h.state.StatePath, &st); err == nil {
			h.state.ExecutorPID = st.ExecutorPID
			h.state.TaskPID = st.TaskPID
			h.state.TaskStartTime = st.TaskStartTime
		}
	}
	if h.taskAlive() || h.executorAlive() {
		h.logger.Info("re-attached to task", "task_pid", h.state.TaskPID, "executor_pid", h.state.ExecutorPID)
		return h, nil
	}
	// The executor may have written the exit file after the first look.
	if h.loadExitLocked() {
		return h, nil
	}
	return nil, fmt.Errorf("rawexec: reattach task %q (pid %d): %w", state.ID, state.TaskPID, ErrTaskGone)
}

// inheritedEnv are the only variables of the client's own environment a
// task gets: what a program needs to find commands and speak the host's
// locale. Anything else the agent was started with (a token, a cloud
// credential) stays out of the task's reach unless the job gives it.
var inheritedEnv = []string{"PATH", "LANG", "LC_ALL", "TZ"}

// taskEnv is inheritedEnv from the client's environment, overlaid with the
// task's variables.
func taskEnv(extra map[string]string) []string {
	out := make([]string, 0, len(inheritedEnv)+len(extra))
	for _, k := range inheritedEnv {
		if _, override := extra[k]; override {
			continue
		}
		if v, ok := os.LookupEnv(k); ok {
			out = append(out, k+"="+v)
		}
	}
	for k, v := range extra {
		out = append(out, k+"="+v)
	}
	return out
}

// resolveCommand finds the program to run, in the task's PATH for a bare
// name, and checks that it is an executable file.
func resolveCommand(command, dir string, env []string) (string, error) {
	if !strings.Contains(command, "/") {
		path := ""
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, "PATH="); ok {
				path = v
			}
		}
		var firstErr error
		for _, p := range filepath.SplitList(path) {
			if p == "" || !filepath.IsAbs(p) {
				continue // a relative PATH entry would depend on the cwd
			}
			cand := filepath.Join(p, command)
			err := checkExecutable(cand)
			if err == nil {
				return cand, nil
			}
			if firstErr == nil && !errors.Is(err, ErrCommandNotFound) {
				firstErr = err
			}
		}
		if firstErr != nil {
			return "", firstErr
		}
		return "", fmt.Errorf("%q is not in the task's PATH: %w", command, ErrCommandNotFound)
	}
	if !filepath.IsAbs(command) {
		command = filepath.Join(dir, command)
	}
	if err := checkExecutable(command); err != nil {
		return "", err
	}
	return command, nil
}

func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", path, ErrCommandNotFound)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is a %s: %w", path, fi.Mode().Type(), ErrNotExecutable)
	}
	if err := unix.Access(path, unix.X_OK); err != nil {
		return fmt.Errorf("%s: %v: %w", path, err, ErrNotExecutable)
	}
	return nil
}

func absOr(path, dir, def string) string {
	if path == "" {
		return filepath.Join(dir, def)
	}
	if !filepath.IsAbs(path) {
		return filepath.Join(dir, path)
	}
	return path
}

// logTail returns the end of the executor's log, for errors.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const max = 2048
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		_, _ = f.Seek(-max, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	s := strings.TrimSpace(string(b))
	if s == "" {
		return ""
	}
	return "; executor log: " + s
}

// ErrUnknownUser is returned for a task user that does not exist here.
var ErrUnknownUser = errors.New("unknown user")

// LookupUser returns the user and primary group IDs of the named account.
func LookupUser(name string) (uid, gid uint32, err error) {
	u, err := user.Lookup(name)
	if err != nil {
		return 0, 0, fmt.Errorf("task user %q: %w: %w", name, ErrUnknownUser, err)
	}
	id, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("task user %q: uid %q: %w", name, u.Uid, err)
	}
	g, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("task user %q: gid %q: %w", name, u.Gid, err)
	}
	return uint32(id), uint32(g), nil
}

// TaskUser is the account a task runs as: the one it names, or the
// driver's default user; "" means the client's own.
func (d *Driver) TaskUser(named string) string {
	if named != "" {
		return named
	}
	return d.defaultUser
}
