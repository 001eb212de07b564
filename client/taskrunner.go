package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	execdriver "github.com/roamhq/roam/client/driver/exec"
	"github.com/roamhq/roam/client/driver/rawexec"
	"github.com/roamhq/roam/client/lifecycle"
	"github.com/roamhq/roam/client/taskenv"
	"github.com/roamhq/roam/structs"
)

// taskEventSetupFailure marks a task that could not be prepared (alloc
// dir, volumes); Nomad's API uses the same name.
const taskEventSetupFailure = "Setup Failure"

// errBadTaskConfig marks a task configuration the driver cannot run; such a
// task fails without restarts.
var errBadTaskConfig = errors.New("invalid task configuration")

// taskRunner runs one task of an allocation: it starts it, waits for it,
// applies the group's restart policy, and kills it when asked. Its state is
// persisted on every change so a restarted client picks up where it was.
type taskRunner struct {
	allocID string
	task    *structs.Task
	policy  *structs.RestartPolicy
	jobType string
	dirs    taskDirs
	env     map[string]string
	// nodeVars are the node's ${node.*}, ${attr.*} and ${meta.*}.
	nodeVars map[string]string
	drivers  *taskDrivers
	// volumeBinds gives an exec task its volume_mounts as bind mounts.
	volumeBinds func(context.Context) ([]execdriver.VolumeMount, error)
	db          *stateDB
	logger      hclog.Logger
	// csi takes plugin tasks (task.CSIPluginConfig set); csiSocket is where
	// such a task listens and csiDir its mount_dir. csiSocket is empty for
	// other tasks.
	csi       csiPluginHost
	csiSocket string
	csiDir    string
	// notify tells the alloc runner the task's state changed. It is called
	// without tr.mu held.
	notify func()

	// lc is the task's place in the group's lifecycle.
	lc lifecycle.Task
	// gate is closed when the task's turn to start has come (see
	// package lifecycle); a task waits on it before its first start.
	gate     chan struct{}
	gateOnce sync.Once

	// restartCh asks for a restart outside the restart policy (a
	// re-rendered template's change_mode restart), with the reason.
	restartCh chan string
	// templateEvery is how often templates are rendered again to look for
	// changes; 0 never.
	templateEvery time.Duration
	// templateUser owns the template files (set at each start).
	templateUser string
	// artifactsFetched is set once the task's artifacts are in place.
	artifactsFetched bool
	// current is the handle of the running task, nil between runs.
	current atomic.Pointer[rawexec.Handle]

	// killCh is closed by kill.
	killCh   chan struct{}
	killOnce sync.Once
	// doneCh is closed when run returns.
	doneCh chan struct{}

	// mu guards the fields below it.
	mu    sync.Mutex
	state *structs.TaskState
	rt    restartTracker
	// restored is a handle read from the state DB, to re-attach to.
	restored *rawexec.HandleState
	// killReason is set by kill.
	killReason string
}

// taskState returns a copy of the task's state.
func (tr *taskRunner) taskState() *structs.TaskState {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	st := *tr.state
	st.Events = append([]*structs.TaskEvent(nil), tr.state.Events...)
	return &st
}

// kill asks the task to stop. It does not wait; done closes when the task
// is dead (or the client shuts down).
func (tr *taskRunner) kill(reason string) {
	tr.killOnce.Do(func() {
		tr.mu.Lock()
		tr.killReason = reason
		tr.mu.Unlock()
		close(tr.killCh)
	})
}

// open lets the task start; it may be called any number of times.
func (tr *taskRunner) open() { tr.gateOnce.Do(func() { close(tr.gate) }) }

func (tr *taskRunner) killRequested() bool {
	select {
	case <-tr.killCh:
		return true
	default:
		return false
	}
}

func (tr *taskRunner) done() <-chan struct{} { return tr.doneCh }

// update changes the task's state with fn under tr.mu (so fn must not take
// it), persists it with handle (nil: none), and tells the alloc runner.
func (tr *taskRunner) update(handle *rawexec.HandleState, fn func(st *structs.TaskState)) {
	tr.mu.Lock()
	fn(tr.state)
	local := &localTaskState{State: tr.state, Restart: tr.rt}
	err := tr.db.putTask(tr.allocID, tr.task.Name, local, handle)
	tr.mu.Unlock()
	if err != nil {
		tr.logger.Error("failed to persist task state", "error", err)
	}
	tr.notify()
}

func newEvent(typ, msg string) *structs.TaskEvent {
	return &structs.TaskEvent{Type: typ, Time: time.Now().UnixNano(), Message: msg, DisplayMessage: msg}
}

// addEvent appends an event, keeping the last maxTaskEvents.
func addEvent(st *structs.TaskState, ev *structs.TaskEvent) {
	const maxTaskEvents = 10
	st.Events = append(st.Events, ev)
	if n := len(st.Events); n > maxTaskEvents {
		st.Events = append([]*structs.TaskEvent(nil), st.Events[n-maxTaskEvents:]...)
	}
}

// setDead marks the task dead, failed or not, with a last event.
func (tr *taskRunner) setDead(failed bool, ev *structs.TaskEvent) {
	tr.update(nil, func(st *structs.TaskState) {
		if ev != nil {
			addEvent(st, ev)
		}
		st.State = structs.TaskStateDead
		st.Failed = failed
		st.FinishedAt = time.Now()
	})
}

// run drives the task until it is dead or ctx (the client's lifetime) ends.
// When ctx ends the task is left running: the next client re-attaches.
func (tr *taskRunner) run(ctx context.Context) {
	defer close(tr.doneCh)

	tr.mu.Lock()
	dead := tr.state.State == structs.TaskStateDead
	restored := tr.restored
	tr.restored = nil
	tr.mu.Unlock()
	if dead {
		return
	}
	defer tr.startCSIPlugin(ctx)()

	var (
		handle *rawexec.Handle
		lost   error // set when the task ended without an exit status
	)
	if restored != nil {
		h, err := tr.drivers.reattach(tr.task.Driver, *restored)
		if err != nil {
			tr.logger.Warn("could not re-attach to task", "error", err)
			lost = err
		} else {
			handle = h
		}
	} else {
		// Its turn, a kill (then it never runs), or the client's end.
		select {
		case <-tr.gate:
		case <-tr.killCh:
		case <-ctx.Done():
			return
		}
	}

	for {
		if handle == nil && lost == nil {
			if tr.killRequested() {
				tr.setDead(false, newEvent(structs.TaskEventKilled, "task was not running when killed: "+tr.reason()))
				return
			}
			h, err := tr.start(ctx)
			switch {
			case err == nil:
				handle = h
			case ctx.Err() != nil:
				return
			case tr.killRequested():
				// Stopped while it was being prepared (an artifact
				// download, say): it never ran.
				tr.setDead(false, newEvent(structs.TaskEventKilled, "task killed before it started: "+tr.reason()))
				return
			case errors.Is(err, errBadTaskConfig), errors.Is(err, rawexec.ErrCommandNotFound), errors.Is(err, rawexec.ErrNotExecutable):
				tr.setDead(true, newEvent(structs.TaskEventDriverFailure, err.Error()))
				return
			default:
				tr.update(nil, func(st *structs.TaskState) {
					addEvent(st, newEvent(structs.TaskEventDriverFailure, err.Error()))
				})
				lost = err
			}
		}

		var res *rawexec.ExitResult
		if handle != nil {
			var killed, shutdown, restart bool
			stopWatch := tr.watchTemplates(ctx, handle)
			tr.current.Store(handle)
			res, lost, killed, shutdown, restart = tr.wait(ctx, handle)
			tr.current.Store(nil)
			stopWatch()
			select {
			case <-tr.restartCh: // asked for a run that has ended
			default:
			}
			if shutdown {
				return
			}
			if restart && !killed {
				// A re-rendered template asked for it: start again at
				// once, outside the restart policy.
				handle, lost = nil, nil
				continue
			}
			if killed {
				msg := "task killed: " + tr.reason()
				if res != nil {
					msg = fmt.Sprintf("%s (exit code %d, signal %d)", msg, res.ExitCode, res.Signal)
				}
				ev := newEvent(structs.TaskEventKilled, msg)
				if res != nil {
					ev.ExitCode, ev.Signal = res.ExitCode, res.Signal
				}
				tr.setDead(false, ev)
				return
			}
		}

		if !tr.handleExit(ctx, res, lost) {
			return
		}
		handle, lost = nil, nil
	}
}

func (tr *taskRunner) reason() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.killReason
}

// handleExit records how the task ended and applies the restart policy. It
// reports whether to start the task again.
func (tr *taskRunner) handleExit(ctx context.Context, res *rawexec.ExitResult, lost error) bool {
	var ev *structs.TaskEvent
	success := false
	switch {
	case res != nil && res.Err != "":
		ev = newEvent(structs.TaskEventDriverFailure, "task could not run: "+res.Err)
	case res != nil:
		success = res.Successful()
		msg := fmt.Sprintf("Exit Code: %d, Signal: %d", res.ExitCode, res.Signal)
		if res.OOMKilled {
			msg = fmt.Sprintf("OOM Killed: the task reached its memory limit of %d MiB (exit code %d, signal %d)",
				res.MemoryLimit>>20, res.ExitCode, res.Signal)
		}
		ev = newEvent(structs.TaskEventTerminated, msg)
		ev.ExitCode, ev.Signal = res.ExitCode, res.Signal
		ev.Details = map[string]string{"exit_code": strconv.Itoa(res.ExitCode), "signal": strconv.Itoa(res.Signal)}
		if res.OOMKilled {
			ev.Details["oom_killed"] = "true"
			ev.Details["memory_limit"] = strconv.FormatInt(res.MemoryLimit, 10)
		}
	case errors.Is(lost, rawexec.ErrTaskGone):
		ev = newEvent(structs.TaskEventTerminated, "task is gone and its exit status is unknown")
		ev.ExitCode = -1
	default:
		ev = newEvent(structs.TaskEventTerminated, fmt.Sprintf("task ended: %v", lost))
		ev.ExitCode = -1
	}

	if success && (tr.jobType == structs.JobTypeBatch || tr.lc.RunsToCompletion()) {
		tr.setDead(false, ev)
		return false
	}

	tr.mu.Lock()
	decision := tr.rt.next(tr.policy, time.Now())
	tr.mu.Unlock()
	if !decision.Restart {
		tr.update(nil, func(st *structs.TaskState) {
			addEvent(st, ev)
		})
		tr.setDead(!success, newEvent(structs.TaskEventNotRestarting, decision.Reason))
		return false
	}
	tr.update(nil, func(st *structs.TaskState) {
		addEvent(st, ev)
		re := newEvent(structs.TaskEventRestarting, fmt.Sprintf("restarting in %s: %s", decision.Delay, decision.Reason))
		addEvent(st, re)
		st.State = structs.TaskStatePending
		st.Restarts++
		st.LastRestart = time.Now()
	})
	tr.logger.Info("restarting task", "delay", decision.Delay, "reason", decision.Reason)

	timer := time.NewTimer(decision.Delay)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-tr.killCh:
		tr.setDead(false, newEvent(structs.TaskEventKilled, "task killed while waiting to restart: "+tr.reason()))
		return false
	case <-ctx.Done():
		return false
	}
}

// start starts the task with its driver and records its handle.
func (tr *taskRunner) start(ctx context.Context) (*rawexec.Handle, error) {
	var (
		h   *rawexec.Handle
		err error
	)
	// Artifacts come first (templates may read them), once per run of
	// the client.
	if !tr.artifactsFetched {
		if err := tr.fetchArtifacts(ctx); err != nil {
			return nil, err
		}
		tr.artifactsFetched = true
	}
	switch tr.task.Driver {
	case rawExecDriver:
		h, err = tr.startRawExec(ctx)
	case execDriver:
		h, err = tr.startExec(ctx)
	default:
		return nil, fmt.Errorf("%w: driver %q is not supported by this client (supported: %s, %s)", errBadTaskConfig, tr.task.Driver, execDriver, rawExecDriver)
	}
	if err != nil {
		return nil, err
	}
	hs := h.State()
	tr.update(&hs, func(st *structs.TaskState) {
		st.State = structs.TaskStateRunning
		st.StartedAt = time.Now()
		st.FinishedAt = time.Time{}
		addEvent(st, newEvent(structs.TaskEventStarted, "Task started by client"))
	})
	return h, nil
}

func (tr *taskRunner) startRawExec(ctx context.Context) (*rawexec.Handle, error) {
	command, args, err := parseCommandConfig(structs.ParseRawExecConfig, tr.task.Config)
	if err != nil {
		return nil, err
	}
	command, args = tr.interpolate(command, args)
	if err := tr.prepareCSIPlugin(); err != nil {
		return nil, err
	}
	taskUser := tr.drivers.raw.TaskUser(tr.task.User)
	if taskUser != "" {
		if err := chownTaskDirs(taskUser, tr.dirs); err != nil {
			return nil, err
		}
	}
	env, err := tr.renderTemplates(taskUser)
	if err != nil {
		return nil, err
	}
	return tr.drivers.raw.Start(ctx, rawexec.TaskConfig{
		ID:          tr.allocID + "/" + tr.task.Name,
		Command:     command,
		Args:        args,
		Env:         env,
		Dir:         tr.dirs.TaskDir,
		StdoutPath:  tr.dirs.Stdout,
		StderrPath:  tr.dirs.Stderr,
		KillSignal:  tr.task.KillSignal,
		KillTimeout: tr.task.KillTimeout,
		User:        taskUser,
	})
}

func (tr *taskRunner) startExec(ctx context.Context) (*rawexec.Handle, error) {
	if tr.drivers.exec == nil {
		return nil, fmt.Errorf("%w: driver %q is not available on this client: %s", errBadTaskConfig, execDriver, tr.drivers.execReason)
	}
	command, args, err := parseCommandConfig(structs.ParseExecConfig, tr.task.Config)
	if err != nil {
		return nil, err
	}
	command, args = tr.interpolate(command, args)
	binds, err := tr.volumeBinds(ctx)
	if err != nil {
		return nil, err
	}
	taskUser := execdriver.TaskUser(tr.task.User)
	if err := chownTaskDirs(taskUser, tr.dirs); err != nil {
		return nil, err
	}
	env, err := tr.renderTemplates(taskUser)
	if err != nil {
		return nil, err
	}
	var res execdriver.Resources
	if r := tr.task.Resources; r != nil {
		res = execdriver.Resources{CPU: r.CPU, MemoryMB: r.MemoryMB, MemoryMaxMB: r.MemoryMaxMB}
	}
	h, err := tr.drivers.exec.Start(ctx, execdriver.TaskConfig{
		ID:          tr.allocID + "/" + tr.task.Name,
		Command:     command,
		Args:        args,
		Env:         env,
		User:        taskUser,
		Dir:         tr.dirs.TaskDir,
		SharedDir:   tr.dirs.SharedDir,
		StdoutPath:  tr.dirs.Stdout,
		StderrPath:  tr.dirs.Stderr,
		KillSignal:  tr.task.KillSignal,
		KillTimeout: tr.task.KillTimeout,
		Resources:   res,
		Volumes:     binds,
	})
	if errors.Is(err, execdriver.ErrDeniedUser) || errors.Is(err, execdriver.ErrBadResources) {
		return nil, fmt.Errorf("%w: %w", errBadTaskConfig, err)
	}
	return h, err
}

// wait waits for the task to exit, killing it if asked. shutdown means ctx
// ended first and the task was left as it is.
func (tr *taskRunner) wait(ctx context.Context, h *rawexec.Handle) (res *rawexec.ExitResult, lost error, killed, shutdown, restart bool) {
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	type waitResult struct {
		res *rawexec.ExitResult
		err error
	}
	ch := make(chan waitResult, 1)
	go func() {
		r, err := h.Wait(waitCtx)
		ch <- waitResult{r, err}
	}()

	var r waitResult
	select {
	case r = <-ch:
	case reason := <-tr.restartCh:
		restart = true
		hs := h.State()
		tr.update(&hs, func(st *structs.TaskState) {
			addEvent(st, newEvent(structs.TaskEventRestartSignaled, reason))
		})
		if err := h.Kill(ctx, tr.task.KillSignal, tr.task.KillTimeout); err != nil {
			tr.logger.Warn("kill for a restart failed", "error", err)
		}
		r = <-ch
	case <-tr.killCh:
		killed = true
		ev := newEvent(structs.TaskEventKilling, fmt.Sprintf("sent %s, SIGKILL after %s: %s",
			orDefault(tr.task.KillSignal, rawexec.DefaultKillSignal), tr.killTimeout(), tr.reason()))
		// The handle stays recorded until the task is dead: a client that
		// dies while the task takes its kill timeout must re-attach to it
		// when it comes back, not start a second copy beside it.
		hs := h.State()
		tr.update(&hs, func(st *structs.TaskState) { addEvent(st, ev) })
		if err := h.Kill(ctx, tr.task.KillSignal, tr.task.KillTimeout); err != nil {
			tr.logger.Warn("kill failed", "error", err)
		}
		r = <-ch
	case <-ctx.Done():
		cancel()
		<-ch
		return nil, nil, false, true, false
	}
	if r.err != nil && ctx.Err() != nil {
		return nil, nil, false, true, false
	}
	if r.err != nil {
		return nil, r.err, killed, false, restart
	}
	return r.res, nil, killed, false, restart
}

func (tr *taskRunner) killTimeout() time.Duration {
	if tr.task.KillTimeout > 0 {
		return tr.task.KillTimeout
	}
	return rawexec.DefaultKillTimeout
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// parseCommandConfig reads a driver's options, command (a string,
// required) and args (a list of strings), with parse.
func parseCommandConfig(parse func(map[string]any) (string, []string, error), cfg map[string]any) (string, []string, error) {
	command, args, err := parse(cfg)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %w", errBadTaskConfig, err)
	}
	return command, args, nil
}

// interpolate resolves the ${...} references of a task's command and args
// (package taskenv).
func (tr *taskRunner) interpolate(command string, args []string) (string, []string) {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = taskenv.Interpolate(a, tr.env, tr.nodeVars)
	}
	return taskenv.Interpolate(command, tr.env, tr.nodeVars), out
}

// taskEnv is the environment a task gets on top of the client's own:
// Nomad's NOMAD_* variables, and the ROAM_* names Roam had first. Paths
// are as the task sees them: an exec task is chrooted into its task
// directory, a raw_exec task sees the host's paths.
func taskEnv(alloc *structs.Allocation, task *structs.Task, dirs taskDirs, datacenter string) map[string]string {
	env := make(map[string]string, len(task.Env)+24)
	for k, v := range task.Env {
		env[k] = v
	}
	taskDir, allocDir := dirs.TaskDir, dirs.SharedDir
	if task.Driver == execDriver {
		taskDir, allocDir = "/", "/"+sharedDirName
	}
	set := func(name, v string) {
		env["NOMAD_"+name] = v
		env["ROAM_"+name] = v
	}
	set("ALLOC_ID", alloc.ID)
	set("ALLOC_NAME", alloc.Name)
	set("ALLOC_INDEX", strconv.Itoa(alloc.Index()))
	set("JOB_ID", alloc.JobID)
	set("GROUP_NAME", alloc.TaskGroup)
	set("TASK_NAME", task.Name)
	set("NAMESPACE", orDefault(alloc.Namespace, structs.DefaultNamespace))
	set("ALLOC_DIR", allocDir)
	set("SECRETS_DIR", filepath.Join(taskDir, secretsDirName))
	// ROAM_TASK_DIR has always been the task's directory; Nomad's
	// NOMAD_TASK_DIR is its local/.
	env["ROAM_TASK_DIR"] = taskDir
	env["NOMAD_TASK_DIR"] = filepath.Join(taskDir, localDirName)
	if alloc.Job != nil {
		env["NOMAD_JOB_NAME"] = orDefault(alloc.Job.Name, alloc.JobID)
	}
	if datacenter != "" {
		env["NOMAD_DC"] = datacenter
	}
	if r := task.Resources; r != nil {
		env["NOMAD_CPU_LIMIT"] = strconv.Itoa(r.CPU)
		env["NOMAD_MEMORY_LIMIT"] = strconv.Itoa(r.MemoryMB)
		if r.MemoryMaxMB > r.MemoryMB {
			env["NOMAD_MEMORY_MAX_LIMIT"] = strconv.Itoa(r.MemoryMaxMB)
		}
	}
	// Host networking: the task listens on its host ports itself.
	for _, p := range alloc.Ports() {
		port, host := strconv.Itoa(p.TaskPort()), strconv.Itoa(p.Value)
		env["NOMAD_PORT_"+p.Label] = port
		env["NOMAD_IP_"+p.Label] = p.HostIP
		env["NOMAD_ADDR_"+p.Label] = net.JoinHostPort(p.HostIP, port)
		env["NOMAD_HOST_PORT_"+p.Label] = host
		env["NOMAD_HOST_IP_"+p.Label] = p.HostIP
		env["NOMAD_HOST_ADDR_"+p.Label] = net.JoinHostPort(p.HostIP, host)
	}
	// Where it runs: a plugin task names its node to the storage provider.
	env["ROAM_NODE_ID"] = alloc.NodeID
	env["ROAM_NODE_NAME"] = alloc.NodeName
	return env
}

// chownTaskDirs gives a task that runs as user the directories it writes:
// its task directory, local/, and the group's shared data/ and tmp/. The
// rest (logs, the driver's files, the client's state) stays the client's.
// Lchown: a link the task left in its directory is not followed.
func chownTaskDirs(user string, dirs taskDirs) error {
	uid, gid, err := rawexec.LookupUser(user)
	if err != nil {
		return fmt.Errorf("%w: %w", errBadTaskConfig, err)
	}
	for _, d := range []string{dirs.TaskDir, filepath.Join(dirs.TaskDir, localDirName), filepath.Join(dirs.TaskDir, secretsDirName),
		filepath.Join(dirs.SharedDir, "data"), filepath.Join(dirs.SharedDir, "tmp")} {
		if err := os.Lchown(d, int(uid), int(gid)); err != nil {
			return fmt.Errorf("give %s to task user %q: %w", d, user, err)
		}
	}
	return nil
}
