package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	execdriver "github.com/roamhq/roam/client/driver/exec"
	"github.com/roamhq/roam/client/lifecycle"
	"github.com/roamhq/roam/client/taskenv"
	"github.com/roamhq/roam/structs"
)

// VolumeHook prepares a group's volumes on this node. The CSI volume
// manager implements it; without one, an allocation whose group requests
// volumes fails.
type VolumeHook interface {
	// Mount makes each of the group's volumes available before its tasks
	// start, and returns the host path of each by volume name.
	Mount(ctx context.Context, alloc *structs.Allocation, volumes map[string]*structs.VolumeRequest) (map[string]string, error)
	// Remount is Mount for an allocation restored after a client restart,
	// whose tasks may be running on the volumes: it keeps trying until done
	// or ctx ends, and never gives the volumes up.
	Remount(ctx context.Context, alloc *structs.Allocation, volumes map[string]*structs.VolumeRequest) (map[string]string, error)
	// Unmount releases the allocation's volumes once its tasks are dead.
	Unmount(ctx context.Context, alloc *structs.Allocation) error
}

// Allocation directory layout, under <DataDir>/alloc/<alloc ID>/:
//
//	alloc/                  shared by the group's tasks (ROAM_ALLOC_DIR)
//	alloc/logs/<task>.stdout.0, <task>.stderr.0
//	                        each task's output, appended across restarts
//	<task>/                 the task's directory and working directory
//	                        (ROAM_TASK_DIR); the driver keeps its files in
//	                        <task>/.rawexec/
//	<task>/local/           scratch space for the task (NOMAD_TASK_DIR)
//	<task>/secrets/         the task's secrets, readable by it alone; an
//	                        exec task gets a tmpfs there
const (
	sharedDirName  = "alloc"
	logsDirName    = "logs"
	localDirName   = "local"
	secretsDirName = "secrets"
)

// taskDirs are the paths of one task.
type taskDirs struct {
	SharedDir string
	TaskDir   string
	Stdout    string
	Stderr    string
}

// allocsDir is <DataDir>/alloc, beneath which every allocation
// directory lies.
func allocsDir(dataDir string) string { return filepath.Join(dataDir, "alloc") }

// allocDirPath is an allocation's directory; an allocation ID that
// structs.ValidateID refuses has none.
func allocDirPath(dataDir, allocID string) (string, error) {
	return idPath(allocsDir(dataDir), idOf(structs.IDKindAlloc, allocID))
}

func newTaskDirs(allocDir, task string) taskDirs {
	shared := filepath.Join(allocDir, sharedDirName)
	return taskDirs{
		SharedDir: shared,
		TaskDir:   filepath.Join(allocDir, task),
		Stdout:    filepath.Join(shared, logsDirName, task+".stdout.0"),
		Stderr:    filepath.Join(shared, logsDirName, task+".stderr.0"),
	}
}

// validTaskDirName rejects task names that would escape the alloc dir
// (structs.ValidateID) or collide with the shared directory.
func validTaskDirName(name string) error {
	if err := structs.ValidateID(structs.IDKindTask, name); err != nil {
		return err
	}
	if name == sharedDirName {
		return fmt.Errorf("task name %q cannot be used as a directory name in the allocation", name)
	}
	return nil
}

// allocRunner runs one allocation's tasks and reports its status.
type allocRunner struct {
	id string
	// allocsDir is <DataDir>/alloc; allocDir is this allocation's
	// directory beneath it, "" when its ID cannot name one (setupErr then
	// says why).
	allocsDir string
	allocDir  string
	db        *stateDB
	hook      VolumeHook
	logger    hclog.Logger
	// report sends the allocation's client-side status to the servers.
	report func(update *structs.Allocation, terminal bool)
	// reportMu makes reading the tasks' states and reporting them one
	// step (see taskStateChanged).
	reportMu sync.Mutex

	tasks []*taskRunner
	// setupErr fails the allocation before any task starts.
	setupErr error

	doneCh chan struct{}
	// remounted is closed once a restored allocation's volumes are
	// re-established (or that gave up); nil when there is nothing to wait
	// for. Its tasks run meanwhile (see prepare); finish waits for it.
	remounted chan struct{}

	// mu guards the fields below it.
	mu    sync.Mutex
	alloc *structs.Allocation
	// stopReason is set when the servers stop the allocation while tasks
	// still run.
	stopReason string
	// localStop is why the client stopped the allocation on its own (see
	// stopOnOwn), read back from the state DB after a restart; empty when
	// it did not.
	localStop string
	// volPaths are the host paths of the group's mounted volumes, by
	// name; nil until they are mounted.
	volPaths map[string]string
	// killedAll is set once every task has been told to die.
	killedAll  bool
	lastStatus string
	lastDesc   string
	destroy    bool
	destroyed  bool
	onDestroy  func()
}

// allocRunnerConfig is what a new alloc runner needs.
type allocRunnerConfig struct {
	alloc   *structs.Allocation
	dataDir string
	// datacenter is the node's, for the tasks' NOMAD_DC.
	datacenter string
	// nodeVars are the node's interpolation variables (package taskenv).
	nodeVars map[string]string
	// templateEvery is how often running tasks' templates are checked.
	templateEvery time.Duration
	drivers       *taskDrivers
	db            *stateDB
	hook          VolumeHook
	logger        hclog.Logger
	report        func(*structs.Allocation, bool)
	restored      *restoredAlloc // nil for a new allocation
	// csi takes the allocation's CSI plugin tasks; nil ignores them.
	csi csiPluginHost
}

func newAllocRunner(cfg allocRunnerConfig) *allocRunner {
	alloc := cfg.alloc
	ar := &allocRunner{
		id:        alloc.ID,
		allocsDir: allocsDir(cfg.dataDir),
		db:        cfg.db,
		hook:      cfg.hook,
		logger:    cfg.logger.With("alloc_id", alloc.ID),
		report:    cfg.report,
		doneCh:    make(chan struct{}),
		alloc:     alloc,
	}
	allocDir, dirErr := allocDirPath(cfg.dataDir, alloc.ID)
	if dirErr == nil {
		ar.allocDir = allocDir
	}
	tg := (*structs.TaskGroup)(nil)
	if alloc.Job != nil {
		tg = alloc.Job.LookupTaskGroup(alloc.TaskGroup)
	}
	switch {
	case dirErr != nil:
		ar.setupErr = dirErr
	case alloc.Job == nil:
		ar.setupErr = errors.New("allocation arrived without its job")
	case tg == nil:
		ar.setupErr = fmt.Errorf("job %q has no task group %q", alloc.JobID, alloc.TaskGroup)
	case len(tg.Volumes) > 0 && cfg.hook == nil:
		ar.setupErr = fmt.Errorf("group %q requests volumes, but this client has no volume support", tg.Name)
	}
	if cfg.restored != nil {
		ar.localStop = cfg.restored.LocalStop
	}
	if tg == nil {
		return ar
	}
	for _, task := range tg.Tasks {
		dirErr := validTaskDirName(task.Name)
		if dirErr != nil && ar.setupErr == nil {
			ar.setupErr = dirErr
		}
		// A task that cannot have directories gets none: it never starts
		// (setupErr), and no path is ever built from its name.
		var dirs taskDirs
		if dirErr == nil && ar.allocDir != "" {
			dirs = newTaskDirs(ar.allocDir, task.Name)
		}
		tr := &taskRunner{
			allocID:       alloc.ID,
			task:          task,
			lc:            lifecycleTask(task),
			gate:          make(chan struct{}),
			restartCh:     make(chan string, 1),
			templateEvery: cfg.templateEvery,
			policy:        tg.RestartPolicy,
			jobType:       alloc.Job.Type,
			dirs:          dirs,
			env:           taskenv.Env(taskEnv(alloc, task, dirs, cfg.datacenter), cfg.nodeVars),
			nodeVars:      cfg.nodeVars,
			drivers:       cfg.drivers,
			db:            cfg.db,
			logger:        ar.logger.With("task", task.Name),
			notify:        ar.taskStateChanged,
			killCh:        make(chan struct{}),
			doneCh:        make(chan struct{}),
			csi:           cfg.csi,
		}
		tr.volumeBinds = ar.execBinds(task)
		if task.CSIPluginConfig != nil && dirs.TaskDir != "" {
			socket, dir, err := csiPluginSocket(alloc.ID, task, dirs)
			if err != nil {
				if ar.setupErr == nil {
					ar.setupErr = err
				}
			} else {
				tr.csiSocket, tr.csiDir = socket, dir
				tr.env["CSI_ENDPOINT"] = "unix://" + tr.csiSocket
			}
		}
		if cfg.restored != nil && cfg.restored.Tasks[task.Name] != nil {
			local := cfg.restored.Tasks[task.Name]
			tr.state, tr.rt = local.State, local.Restart
			tr.restored = cfg.restored.Handles[task.Name]
		}
		if tr.state == nil {
			tr.state = &structs.TaskState{State: structs.TaskStatePending}
			addEvent(tr.state, newEvent(structs.TaskEventReceived, "Task received by client"))
		}
		ar.tasks = append(ar.tasks, tr)
	}
	return ar
}

// Alloc returns the allocation as last received.
func (ar *allocRunner) Alloc() *structs.Allocation {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	return ar.alloc
}

func (ar *allocRunner) lookupTask(name string) *taskRunner {
	for _, tr := range ar.tasks {
		if tr.task.Name == name {
			return tr
		}
	}
	return nil
}

// run prepares the allocation and runs its tasks until they are all dead
// or ctx (the client's lifetime) ends. The tasks keep running after a
// shutdown.
func (ar *allocRunner) run(ctx context.Context) {
	defer close(ar.doneCh)
	defer func() {
		if ar.remounted != nil {
			<-ar.remounted // ends with ctx, on a shutdown
		}
	}()

	// An allocation restored after a client restart may have been stopped
	// by the servers before the restart, its kill cut short: the servers
	// will not say so again (nothing changed on their side), so the stop
	// read back from the state DB is carried out now. A task still running
	// is re-attached and killed; one that is not is never started. Its
	// volumes are neither claimed again nor re-established: that waits on
	// the servers and the plugins, and must not hold up the kill. The
	// servers release the claims of the stopped allocation.
	// The same holds for a stop the client chose itself (the outage
	// stop): nobody else would repeat it.
	stopped, reason := ar.stopWanted(), "stopped by server"
	if !stopped {
		ar.mu.Lock()
		if ar.localStop != "" {
			stopped, reason = true, ar.localStop
		}
		ar.mu.Unlock()
	}
	if stopped {
		ar.stop(reason)
	}
	err := ar.setupErr
	if err == nil && !stopped {
		err = ar.prepare(ctx)
	}
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		ar.logger.Error("allocation setup failed", "error", err)
		for _, tr := range ar.tasks {
			if tr.taskState().State != structs.TaskStateDead {
				tr.setDead(true, newEvent(taskEventSetupFailure, err.Error()))
			}
			close(tr.doneCh)
		}
		ar.finish(ctx)
		return
	}

	ar.applyLifecycle()
	var wg sync.WaitGroup
	for _, tr := range ar.tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr.run(ctx)
		}()
	}
	// Report the restored or initial state even if no task changes.
	ar.taskStateChanged()
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	ar.finish(ctx)
}

// finish releases volumes and, if the servers forgot the allocation,
// destroys it. Called once every task is dead.
func (ar *allocRunner) finish(ctx context.Context) {
	ar.taskStateChanged()
	if ar.remounted != nil {
		// What Remount records is what Unmount releases.
		select {
		case <-ar.remounted:
		case <-ctx.Done():
			return
		}
	}
	if ar.hook != nil && ar.needsVolumes() {
		if err := ar.hook.Unmount(ctx, ar.Alloc()); err != nil {
			ar.logger.Error("failed to unmount volumes", "error", err)
		}
	}
	ar.mu.Lock()
	destroy := ar.destroy
	ar.mu.Unlock()
	if destroy {
		ar.destroyNow()
	}
}

func (ar *allocRunner) needsVolumes() bool {
	a := ar.Alloc()
	if a.Job == nil {
		return false
	}
	tg := a.Job.LookupTaskGroup(a.TaskGroup)
	return tg != nil && len(tg.Volumes) > 0
}

// restoredRunning reports whether the allocation was restored after a
// client restart with a task handle to re-attach to: a task that may still
// be running.
func (ar *allocRunner) restoredRunning() bool {
	for _, tr := range ar.tasks {
		if tr.restored != nil {
			return true
		}
	}
	return false
}

// prepare builds the allocation directory and mounts volumes. Every
// directory and link is made through an os.Root: on <DataDir>/alloc for
// the allocation's own directories, on the task directory for what goes
// inside it, which its task may have filled with links of its own.
func (ar *allocRunner) prepare(ctx context.Context) error {
	shared := filepath.Join(ar.allocDir, sharedDirName)
	// <DataDir>/alloc and the allocation's own directory are traversable
	// but not listable: a task run as another user reaches its own
	// directories by path, and cannot list the node's other allocations.
	if err := mkdirAllIn(ar.allocsDir, ar.allocDir, 0o711); err != nil {
		return fmt.Errorf("create alloc dir: %w", err)
	}
	for _, d := range []string{shared, filepath.Join(shared, logsDirName), filepath.Join(shared, "data"), filepath.Join(shared, "tmp")} {
		if err := mkdirAllIn(ar.allocsDir, d, 0o755); err != nil {
			return fmt.Errorf("create alloc dir: %w", err)
		}
	}
	for _, tr := range ar.tasks {
		if err := mkdirAllIn(ar.allocsDir, filepath.Join(tr.dirs.TaskDir, localDirName), 0o755); err != nil {
			return fmt.Errorf("create task dir: %w", err)
		}
		if err := mkdirAllIn(ar.allocsDir, filepath.Join(tr.dirs.TaskDir, secretsDirName), 0o700); err != nil {
			return fmt.Errorf("create task dir: %w", err)
		}
	}
	if !ar.needsVolumes() {
		return nil
	}
	alloc := ar.Alloc()
	tg := alloc.Job.LookupTaskGroup(alloc.TaskGroup)
	if ar.restoredRunning() {
		// Its tasks kept running through the restart, on volumes still
		// mounted and linked into their task dirs: failing or releasing
		// them now would pull storage from under the tasks. Should the
		// servers refuse the claim (the allocation stopped meanwhile) or
		// the plugin not come back, the tasks are re-attached anyway, to
		// be stopped the usual way. Re-establishing waits on the servers
		// and the plugins, so the tasks are re-attached meanwhile, not
		// after: a stop (by the servers, or the client's own outage stop)
		// must reach them while the servers are out of reach.
		ar.remounted = make(chan struct{})
		go func() {
			defer close(ar.remounted)
			paths, err := ar.hook.Remount(ctx, alloc, tg.Volumes)
			if err == nil {
				ar.mu.Lock()
				ar.volPaths = paths
				ar.mu.Unlock()
			}
			if err != nil && ctx.Err() == nil {
				ar.logger.Error("could not re-establish the volumes of a restored allocation; its tasks keep what they have",
					"error", err)
			}
		}()
		return nil
	}
	paths, err := ar.hook.Mount(ctx, alloc, tg.Volumes)
	if err != nil {
		return fmt.Errorf("mount volumes: %w", err)
	}
	ar.mu.Lock()
	ar.volPaths = paths
	ar.mu.Unlock()
	// raw_exec has no isolation: a volume_mount becomes a symlink in the
	// task dir at its destination. An exec task gets a bind mount there,
	// made inside its own mount namespace as it starts.
	for _, tr := range ar.tasks {
		for _, vm := range tr.task.VolumeMounts {
			src, ok := paths[vm.Volume]
			if !ok {
				return fmt.Errorf("task %q: volume %q was not mounted", tr.task.Name, vm.Volume)
			}
			if tr.task.Driver == execDriver {
				continue // see execBinds
			}
			if err := linkInTaskDir(tr.dirs.TaskDir, vm.Destination, src); err != nil {
				return fmt.Errorf("task %q: volume_mount %q: %w", tr.task.Name, vm.Volume, err)
			}
		}
	}
	return nil
}

// execBinds returns what an exec task's volume_mounts become: bind
// mounts of the group's volumes, once they are mounted. For a restored
// allocation it waits until they are re-established. A volume that is not
// mounted fails the start: a task must never run on the bare directory
// where its volume should be.
func (ar *allocRunner) execBinds(task *structs.Task) func(context.Context) ([]execdriver.VolumeMount, error) {
	return func(ctx context.Context) ([]execdriver.VolumeMount, error) {
		if len(task.VolumeMounts) == 0 {
			return nil, nil
		}
		if ch := ar.remounted; ch != nil {
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ar.mu.Lock()
		paths := ar.volPaths
		ar.mu.Unlock()
		out := make([]execdriver.VolumeMount, 0, len(task.VolumeMounts))
		for _, vm := range task.VolumeMounts {
			src, ok := paths[vm.Volume]
			if !ok {
				return nil, fmt.Errorf("volume %q is not mounted on this node", vm.Volume)
			}
			out = append(out, execdriver.VolumeMount{Source: src, Destination: vm.Destination, ReadOnly: vm.ReadOnly})
		}
		return out, nil
	}
}

// linkInTaskDir makes dest, taken relative to taskDir, a symbolic link to
// src, creating its parents. It works through an os.Root on taskDir, so a
// link the task made there cannot lead the parents or the link itself out
// of it. An existing entry at dest is left as it is.
func linkInTaskDir(taskDir, dest, src string) error {
	rel := strings.TrimLeft(filepath.Clean("/"+dest), "/")
	if rel == "" || !filepath.IsLocal(rel) {
		return fmt.Errorf("%w: destination %q is not a path inside the task directory", structs.ErrInvalidRequest, dest)
	}
	root, err := os.OpenRoot(taskDir)
	if err != nil {
		return err
	}
	defer root.Close()
	if dir := filepath.Dir(rel); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if err := root.Symlink(src, rel); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

// update records a newer version of the allocation from the servers and
// stops it if they want it stopped.
func (ar *allocRunner) update(alloc *structs.Allocation) {
	ar.mu.Lock()
	ar.alloc = alloc
	ar.mu.Unlock()
	if err := ar.db.putAlloc(alloc); err != nil {
		ar.logger.Error("failed to persist allocation", "error", err)
	}
	if alloc.DesiredStatus == structs.AllocDesiredStatusStop || alloc.DesiredStatus == structs.AllocDesiredStatusEvict {
		ar.stop("stopped by server")
	}
}

// stopWanted says whether the servers want the allocation stopped, as last
// received.
func (ar *allocRunner) stopWanted() bool {
	switch ar.Alloc().DesiredStatus {
	case structs.AllocDesiredStatusStop, structs.AllocDesiredStatusEvict:
		return true
	}
	return false
}

// stopOnOwn stops the allocation on the client's own decision, not the
// servers': the stop is recorded first, so that a client restarted inside
// the kill timeout finishes the kill instead of running the tasks again
// (the servers, which still want the allocation running, never say stop).
func (ar *allocRunner) stopOnOwn(reason string) {
	if reason == "" {
		reason = "stopped by the client"
	}
	ar.mu.Lock()
	first := ar.localStop == ""
	if first {
		ar.localStop = reason
	}
	ar.mu.Unlock()
	if first {
		if err := ar.db.putLocalStop(ar.id, reason); err != nil {
			// The kill goes ahead: a stop that is not recorded is still
			// better than a writer left running.
			ar.logger.Error("failed to persist the client's stop", "error", err)
		}
	}
	ar.stop(reason)
}

// stop kills every task without waiting.
func (ar *allocRunner) stop(reason string) {
	ar.mu.Lock()
	if ar.stopReason == "" && !ar.allDeadLocked() {
		ar.stopReason = reason
	}
	ar.mu.Unlock()
	ar.killAll(reason)
}

func (ar *allocRunner) killAll(reason string) {
	ar.mu.Lock()
	if ar.killedAll {
		ar.mu.Unlock()
		return
	}
	ar.killedAll = true
	ar.mu.Unlock()
	ar.logger.Info("killing tasks", "reason", reason)
	for _, tr := range ar.tasks {
		// poststop tasks run once the others are dead, however they
		// ended; they are there to clean up after a stop too.
		if tr.lc.Hook != lifecycle.Poststop {
			tr.kill(reason)
		}
	}
}

// killPoststop kills the poststop tasks too, running or not started: for
// an allocation that is going away (removed by the servers, or a dev
// client stopping), where nothing may outlive it.
func (ar *allocRunner) killPoststop(reason string) {
	for _, tr := range ar.tasks {
		if tr.lc.Hook == lifecycle.Poststop {
			tr.kill(reason)
		}
	}
}

func lifecycleTask(t *structs.Task) lifecycle.Task {
	lt := lifecycle.Task{Name: t.Name, Hook: t.LifecycleHook()}
	if t.Lifecycle != nil {
		lt.Sidecar = t.Lifecycle.Sidecar
	}
	return lt
}

// lifecycleState is where a task stands for package lifecycle.
func lifecycleState(st *structs.TaskState) lifecycle.State {
	switch {
	case st.State == structs.TaskStateDead && st.Failed:
		return lifecycle.Failed
	case st.State == structs.TaskStateDead:
		return lifecycle.Succeeded
	case st.State == structs.TaskStateRunning || !st.StartedAt.IsZero():
		return lifecycle.Started
	}
	return lifecycle.NotStarted
}

func (ar *allocRunner) lifecycleView(states map[string]*structs.TaskState) ([]lifecycle.Task, map[string]lifecycle.State) {
	tasks := make([]lifecycle.Task, 0, len(ar.tasks))
	ls := make(map[string]lifecycle.State, len(ar.tasks))
	for _, tr := range ar.tasks {
		tasks = append(tasks, tr.lc)
		if st := states[tr.task.Name]; st != nil {
			ls[tr.task.Name] = lifecycleState(st)
		}
	}
	return tasks, ls
}

// applyLifecycle lets the tasks whose turn has come start, and stops the
// sidecars once the main tasks are done.
func (ar *allocRunner) applyLifecycle() {
	states := make(map[string]*structs.TaskState, len(ar.tasks))
	for _, tr := range ar.tasks {
		states[tr.task.Name] = tr.taskState()
	}
	tasks, ls := ar.lifecycleView(states)
	d := lifecycle.Decide(tasks, ls)
	for _, name := range d.Start {
		if tr := ar.lookupTask(name); tr != nil {
			tr.open()
		}
	}
	for _, name := range d.Stop {
		if tr := ar.lookupTask(name); tr != nil {
			tr.kill("the main tasks have exited")
		}
	}
}

func (ar *allocRunner) allDeadLocked() bool {
	for _, tr := range ar.tasks {
		if tr.taskState().State != structs.TaskStateDead {
			return false
		}
	}
	return true
}

// clientStatus derives the allocation's status from its tasks' states: any
// failed task fails it; otherwise it is pending while any task is, running
// while any task runs, and complete once all are dead.
//
// A poststop task that waits for the others to end does not hold the
// allocation pending; once they have, it does, so that the allocation is
// not reported complete before its poststop tasks ran.
func clientStatus(states map[string]*structs.TaskState, tasks []lifecycle.Task) (string, string) {
	var failed, pending, running []string
	ls := make(map[string]lifecycle.State, len(states))
	for name, st := range states {
		ls[name] = lifecycleState(st)
	}
	for name, st := range states {
		switch {
		case st.State == structs.TaskStateDead && st.Failed:
			failed = append(failed, name)
		case st.State == structs.TaskStatePending && lifecycle.AwaitsTurn(tasks, ls, name):
		case st.State == structs.TaskStatePending:
			pending = append(pending, name)
		case st.State == structs.TaskStateRunning:
			running = append(running, name)
		}
	}
	switch {
	case len(failed) > 0:
		return structs.AllocClientStatusFailed, "Failed tasks"
	case len(pending) > 0:
		return structs.AllocClientStatusPending, "Tasks are pending"
	case len(running) > 0:
		return structs.AllocClientStatusRunning, "Tasks are running"
	}
	return structs.AllocClientStatusComplete, "All tasks have completed"
}

// taskStateChanged recomputes the allocation's status, kills the other
// tasks when one fails, and reports a changed status to the servers.
//
// The states are read and reported under reportMu: task runners call it
// concurrently, and the updater keeps the last report it is given, so a
// snapshot taken earlier must never be reported after a later one (it
// would stand until the next change, which may never come).
func (ar *allocRunner) taskStateChanged() {
	ar.reportMu.Lock()
	states := make(map[string]*structs.TaskState, len(ar.tasks))
	for _, tr := range ar.tasks {
		states[tr.task.Name] = tr.taskState()
	}
	tasks, _ := ar.lifecycleView(states)
	status, desc := clientStatus(states, tasks)

	ar.mu.Lock()
	if status == structs.AllocClientStatusComplete && ar.stopReason != "" {
		desc = ar.stopReason
	}
	update := &structs.Allocation{
		ID:                ar.id,
		NodeID:            ar.alloc.NodeID,
		ClientStatus:      status,
		ClientDescription: desc,
		TaskStates:        states,
		ModifyTime:        time.Now().UnixNano(),
	}
	ar.lastStatus, ar.lastDesc = status, desc
	ar.mu.Unlock()
	terminal := status == structs.AllocClientStatusComplete || status == structs.AllocClientStatusFailed
	ar.report(update, terminal)
	ar.reportMu.Unlock()

	if status == structs.AllocClientStatusFailed {
		ar.killAll("another task in the group failed")
	}
	ar.applyLifecycle()
}

// reportCurrent sends the allocation's current status again, as it is
// now: for servers that lost an earlier report (see allocManager.watch).
func (ar *allocRunner) reportCurrent() {
	ar.reportMu.Lock()
	defer ar.reportMu.Unlock()
	states := make(map[string]*structs.TaskState, len(ar.tasks))
	for _, tr := range ar.tasks {
		states[tr.task.Name] = tr.taskState()
	}
	tasks, _ := ar.lifecycleView(states)
	status, desc := clientStatus(states, tasks)
	ar.mu.Lock()
	if status == structs.AllocClientStatusComplete && ar.stopReason != "" {
		desc = ar.stopReason
	}
	update := &structs.Allocation{
		ID:                ar.id,
		NodeID:            ar.alloc.NodeID,
		ClientStatus:      status,
		ClientDescription: desc,
		TaskStates:        states,
		ModifyTime:        time.Now().UnixNano(),
	}
	ar.mu.Unlock()
	ar.report(update, status == structs.AllocClientStatusComplete || status == structs.AllocClientStatusFailed)
}

// status returns the allocation's last computed client status.
func (ar *allocRunner) status() (string, string) {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	return ar.lastStatus, ar.lastDesc
}

// isDone reports whether run has returned.
func (ar *allocRunner) isDone() bool {
	select {
	case <-ar.doneCh:
		return true
	default:
		return false
	}
}

// markDestroy asks that the allocation be removed (state and directory)
// once its tasks are dead, killing them first. onDestroy runs after.
func (ar *allocRunner) markDestroy(onDestroy func()) {
	ar.mu.Lock()
	ar.destroy = true
	ar.onDestroy = onDestroy
	ar.mu.Unlock()
	ar.stop("allocation removed by server")
	ar.killPoststop("allocation removed by server")
	if ar.isDone() && ar.allDead() {
		ar.destroyNow()
	}
}

func (ar *allocRunner) allDead() bool {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	return ar.allDeadLocked()
}

func (ar *allocRunner) destroyNow() {
	ar.mu.Lock()
	if ar.destroyed {
		ar.mu.Unlock()
		return
	}
	ar.destroyed = true
	onDestroy := ar.onDestroy
	ar.mu.Unlock()
	if err := ar.db.deleteAlloc(ar.id); err != nil {
		ar.logger.Error("failed to forget allocation", "error", err)
	}
	if ar.allocDir != "" {
		if err := removeAllIn(ar.allocsDir, ar.allocDir); err != nil {
			ar.logger.Error("failed to remove allocation directory", "error", err)
		}
	}
	ar.logger.Info("allocation garbage collected")
	if onDestroy != nil {
		onDestroy()
	}
}
