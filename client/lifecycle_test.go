package client

import (
	"path/filepath"
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

	"github.com/roamhq/roam/structs"
)

func hooked(t *structs.Task, hook string, sidecar bool) *structs.Task {
	t.Lifecycle = &structs.TaskLifecycleConfig{Hook: hook, Sidecar: sidecar}
	return t
}

// A prestart task runs to completion first and writes a file the main
// task reads; a poststop task runs once the main task has exited; the
// allocation is complete only after it.
func TestAllocRunner_LifecycleOrder(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	startTestManager(t, srv, dataDir, nil)
	alloc := testAlloc(srv.nodeID, structs.JobTypeBatch, noRestarts,
		shTask("main", `cat "$NOMAD_ALLOC_DIR/config" >> "$NOMAD_ALLOC_DIR/order"; echo main >> "$NOMAD_ALLOC_DIR/order"`),
		hooked(shTask("init", `sleep 0.2; echo config-from-init > "$NOMAD_ALLOC_DIR/config"; echo init >> "$NOMAD_ALLOC_DIR/order"`), structs.TaskLifecycleHookPrestart, false),
		hooked(shTask("cleanup", `echo cleanup >> "$NOMAD_ALLOC_DIR/order"`), structs.TaskLifecycleHookPoststop, false),
	)
	srv.upsert(alloc)

	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)
	order := waitFile(t, filepath.Join(dataDir, "alloc", alloc.ID, "alloc", "order"))
	must.Eq(t, "init\nconfig-from-init\nmain\ncleanup\n", order)
	st := got.TaskStates
	for _, name := range []string{"init", "main", "cleanup"} {
		must.Eq(t, structs.TaskStateDead, st[name].State, must.Sprint(name))
		must.False(t, st[name].Failed, must.Sprint(name))
	}
	must.False(t, st["main"].StartedAt.Before(st["init"].FinishedAt), must.Sprint("main started before init finished"))
	must.False(t, st["cleanup"].StartedAt.Before(st["main"].FinishedAt), must.Sprint("cleanup started before main finished"))
}

// A prestart sidecar runs beside the main task and is stopped once it
// exits; a successful non-sidecar prestart task of a service job is not
// restarted.
func TestAllocRunner_LifecycleSidecarStopsAfterMain(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	killTasksOnCleanup(t, startTestManager(t, srv, dataDir, nil))
	policy := &structs.RestartPolicy{Attempts: 3, Interval: time.Hour, Delay: 10 * time.Millisecond, Mode: structs.RestartPolicyModeFail}
	alloc := testAlloc(srv.nodeID, structs.JobTypeBatch, policy,
		shTask("main", `while [ ! -e "$NOMAD_ALLOC_DIR/proxy-up" ]; do sleep 0.02; done; exit 0`),
		hooked(shTask("proxy", `echo up > "$NOMAD_ALLOC_DIR/proxy-up"; exec sleep 60`), structs.TaskLifecycleHookPrestart, true),
	)
	srv.upsert(alloc)
	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)
	proxy := got.TaskStates["proxy"]
	must.Eq(t, structs.TaskStateDead, proxy.State)
	must.False(t, proxy.Failed)
	must.Eq(t, 0, proxy.Restarts)
	must.StrContains(t, describeTasks(got.TaskStates), "the main tasks have exited")

	svc := testAlloc(srv.nodeID, structs.JobTypeService, policy,
		shTask("server", `exec sleep 60`),
		hooked(shTask("migrate", `echo migrated >> "$NOMAD_ALLOC_DIR/migrations"`), structs.TaskLifecycleHookPrestart, false),
	)
	srv.upsert(svc)
	got = waitStatus(t, srv, svc.ID, structs.AllocClientStatusRunning)
	must.Eq(t, structs.TaskStateDead, got.TaskStates["migrate"].State)
	must.Eq(t, 0, got.TaskStates["migrate"].Restarts)
	must.Eq(t, "migrated\n", waitFile(t, filepath.Join(dataDir, "alloc", svc.ID, "alloc", "migrations")))
}

// A prestart task that fails is restarted by the policy; once out of
// attempts the allocation fails, the main task never runs, and the
// poststop task still does. Stopping a running allocation runs its
// poststop task too.
func TestAllocRunner_LifecycleFailedPrestartAndStop(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	startTestManager(t, srv, dataDir, nil)
	once := &structs.RestartPolicy{Attempts: 1, Interval: time.Hour, Delay: 10 * time.Millisecond, Mode: structs.RestartPolicyModeFail}
	alloc := testAlloc(srv.nodeID, structs.JobTypeBatch, once,
		shTask("main", `echo ran > "$NOMAD_ALLOC_DIR/main"`),
		hooked(shTask("init", `echo try >> "$NOMAD_ALLOC_DIR/tries"; exit 3`), structs.TaskLifecycleHookPrestart, false),
		hooked(shTask("cleanup", `echo cleaned > "$NOMAD_ALLOC_DIR/cleanup"`), structs.TaskLifecycleHookPoststop, false),
	)
	srv.upsert(alloc)
	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusFailed)
	allocDir := filepath.Join(dataDir, "alloc", alloc.ID, "alloc")
	must.Eq(t, "cleaned\n", waitFile(t, filepath.Join(allocDir, "cleanup")))
	got = waitStatus(t, srv, alloc.ID, structs.AllocClientStatusFailed)
	must.Eq(t, 1, got.TaskStates["init"].Restarts)
	must.Eq(t, "try\ntry\n", waitFile(t, filepath.Join(allocDir, "tries")))
	must.True(t, got.TaskStates["main"].StartedAt.IsZero(), must.Sprint("main ran after a failed prestart"))
	must.FileNotExists(t, filepath.Join(allocDir, "main"))

	svc := testAlloc(srv.nodeID, structs.JobTypeService, noRestarts,
		shTask("server", `exec sleep 60`),
		hooked(shTask("cleanup", `echo cleaned > "$NOMAD_ALLOC_DIR/cleanup"`), structs.TaskLifecycleHookPoststop, false),
	)
	srv.upsert(svc)
	running := waitStatus(t, srv, svc.ID, structs.AllocClientStatusRunning)
	must.Eq(t, structs.TaskStatePending, running.TaskStates["cleanup"].State)
	stop := svc.Copy()
	stop.DesiredStatus = structs.AllocDesiredStatusStop
	srv.upsert(stop)
	got = waitStatus(t, srv, svc.ID, structs.AllocClientStatusComplete)
	must.Eq(t, "cleaned\n", waitFile(t, filepath.Join(dataDir, "alloc", svc.ID, "alloc", "cleanup")))
	must.True(t, strings.Contains(describeTasks(got.TaskStates), "cleanup: dead failed=false"), must.Sprint(describeTasks(got.TaskStates)))
}

// Concurrent state changes report in the order they read the states: a
// snapshot taken before a change is never the last report (the updater
// keeps only the last one, and no later change may come to fix it).
func TestAllocRunner_StaleStatesAreNotReportedLast(t *testing.T) {
	db, err := openStateDB(t.TempDir())
	must.NoError(t, err)
	t.Cleanup(func() { _ = db.close() })
	alloc := testAlloc("node-1", structs.JobTypeService, noRestarts, shTask("a", "true"))
	var (
		mu       sync.Mutex
		reports  []string
		calls    int
		firstIn  = make(chan struct{})
		releaseA = make(chan struct{})
	)
	ar := newAllocRunner(allocRunnerConfig{
		alloc: alloc, dataDir: t.TempDir(), db: db,
		logger: hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn}),
		report: func(u *structs.Allocation, _ bool) {
			mu.Lock()
			calls++
			first := calls == 1
			mu.Unlock()
			if first {
				close(firstIn)
				<-releaseA // the first reporter is slow to hand its snapshot over
			}
			mu.Lock()
			reports = append(reports, u.TaskStates["a"].State)
			mu.Unlock()
		},
	})
	tr := ar.tasks[0]
	doneA := make(chan struct{})
	go func() { defer close(doneA); ar.taskStateChanged() }() // reads "pending"
	<-firstIn
	tr.mu.Lock()
	tr.state.State = structs.TaskStateRunning
	tr.mu.Unlock()
	doneB := make(chan struct{})
	go func() { defer close(doneB); ar.taskStateChanged() }() // reads "running"
	// B would report before A here if it could (nothing else holds it):
	// give it that chance, bounded, before A hands its snapshot over.
	select {
	case <-doneB:
	case <-time.After(300 * time.Millisecond):
	}
	close(releaseA)
	<-doneA
	<-doneB
	mu.Lock()
	defer mu.Unlock()
	must.Eq(t, []string{structs.TaskStatePending, structs.TaskStateRunning}, reports)
}

// A poststop task runs after a stop, but one that hangs does not hold an
// allocation the servers removed, nor a dev client that stops.
func TestAllocRunner_HungPoststopEndsWithTheAllocation(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	m := startTestManager(t, srv, dataDir, nil)
	svc := testAlloc(srv.nodeID, structs.JobTypeService, noRestarts,
		shTask("server", `exec sleep 60`),
		hooked(shTask("cleanup", `echo $$ > "$NOMAD_ALLOC_DIR/cleanup.pid"; exec sleep 1000`), structs.TaskLifecycleHookPoststop, false),
	)
	srv.upsert(svc)
	waitStatus(t, srv, svc.ID, structs.AllocClientStatusRunning)
	stop := svc.Copy()
	stop.DesiredStatus = structs.AllocDesiredStatusStop
	srv.upsert(stop)
	pidText := waitFile(t, filepath.Join(dataDir, "alloc", svc.ID, "alloc", "cleanup.pid"))
	pid, err := strconv.Atoi(strings.TrimSpace(pidText))
	must.NoError(t, err)
	// The poststop task runs, so the allocation is not terminal yet.
	waitStatus(t, srv, svc.ID, structs.AllocClientStatusRunning)
	srv.remove(svc.ID)
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return m.getRunner(svc.ID) == nil && syscall.Kill(pid, 0) != nil }),
		wait.Timeout(30*time.Second), wait.Gap(20*time.Millisecond),
	), must.Sprint("the poststop task outlived its allocation"))
}
