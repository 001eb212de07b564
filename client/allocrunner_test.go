package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/client/driver/rawexec"
	"github.com/roamhq/roam/structs"
)

// fakeServer serves the two allocation RPCs from memory, the way the
// servers do: Node.GetClientAllocs blocks until the node's allocations
// change past MinQueryIndex, and Node.UpdateAlloc writes the client's
// status onto the stored allocation. Allocations go through the wire codec
// both ways.
type fakeServer struct {
	nodeID string

	mu      sync.Mutex
	index   uint64
	allocs  map[string]*structs.Allocation
	updates int
	// queries counts Node.GetClientAllocs calls.
	queries int
	// clusterID is answered with every allocation list.
	clusterID string
	// changed is closed and replaced on every change.
	changed chan struct{}
	// failQueries makes Node.GetClientAllocs fail while set, as a server
	// that does not know the node does.
	failQueries bool
}

func newFakeServer(nodeID string) *fakeServer {
	return &fakeServer{nodeID: nodeID, index: 1, allocs: make(map[string]*structs.Allocation), changed: make(chan struct{})}
}

func (f *fakeServer) bumpLocked() {
	f.index++
	close(f.changed)
	f.changed = make(chan struct{})
}

// roundTrip passes v through the wire codec.
func roundTrip[T any](v *T) *T {
	buf, err := encodeMsgpack(v)
	if err != nil {
		panic(fmt.Sprintf("fake server: encode: %v", err))
	}
	out := new(T)
	if err := structs.Decode(buf, out); err != nil {
		panic(fmt.Sprintf("fake server: decode: %v", err))
	}
	return out
}

func (f *fakeServer) RPC(method string, args, reply any) error {
	switch method {
	case "Node.GetClientAllocs":
		req := args.(*structs.NodeSpecificRequest)
		resp := reply.(*structs.NodeClientAllocsResponse)
		f.mu.Lock()
		f.queries++
		f.mu.Unlock()
		timer := time.NewTimer(req.MaxQueryTime)
		defer timer.Stop()
		for {
			f.mu.Lock()
			if f.failQueries {
				f.mu.Unlock()
				return fmt.Errorf("fake server: %w: token does not belong to node %s", structs.ErrPermissionDenied, req.NodeID)
			}
			if f.index > req.MinQueryIndex {
				break
			}
			ch := f.changed
			f.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-timer.C:
			}
			f.mu.Lock()
			break
		}
		defer f.mu.Unlock()
		resp.Index = f.index
		resp.ClusterID = f.clusterID
		resp.Allocs = nil
		for _, a := range f.allocs {
			if a.NodeID == req.NodeID {
				resp.Allocs = append(resp.Allocs, roundTrip(a))
			}
		}
		return nil
	case "Node.UpdateAlloc":
		req := roundTrip(args.(*structs.AllocUpdateRequest))
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, u := range req.Alloc {
			a, ok := f.allocs[u.ID]
			if !ok {
				continue
			}
			a = a.Copy()
			a.ClientStatus, a.ClientDescription, a.TaskStates, a.ModifyTime = u.ClientStatus, u.ClientDescription, u.TaskStates, u.ModifyTime
			a.ModifyIndex = f.index + 1
			f.allocs[u.ID] = a
		}
		f.updates++
		f.bumpLocked()
		return nil
	}
	return fmt.Errorf("fake server: unknown method %s", method)
}

func (f *fakeServer) upsert(a *structs.Allocation) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a = a.Copy()
	a.ModifyIndex, a.AllocModifyIndex = f.index+1, f.index+1
	f.allocs[a.ID] = a
	f.bumpLocked()
}

func (f *fakeServer) stop(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.allocs[id].Copy()
	a.DesiredStatus = structs.AllocDesiredStatusStop
	a.ModifyIndex, a.AllocModifyIndex = f.index+1, f.index+1
	f.allocs[id] = a
	f.bumpLocked()
}

func (f *fakeServer) remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.allocs, id)
	f.bumpLocked()
}

func (f *fakeServer) alloc(id string) *structs.Allocation {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.allocs[id].Copy()
}

// testManager is an allocManager on its own state DB; stop shuts it down
// (tasks keep running) and closes the DB, as a client shutdown does.
type testManager struct {
	*allocManager
	stopOnce sync.Once
	t        *testing.T
	db       *stateDB
}

func (tm *testManager) stop() {
	tm.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		must.NoError(tm.t, tm.shutdown(ctx))
		must.NoError(tm.t, tm.shutdown(ctx), must.Sprint("shutdown twice"))
		must.NoError(tm.t, tm.db.close())
	})
}

func startTestManager(t *testing.T, srv *fakeServer, dataDir string, hook VolumeHook) *testManager {
	t.Helper()
	return startTestManagerWith(t, srv, dataDir, hook, nil)
}

// startTestManagerWith is startTestManager with mutate applied to the
// manager's config.
func startTestManagerWith(t *testing.T, srv *fakeServer, dataDir string, hook VolumeHook, mutate func(*allocManagerConfig)) *testManager {
	t.Helper()
	logger := hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Debug, Output: hclog.DefaultOutput})
	db, err := openStateDB(dataDir)
	must.NoError(t, err)
	drivers, err := newTaskDrivers(&Config{ExecutorPath: os.Args[0], CgroupParent: "/roam-test-client"}, logger)
	must.NoError(t, err)
	registered := make(chan struct{})
	close(registered)
	cfg := allocManagerConfig{
		NodeID:          srv.nodeID,
		DataDir:         dataDir,
		Datacenter:      "dc1",
		RPC:             srv,
		DB:              db,
		Drivers:         drivers,
		VolumeHook:      hook,
		Logger:          logger,
		Registered:      registered,
		MaxQueryTime:    200 * time.Millisecond,
		UpdateInterval:  20 * time.Millisecond,
		MinRetryBackoff: 10 * time.Millisecond,
		MaxRetryBackoff: 100 * time.Millisecond,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	m := newAllocManager(cfg)
	m.start()
	tm := &testManager{allocManager: m, t: t, db: db}
	t.Cleanup(tm.stop)
	return tm
}

// shTask is a raw_exec task running script with /bin/sh.
func shTask(name, script string) *structs.Task {
	return &structs.Task{
		Name:        name,
		Driver:      rawExecDriver,
		Config:      map[string]any{"command": "/bin/sh", "args": []any{"-c", script}},
		Env:         map[string]string{"FOO": "bar"},
		KillTimeout: 2 * time.Second,
		KillSignal:  "SIGTERM",
	}
}

func testAlloc(nodeID, jobType string, policy *structs.RestartPolicy, tasks ...*structs.Task) *structs.Allocation {
	job := &structs.Job{
		ID:         "job-" + uuid.NewString()[:8],
		Type:       jobType,
		TaskGroups: []*structs.TaskGroup{{Name: "web", Count: 3, Tasks: tasks, RestartPolicy: policy}},
	}
	job.Canonicalize()
	return &structs.Allocation{
		ID:            uuid.NewString(),
		Namespace:     structs.DefaultNamespace,
		Name:          structs.AllocName(job.ID, "web", 2),
		NodeID:        nodeID,
		JobID:         job.ID,
		Job:           job,
		TaskGroup:     "web",
		DesiredStatus: structs.AllocDesiredStatusRun,
		ClientStatus:  structs.AllocClientStatusPending,
	}
}

var noRestarts = &structs.RestartPolicy{Attempts: 0, Interval: time.Hour, Delay: 10 * time.Millisecond, Mode: structs.RestartPolicyModeFail}

// waitStatus waits until the server sees the allocation in status.
func waitStatus(t *testing.T, srv *fakeServer, id, status string) *structs.Allocation {
	t.Helper()
	var a *structs.Allocation
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			a = srv.alloc(id)
			if a.ClientStatus != status {
				return fmt.Errorf("alloc client status %q (%s), want %q; tasks %s", a.ClientStatus, a.ClientDescription, status, describeTasks(a.TaskStates))
			}
			return nil
		}),
		wait.Timeout(30*time.Second),
		wait.Gap(20*time.Millisecond),
	))
	return a
}

func describeTasks(states map[string]*structs.TaskState) string {
	var b strings.Builder
	for name, st := range states {
		fmt.Fprintf(&b, "[%s: %s failed=%v restarts=%d events:", name, st.State, st.Failed, st.Restarts)
		for _, e := range st.Events {
			fmt.Fprintf(&b, " %s(%s)", e.Type, e.Message)
		}
		b.WriteString("] ")
	}
	return b.String()
}

func eventTypes(st *structs.TaskState) []string {
	var out []string
	for _, e := range st.Events {
		out = append(out, e.Type)
	}
	return out
}

func countEvents(st *structs.TaskState, typ string) int {
	n := 0
	for _, e := range st.Events {
		if e.Type == typ {
			n++
		}
	}
	return n
}

func waitFile(t *testing.T, path string) string {
	t.Helper()
	var content string
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if !strings.HasSuffix(string(b), "\n") {
				return fmt.Errorf("%s is incomplete: %q", path, b)
			}
			content = string(b)
			return nil
		}),
		wait.Timeout(20*time.Second),
		wait.Gap(20*time.Millisecond),
	))
	return content
}

func processAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	// A zombie is dead for our purposes.
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// killOnCleanup kills the process with the pid in path, if any, when the
// test ends, so that a failed test leaves no task behind.
func killOnCleanup(t *testing.T, path string) {
	t.Cleanup(func() {
		b, err := os.ReadFile(path)
		if err != nil {
			return
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 && processAlive(pid) {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

func logText(t *testing.T, m *testManager, allocID, task, stream, origin string, offset int64) string {
	t.Helper()
	rc, err := m.allocLogs(allocID, task, stream, origin, offset)
	must.NoError(t, err)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	must.NoError(t, err)
	return string(b)
}

func TestAllocRunner_BatchCompletes(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	m := startTestManager(t, srv, dataDir, nil)

	script := `echo hi; echo oops >&2
echo "$ROAM_ALLOC_ID|$ROAM_ALLOC_NAME|$ROAM_ALLOC_INDEX|$ROAM_JOB_ID|$ROAM_GROUP_NAME|$ROAM_TASK_NAME|$FOO|$ROAM_TASK_DIR|$(pwd)|$ROAM_NODE_ID" > "$ROAM_ALLOC_DIR/env.txt"
echo "$NOMAD_ALLOC_ID|$NOMAD_ALLOC_NAME|$NOMAD_ALLOC_INDEX|$NOMAD_JOB_ID|$NOMAD_JOB_NAME|$NOMAD_GROUP_NAME|$NOMAD_TASK_NAME|$NOMAD_NAMESPACE|$NOMAD_ALLOC_DIR|$NOMAD_TASK_DIR|$NOMAD_SECRETS_DIR|$NOMAD_DC|$NOMAD_CPU_LIMIT|$NOMAD_MEMORY_LIMIT" > "$ROAM_ALLOC_DIR/nomad_env.txt"
exit 0`
	alloc := testAlloc(srv.nodeID, structs.JobTypeBatch, noRestarts, shTask("hello", script))
	srv.upsert(alloc)

	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)
	must.Eq(t, "All tasks have completed", got.ClientDescription)
	st := got.TaskStates["hello"]
	must.NotNil(t, st)
	must.Eq(t, structs.TaskStateDead, st.State)
	must.False(t, st.Failed)
	must.Eq(t, []string{structs.TaskEventReceived, structs.TaskEventStarted, structs.TaskEventTerminated}, eventTypes(st))
	must.Eq(t, 0, st.Events[2].ExitCode)

	allocDir := filepath.Join(dataDir, "alloc", alloc.ID)
	taskDir := filepath.Join(allocDir, "hello")
	env := strings.TrimSpace(waitFile(t, filepath.Join(allocDir, "alloc", "env.txt")))
	must.Eq(t, strings.Join([]string{alloc.ID, alloc.Name, "2", alloc.JobID, "web", "hello", "bar", taskDir, taskDir, srv.nodeID}, "|"), env)
	must.DirExists(t, filepath.Join(taskDir, "local"))
	r := alloc.Job.TaskGroups[0].Tasks[0].Resources
	nomadEnv := strings.TrimSpace(waitFile(t, filepath.Join(allocDir, "alloc", "nomad_env.txt")))
	must.Eq(t, strings.Join([]string{alloc.ID, alloc.Name, "2", alloc.JobID, alloc.JobID, "web", "hello", "default",
		filepath.Join(allocDir, "alloc"), filepath.Join(taskDir, "local"), filepath.Join(taskDir, "secrets"), "dc1",
		fmt.Sprint(r.CPU), fmt.Sprint(r.MemoryMB)}, "|"), nomadEnv)
	fi, err := os.Stat(filepath.Join(taskDir, "secrets"))
	must.NoError(t, err)
	must.Eq(t, os.FileMode(0o700), fi.Mode().Perm())

	// Logs, through the API the HTTP layer uses.
	must.Eq(t, "hi\n", logText(t, m, alloc.ID, "hello", "stdout", "start", 0))
	must.Eq(t, "i\n", logText(t, m, alloc.ID, "hello", "stdout", "start", 1))
	must.Eq(t, "\n", logText(t, m, alloc.ID, "hello", "stdout", "end", 1))
	must.Eq(t, "hi\n", logText(t, m, alloc.ID, "hello", "stdout", "end", 100))
	must.Eq(t, "oops\n", logText(t, m, alloc.ID, "hello", "stderr", "start", 0))
	must.FileExists(t, filepath.Join(allocDir, "alloc", "logs", "hello.stdout.0"))

	_, err = m.allocLogs("nope", "hello", "stdout", "start", 0)
	must.ErrorIs(t, err, ErrUnknownAlloc)
	_, err = m.allocLogs(alloc.ID, "nope", "stdout", "start", 0)
	must.ErrorIs(t, err, ErrUnknownTask)
	_, err = m.allocLogs(alloc.ID, "hello", "stdin", "start", 0)
	must.ErrorIs(t, err, ErrBadLogRequest)
	_, err = m.allocLogs(alloc.ID, "hello", "stdout", "middle", 0)
	must.ErrorIs(t, err, ErrBadLogRequest)

	// Once the servers forget the allocation, the client does too.
	srv.remove(alloc.ID)
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return m.getRunner(alloc.ID) == nil }),
		wait.Timeout(20*time.Second), wait.Gap(20*time.Millisecond),
	))
	_, err = os.Stat(allocDir)
	must.True(t, errors.Is(err, os.ErrNotExist), must.Sprint("alloc dir should be removed"))
	restored, errs := m.db.loadAllocs()
	must.SliceEmpty(t, errs)
	must.SliceEmpty(t, restored)
}

func TestAllocRunner_RestartsThenFails(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	startTestManager(t, srv, dataDir, nil)

	policy := &structs.RestartPolicy{Attempts: 2, Interval: time.Hour, Delay: 50 * time.Millisecond, Mode: structs.RestartPolicyModeFail}
	alloc := testAlloc(srv.nodeID, structs.JobTypeBatch, policy, shTask("flaky", `echo run >> "$ROAM_ALLOC_DIR/runs"; exit 3`))
	srv.upsert(alloc)

	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusFailed)
	st := got.TaskStates["flaky"]
	must.Eq(t, structs.TaskStateDead, st.State)
	must.True(t, st.Failed)
	must.Eq(t, uint64(2), st.Restarts)
	must.Eq(t, 3, countEvents(st, structs.TaskEventStarted))
	must.Eq(t, 3, countEvents(st, structs.TaskEventTerminated))
	must.Eq(t, 2, countEvents(st, structs.TaskEventRestarting))
	must.Eq(t, structs.TaskEventNotRestarting, st.Events[len(st.Events)-1].Type)
	for _, e := range st.Events {
		if e.Type == structs.TaskEventTerminated {
			must.Eq(t, 3, e.ExitCode)
		}
	}
	runs := waitFile(t, filepath.Join(dataDir, "alloc", alloc.ID, "alloc", "runs"))
	must.Eq(t, "run\nrun\nrun\n", runs)
}

func TestAllocRunner_ServerStopKillsTasks(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	startTestManager(t, srv, dataDir, nil)

	alloc := testAlloc(srv.nodeID, structs.JobTypeService, noRestarts,
		shTask("server", `echo $$ > "$ROAM_ALLOC_DIR/pid"; exec sleep 60`))
	pidFile := filepath.Join(dataDir, "alloc", alloc.ID, "alloc", "pid")
	killOnCleanup(t, pidFile)
	srv.upsert(alloc)

	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusRunning)
	pid, err := strconv.Atoi(strings.TrimSpace(waitFile(t, pidFile)))
	must.NoError(t, err)
	must.True(t, processAlive(pid))

	srv.stop(alloc.ID)
	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)
	must.Eq(t, "stopped by server", got.ClientDescription)
	st := got.TaskStates["server"]
	must.False(t, st.Failed)
	must.Eq(t, 1, countEvents(st, structs.TaskEventKilling))
	must.Eq(t, structs.TaskEventKilled, st.Events[len(st.Events)-1].Type)
	must.False(t, processAlive(pid), must.Sprint("task process should be gone"))
}

func TestAllocRunner_FailedTaskKillsSiblings(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	startTestManager(t, srv, dataDir, nil)

	alloc := testAlloc(srv.nodeID, structs.JobTypeService, noRestarts,
		shTask("sleeper", `echo $$ > "$ROAM_ALLOC_DIR/pid"; exec sleep 60`),
		shTask("crasher", `while [ ! -e "$ROAM_ALLOC_DIR/pid" ]; do sleep 0.02; done; exit 1`))
	killOnCleanup(t, filepath.Join(dataDir, "alloc", alloc.ID, "alloc", "pid"))
	srv.upsert(alloc)

	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			a := srv.alloc(alloc.ID)
			if a.ClientStatus != structs.AllocClientStatusFailed || a.TaskStates["sleeper"].State != structs.TaskStateDead {
				return fmt.Errorf("status %q, tasks %s", a.ClientStatus, describeTasks(a.TaskStates))
			}
			return nil
		}),
		wait.Timeout(30*time.Second), wait.Gap(20*time.Millisecond),
	))
	got := srv.alloc(alloc.ID)
	must.True(t, got.TaskStates["crasher"].Failed)
	must.False(t, got.TaskStates["sleeper"].Failed)
	must.Eq(t, structs.TaskEventKilled, got.TaskStates["sleeper"].Events[len(got.TaskStates["sleeper"].Events)-1].Type)
}

func TestAllocRunner_BadConfigFails(t *testing.T) {
	srv := newFakeServer(uuid.NewString())
	startTestManager(t, srv, t.TempDir(), nil)

	task := shTask("bad", "true")
	task.Config = map[string]any{"args": []any{"x"}}
	alloc := testAlloc(srv.nodeID, structs.JobTypeService, nil, task)
	srv.upsert(alloc)

	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusFailed)
	st := got.TaskStates["bad"]
	must.True(t, st.Failed)
	last := st.Events[len(st.Events)-1]
	must.Eq(t, structs.TaskEventDriverFailure, last.Type)
	must.StrContains(t, last.Message, `"command"`)
	must.Eq(t, uint64(0), st.Restarts)
}

func TestAllocRunner_VolumesWithoutHookFail(t *testing.T) {
	srv := newFakeServer(uuid.NewString())
	startTestManager(t, srv, t.TempDir(), nil)

	alloc := testAlloc(srv.nodeID, structs.JobTypeService, nil, shTask("web", "exec sleep 60"))
	alloc.Job.TaskGroups[0].Volumes = map[string]*structs.VolumeRequest{"data": {Name: "data", Type: "csi", Source: "vol1"}}
	srv.upsert(alloc)

	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusFailed)
	st := got.TaskStates["web"]
	last := st.Events[len(st.Events)-1]
	must.Eq(t, taskEventSetupFailure, last.Type)
	must.StrContains(t, last.Message, "no volume support")
	must.Eq(t, 0, countEvents(st, structs.TaskEventStarted))
}

// fakeVolumes is a VolumeHook that hands out directories.
type fakeVolumes struct {
	dir       string
	mu        sync.Mutex
	mounted   []string // by Mount, not Remount
	unmounted []string
	remounted []string
	// remountErr, when set, is what Remount returns.
	remountErr error
	// remountBlocks makes Remount wait for its context, as the real one
	// does while the servers cannot be reached.
	remountBlocks bool
}

func (f *fakeVolumes) Mount(_ context.Context, alloc *structs.Allocation, vols map[string]*structs.VolumeRequest) (map[string]string, error) {
	f.mu.Lock()
	f.mounted = append(f.mounted, alloc.ID)
	f.mu.Unlock()
	return f.dirs(alloc, vols)
}

func (f *fakeVolumes) dirs(alloc *structs.Allocation, vols map[string]*structs.VolumeRequest) (map[string]string, error) {
	out := make(map[string]string)
	for name := range vols {
		p := filepath.Join(f.dir, alloc.ID, name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, err
		}
		out[name] = p
	}
	return out, nil
}

func (f *fakeVolumes) Remount(ctx context.Context, alloc *structs.Allocation, vols map[string]*structs.VolumeRequest) (map[string]string, error) {
	f.mu.Lock()
	f.remounted = append(f.remounted, alloc.ID)
	err, blocks := f.remountErr, f.remountBlocks
	f.mu.Unlock()
	if blocks {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	return f.dirs(alloc, vols)
}

// calls returns a copy of one of f's call records.
func (f *fakeVolumes) calls(which *[]string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(*which)
}

func (f *fakeVolumes) Unmount(_ context.Context, alloc *structs.Allocation) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unmounted = append(f.unmounted, alloc.ID)
	return nil
}

func TestAllocRunner_VolumeHook(t *testing.T) {
	srv := newFakeServer(uuid.NewString())
	hook := &fakeVolumes{dir: t.TempDir()}
	startTestManager(t, srv, t.TempDir(), hook)

	task := shTask("web", `echo data > "$ROAM_TASK_DIR/srv/data/file"`)
	task.VolumeMounts = []*structs.VolumeMount{{Volume: "data", Destination: "srv/data"}}
	alloc := testAlloc(srv.nodeID, structs.JobTypeBatch, noRestarts, task)
	alloc.Job.TaskGroups[0].Volumes = map[string]*structs.VolumeRequest{"data": {Name: "data", Type: "csi", Source: "vol1"}}
	srv.upsert(alloc)

	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)
	must.Eq(t, "data\n", waitFile(t, filepath.Join(hook.dir, alloc.ID, "data", "file")))
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool {
			hook.mu.Lock()
			defer hook.mu.Unlock()
			return len(hook.unmounted) == 1
		}),
		wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond),
	))
}

func TestAllocRunner_ReattachAfterClientRestart(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	m1 := startTestManager(t, srv, dataDir, nil)

	alloc := testAlloc(srv.nodeID, structs.JobTypeService, noRestarts,
		shTask("server", `echo start >> "$ROAM_ALLOC_DIR/starts"; echo $$ > "$ROAM_ALLOC_DIR/pid"; exec sleep 60`))
	sharedDir := filepath.Join(dataDir, "alloc", alloc.ID, "alloc")
	killOnCleanup(t, filepath.Join(sharedDir, "pid"))
	srv.upsert(alloc)

	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusRunning)
	pid, err := strconv.Atoi(strings.TrimSpace(waitFile(t, filepath.Join(sharedDir, "pid"))))
	must.NoError(t, err)

	// A client shutdown leaves the task running.
	m1.stop()
	must.True(t, processAlive(pid), must.Sprint("client shutdown must not kill tasks"))

	m2 := startTestManager(t, srv, dataDir, nil)
	ar := m2.getRunner(alloc.ID)
	must.NotNil(t, ar, must.Sprint("allocation should be restored from the state db"))
	must.Eq(t, structs.TaskStateRunning, ar.lookupTask("server").taskState().State)

	// The re-attached handle kills the original process.
	srv.stop(alloc.ID)
	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)
	must.Eq(t, "stopped by server", got.ClientDescription)
	st := got.TaskStates["server"]
	must.Eq(t, 1, countEvents(st, structs.TaskEventStarted), must.Sprint(describeTasks(got.TaskStates)))
	must.False(t, processAlive(pid))
	must.Eq(t, "start\n", waitFile(t, filepath.Join(sharedDir, "starts")))
}

func TestAllocRunner_ExitWhileClientDown(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	m1 := startTestManager(t, srv, dataDir, nil)

	alloc := testAlloc(srv.nodeID, structs.JobTypeService, noRestarts,
		shTask("waiter", `echo $$ > "$ROAM_ALLOC_DIR/pid"; while [ ! -e "$ROAM_ALLOC_DIR/go" ]; do sleep 0.02; done; exit 7`))
	sharedDir := filepath.Join(dataDir, "alloc", alloc.ID, "alloc")
	killOnCleanup(t, filepath.Join(sharedDir, "pid"))
	srv.upsert(alloc)

	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusRunning)
	pid, err := strconv.Atoi(strings.TrimSpace(waitFile(t, filepath.Join(sharedDir, "pid"))))
	must.NoError(t, err)
	m1.stop()

	// The task exits while no client watches it.
	must.NoError(t, os.WriteFile(filepath.Join(sharedDir, "go"), nil, 0o644))
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return !processAlive(pid) }),
		wait.Timeout(20*time.Second), wait.Gap(20*time.Millisecond),
	))

	startTestManager(t, srv, dataDir, nil)
	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusFailed)
	st := got.TaskStates["waiter"]
	must.True(t, st.Failed)
	must.Eq(t, 1, countEvents(st, structs.TaskEventStarted))
	var exit *structs.TaskEvent
	for _, e := range st.Events {
		if e.Type == structs.TaskEventTerminated {
			exit = e
		}
	}
	must.NotNil(t, exit, must.Sprint(describeTasks(got.TaskStates)))
	must.Eq(t, 7, exit.ExitCode)
}

func TestStateDB_RoundTrip(t *testing.T) {
	dir := t.TempDir()
	db, err := openStateDB(dir)
	must.NoError(t, err)
	alloc := testAlloc("node", structs.JobTypeService, nil, shTask("a", "true"))
	must.NoError(t, db.putAlloc(alloc))
	ts := &localTaskState{State: &structs.TaskState{State: structs.TaskStateRunning, Restarts: 2}, Restart: restartTracker{Count: 2, IntervalStart: time.Unix(100, 0)}}
	must.NoError(t, db.putTask(alloc.ID, "a", ts, &rawexec.HandleState{ID: "x", TaskPID: 42, ExitPath: "/e"}))
	must.NoError(t, db.close())

	db, err = openStateDB(dir)
	must.NoError(t, err)
	t.Cleanup(func() { _ = db.close() })
	got, errs := db.loadAllocs()
	must.SliceEmpty(t, errs)
	must.Len(t, 1, got)
	must.Eq(t, alloc.ID, got[0].Alloc.ID)
	must.Eq(t, []any{"-c", "true"}, got[0].Alloc.Job.TaskGroups[0].Tasks[0].Config["args"].([]any))
	must.Eq(t, uint64(2), got[0].Tasks["a"].State.Restarts)
	must.Eq(t, 2, got[0].Tasks["a"].Restart.Count)
	must.True(t, got[0].Tasks["a"].Restart.IntervalStart.Equal(time.Unix(100, 0)))
	must.Eq(t, 42, got[0].Handles["a"].TaskPID)

	// Writing the state without a handle removes the handle.
	must.NoError(t, db.putTask(alloc.ID, "a", ts, nil))
	got, _ = db.loadAllocs()
	must.MapEmpty(t, got[0].Handles)

	must.NoError(t, db.deleteAlloc(alloc.ID))
	got, _ = db.loadAllocs()
	must.SliceEmpty(t, got)
}

// A restored allocation whose task kept running re-establishes its volumes
// with Remount, which never gives them up, instead of a fresh Mount.
func TestAllocRunner_RestoredAllocRemountsVolumes(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	hook := &fakeVolumes{dir: t.TempDir()}
	m1, run := runVolumeAlloc(t, srv, dataDir, hook, shTask("server", `echo $$ > "$ROAM_ALLOC_DIR/pid"; exec sleep 60`))
	alloc, pid := run.alloc, run.pid

	m1.stop()
	hook.mu.Lock()
	must.SliceEmpty(t, hook.remounted)
	hook.mu.Unlock()

	m2 := startTestManager(t, srv, dataDir, hook)
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool {
			hook.mu.Lock()
			defer hook.mu.Unlock()
			return slices.Equal(hook.remounted, []string{alloc.ID})
		}),
		wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond),
	))
	ar := m2.getRunner(alloc.ID)
	must.NotNil(t, ar)
	must.Eq(t, structs.TaskStateRunning, ar.lookupTask("server").taskState().State)

	// Restarted again, with the servers refusing the claim: the task is
	// re-attached all the same (not marked failed while it runs), and
	// stops the usual way.
	m2.stop()
	hook.mu.Lock()
	hook.remountErr = fmt.Errorf("claim: %w: allocation is terminal", structs.ErrInvalidRequest)
	hook.mu.Unlock()
	m3 := startTestManager(t, srv, dataDir, hook)
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool {
			hook.mu.Lock()
			defer hook.mu.Unlock()
			return len(hook.remounted) == 2
		}),
		wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond),
	))
	ar = m3.getRunner(alloc.ID)
	must.NotNil(t, ar)
	must.Eq(t, structs.TaskStateRunning, ar.lookupTask("server").taskState().State)
	must.True(t, processAlive(pid))

	srv.stop(alloc.ID)
	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)
	must.False(t, processAlive(pid))
}

// stubbornTask ignores SIGINT and SIGTERM, so that a kill takes its whole kill timeout;
// it counts its starts in $ROAM_ALLOC_DIR/starts.
func stubbornTask(name string, killTimeout time.Duration) *structs.Task {
	task := shTask(name, `trap '' INT TERM; echo start >> "$ROAM_ALLOC_DIR/starts"; echo $$ > "$ROAM_ALLOC_DIR/pid"; while :; do sleep 0.05; done`)
	task.KillTimeout = killTimeout
	return task
}

// A client that dies while it is killing a stopped allocation's task (the
// task has not yet exited) must, once back, re-attach to that task and
// finish the kill: the servers will not say stop again, since nothing
// changed on their side. Starting it again instead would leave two copies
// writing to one volume, the first never killed.
func TestAllocRunner_StopCutShortByClientRestart(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	hook := &fakeVolumes{dir: t.TempDir()}
	m1, run := runVolumeAlloc(t, srv, dataDir, hook, stubbornTask("writer", 3*time.Second))
	alloc, sharedDir, pid := run.alloc, run.sharedDir, run.pid

	// The servers stop it; the client has sent the kill signal, which the task
	// ignores, and dies before the kill timeout.
	srv.stop(alloc.ID)
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool {
			return countEvents(m1.getRunner(alloc.ID).lookupTask("writer").taskState(), structs.TaskEventKilling) == 1
		}),
		wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond),
	))
	m1.stop()
	must.True(t, processAlive(pid), must.Sprint("the task ignores its kill signal; only the client's SIGKILL ends it"))

	// Back up with the servers out of reach: re-establishing the volumes
	// would wait for them, and must not hold up the kill.
	hook.mu.Lock()
	hook.remountBlocks = true
	hook.mu.Unlock()
	startTestManager(t, srv, dataDir, hook)
	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)
	must.False(t, processAlive(pid), must.Sprint("the first copy was never killed"))
	must.Eq(t, "start\n", waitFile(t, filepath.Join(sharedDir, "starts")),
		must.Sprintf("the task was started again: %s", describeTasks(got.TaskStates)))
	must.Eq(t, []string{alloc.ID}, hook.calls(&hook.mounted), must.Sprint("a stopped allocation claimed its volumes again"))
	must.SliceEmpty(t, hook.calls(&hook.remounted))
}

// The client's own outage stop, cut short by a client restart, is finished
// once the client is back: the servers still want the allocation running
// and never say stop, so the stop must come from the client's state DB.
// Running the task again instead would put a writer back on a volume the
// servers are about to free.
func TestAllocRunner_OutageStopCutShortByClientRestart(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	hook := &fakeVolumes{dir: t.TempDir()}
	m1, run := runVolumeAlloc(t, srv, dataDir, hook, stubbornTask("writer", 3*time.Second))
	alloc, sharedDir, pid := run.alloc, run.sharedDir, run.pid

	// Cut off, the client stops its volume holders; the task ignores the
	// signal, and the client dies inside the kill timeout.
	must.Eq(t, []string{alloc.ID}, m1.stopVolumeHolders("no server reached for 10s"))
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool {
			return countEvents(m1.getRunner(alloc.ID).lookupTask("writer").taskState(), structs.TaskEventKilling) == 1
		}),
		wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond),
	))
	m1.stop()
	must.True(t, processAlive(pid), must.Sprint("the task ignores its kill signal; only the client's SIGKILL ends it"))
	must.EqOp(t, structs.AllocDesiredStatusRun, srv.alloc(alloc.ID).DesiredStatus)

	// Back up, the servers still out of reach.
	hook.mu.Lock()
	hook.remountBlocks = true
	hook.mu.Unlock()
	startTestManager(t, srv, dataDir, hook)
	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)
	must.False(t, processAlive(pid), must.Sprint("the first copy was never killed"))
	must.Eq(t, "start\n", waitFile(t, filepath.Join(sharedDir, "starts")),
		must.Sprintf("the task was started again: %s", describeTasks(got.TaskStates)))
	must.Eq(t, []string{alloc.ID}, hook.calls(&hook.mounted), must.Sprint("a stopped allocation claimed its volumes again"))
}

// A restored allocation that the servers stopped before the restart, and
// whose task is no longer running, is neither started nor mounted again:
// its volumes are only released.
func TestAllocRunner_RestoredStoppedAllocNotStarted(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	hook := &fakeVolumes{dir: t.TempDir()}
	m1, run := runVolumeAlloc(t, srv, dataDir, hook, stubbornTask("writer", time.Second))
	alloc, sharedDir, pid := run.alloc, run.sharedDir, run.pid
	m1.stop()

	// While the client is down, its task ends, and the servers stop the
	// allocation; the client's state DB is made to hold that stop (as if
	// the client had received it before going down) with no handle, so
	// that the servers' unchanged answer is all the client hears.
	must.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return !processAlive(pid) }),
		wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond),
	))
	srv.stop(alloc.ID)
	db, err := openStateDB(dataDir)
	must.NoError(t, err)
	must.NoError(t, db.putAlloc(srv.alloc(alloc.ID)))
	restored, errs := db.loadAllocs()
	must.SliceEmpty(t, errs)
	must.Len(t, 1, restored)
	must.NoError(t, db.putTask(alloc.ID, "writer", restored[0].Tasks["writer"], nil))
	must.NoError(t, db.close())

	startTestManager(t, srv, dataDir, hook)
	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)
	must.Eq(t, "start\n", waitFile(t, filepath.Join(sharedDir, "starts")),
		must.Sprintf("the stopped allocation's task was started again: %s", describeTasks(got.TaskStates)))
	must.Eq(t, []string{alloc.ID}, hook.calls(&hook.mounted), must.Sprint("a stopped allocation claimed its volumes again"))
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return slices.Equal(hook.calls(&hook.unmounted), []string{alloc.ID}) }),
		wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond),
	))
}

// A restored allocation whose task kept running is re-attached while its
// volumes are being re-established, not after: the client's own outage
// stop must reach the task while Remount waits for servers it cannot
// reach.
func TestAllocRunner_RestoredTaskStoppableWhileRemountWaits(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	hook := &fakeVolumes{dir: t.TempDir()}
	m1, run := runVolumeAlloc(t, srv, dataDir, hook, shTask("writer", `echo $$ > "$ROAM_ALLOC_DIR/pid"; exec sleep 60`))
	alloc, pid := run.alloc, run.pid
	m1.stop()

	hook.mu.Lock()
	hook.remountBlocks = true
	hook.mu.Unlock()
	m2 := startTestManager(t, srv, dataDir, hook)
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return len(hook.calls(&hook.remounted)) == 1 }),
		wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond),
	))
	ids := m2.stopVolumeHolders("no server reached")
	must.Eq(t, []string{alloc.ID}, ids)
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return !processAlive(pid) }),
		wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond),
	), must.Sprint("the outage stop did not reach the task while Remount waited"))
}

// volumeAllocRun is one allocation with a CSI volume "data" (mounted at
// srv/data in task), started on a test manager with hook.
type volumeAllocRun struct {
	alloc     *structs.Allocation
	sharedDir string
	pid       int
}

// runVolumeAlloc runs task as a service allocation with volume "data" on
// a manager over dataDir, and waits until it runs and has written its pid
// to $ROAM_ALLOC_DIR/pid. It returns the manager too.
func runVolumeAlloc(t *testing.T, srv *fakeServer, dataDir string, hook *fakeVolumes, task *structs.Task) (*testManager, volumeAllocRun) {
	t.Helper()
	m := startTestManager(t, srv, dataDir, hook)
	task.VolumeMounts = []*structs.VolumeMount{{Volume: "data", Destination: "srv/data"}}
	alloc := testAlloc(srv.nodeID, structs.JobTypeService, noRestarts, task)
	alloc.Job.TaskGroups[0].Volumes = map[string]*structs.VolumeRequest{"data": {Name: "data", Type: "csi", Source: "vol1"}}
	sharedDir := filepath.Join(dataDir, "alloc", alloc.ID, "alloc")
	killOnCleanup(t, filepath.Join(sharedDir, "pid"))
	srv.upsert(alloc)
	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusRunning)
	pid, err := strconv.Atoi(strings.TrimSpace(waitFile(t, filepath.Join(sharedDir, "pid"))))
	must.NoError(t, err)
	return m, volumeAllocRun{alloc: alloc, sharedDir: sharedDir, pid: pid}
}

// An ephemeral client that is killing its allocations starts no new ones:
// the servers place replacements of what it kills while it stops, and a
// runner started then would outlive it.
func TestAllocManager_KillAllStartsNothingNew(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	m := startTestManager(t, srv, dataDir, nil)
	first := testAlloc(srv.nodeID, structs.JobTypeService, noRestarts, shTask("server", `exec sleep 60`))
	srv.upsert(first)
	waitStatus(t, srv, first.ID, structs.AllocClientStatusRunning)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	must.NoError(t, m.killAll(ctx))
	replacement := testAlloc(srv.nodeID, structs.JobTypeService, noRestarts, shTask("server", `exec sleep 60`))
	srv.upsert(replacement)
	// Two more queries: the watcher has had the list with the replacement
	// and acted on it.
	srv.mu.Lock()
	seen := srv.queries
	srv.mu.Unlock()
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool {
			srv.mu.Lock()
			defer srv.mu.Unlock()
			return srv.queries >= seen+2
		}),
		wait.Timeout(20*time.Second), wait.Gap(10*time.Millisecond),
	))
	must.Nil(t, m.getRunner(replacement.ID), must.Sprint("a runner started after killAll"))
}

// killTasksOnCleanup kills every task of m when the test ends, before m
// stops: a stopped manager leaves its tasks running, as a restarting
// client does, and tasks that never end on their own would outlive the
// test.
func killTasksOnCleanup(t *testing.T, m *testManager) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		must.NoError(t, m.killAll(ctx))
	})
}
