package client

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// Templates are rendered before the task starts: into local/ with their
// perms, into the shared alloc dir by ${NOMAD_ALLOC_DIR}, and as
// environment variables with env = true; a source template is read from
// the task dir.
func TestAllocRunner_TemplatesRenderBeforeStart(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	startTestManager(t, srv, dataDir, nil)
	task := shTask("web", `cat local/app.conf; echo "greeting=$GREETING"; cat "$NOMAD_ALLOC_DIR/shared.txt"; stat -c %a local/app.conf`)
	task.Templates = []*structs.Template{
		{EmbeddedTmpl: `alloc={{ env "NOMAD_ALLOC_ID" }} group={{ env "NOMAD_GROUP_NAME" | toUpper }}` + "\n", DestPath: "local/app.conf", Perms: "0640"},
		{EmbeddedTmpl: "GREETING=hello\n# comment\n", DestPath: "local/env", Envvars: true},
		{EmbeddedTmpl: `{{ file "local/app.conf" | trimSpace }} shared` + "\n", DestPath: "${NOMAD_ALLOC_DIR}/shared.txt"},
	}
	alloc := testAlloc(srv.nodeID, structs.JobTypeBatch, noRestarts, task)
	srv.upsert(alloc)
	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)
	out := waitFile(t, filepath.Join(dataDir, "alloc", alloc.ID, "alloc", "logs", "web.stdout.0"))
	want := "alloc=" + alloc.ID + " group=WEB\n" + "greeting=hello\n" + "alloc=" + alloc.ID + " group=WEB shared\n" + "640\n"
	must.Eq(t, want, out)
}

// A template that would read outside the task dir fails the task with
// the reason, and a link the task left at a destination is replaced, not
// written through: nothing outside the task dir is touched.
func TestAllocRunner_TemplatesStayInTheTaskDir(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	startTestManager(t, srv, dataDir, nil)

	outside := filepath.Join(t.TempDir(), "victim")
	must.NoError(t, os.WriteFile(outside, []byte("untouched"), 0o644))
	reader := shTask("reader", `exit 0`)
	reader.Templates = []*structs.Template{{EmbeddedTmpl: `{{ file "../../../../../../../../` + strings.TrimPrefix(outside, "/") + `" }}`, DestPath: "local/x"}}
	alloc := testAlloc(srv.nodeID, structs.JobTypeBatch, noRestarts, reader)
	srv.upsert(alloc)
	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusFailed)
	must.StrContains(t, describeTasks(got.TaskStates), "template 0 (local/x)")
	must.StrContains(t, describeTasks(got.TaskStates), "path escapes")

	// The first run plants a link at the destination; its restart renders
	// the template again, over the link.
	planter := shTask("planter", `if [ -e local/.planted ] && [ ! -L local/out ] && [ "$(cat local/out)" = rendered ]; then exit 0; fi
touch local/.planted; rm -f local/out; ln -s `+outside+` local/out; exit 1`)
	planter.Templates = []*structs.Template{{EmbeddedTmpl: "rendered", DestPath: "local/out"}}
	once := &structs.RestartPolicy{Attempts: 1, Interval: noRestarts.Interval, Delay: noRestarts.Delay, Mode: structs.RestartPolicyModeFail}
	alloc2 := testAlloc(srv.nodeID, structs.JobTypeBatch, once, planter)
	srv.upsert(alloc2)
	got = waitStatus(t, srv, alloc2.ID, structs.AllocClientStatusComplete)
	must.Eq(t, uint64(1), got.TaskStates["planter"].Restarts)
	b, err := os.ReadFile(outside)
	must.NoError(t, err)
	must.Eq(t, "untouched", string(b))
}

// A running task's template whose source changes is rendered again and
// acted on by its change_mode: restart starts the task again (outside its
// restart policy), signal sends the change_signal, noop only rewrites.
func TestAllocRunner_TemplateChangeModes(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	m := startTestManagerWith(t, srv, dataDir, nil, func(c *allocManagerConfig) { c.TemplateCheckInterval = 50 * time.Millisecond })
	killTasksOnCleanup(t, m)

	// Each task renders local/src (which it writes itself at first) to
	// local/out, and logs its starts and the signals it gets.
	task := func(name, mode, sig string) *structs.Task {
		tk := shTask(name, `echo start >> "$NOMAD_ALLOC_DIR/`+name+`.log"
trap 'echo hup >> "$NOMAD_ALLOC_DIR/`+name+`.log"' HUP
while :; do sleep 0.05; done`)
		tk.Templates = []*structs.Template{{SourcePath: "local/src", DestPath: "local/out", ChangeMode: mode, ChangeSignal: sig}}
		return tk
	}
	policy := &structs.RestartPolicy{Attempts: 0, Interval: time.Hour, Delay: 10 * time.Millisecond, Mode: structs.RestartPolicyModeFail}
	alloc := testAlloc(srv.nodeID, structs.JobTypeService, policy,
		task("restarter", "restart", ""), task("signalled", "signal", "SIGHUP"), task("quiet", "noop", ""))
	allocDir := filepath.Join(dataDir, "alloc", alloc.ID)
	// The sources exist before the tasks start: the client renders them
	// first.
	for _, name := range []string{"restarter", "signalled", "quiet"} {
		must.NoError(t, os.MkdirAll(filepath.Join(allocDir, name, "local"), 0o755))
		must.NoError(t, os.WriteFile(filepath.Join(allocDir, name, "local", "src"), []byte("v1"), 0o644))
	}
	srv.upsert(alloc)
	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusRunning)
	for _, name := range []string{"restarter", "signalled", "quiet"} {
		must.Eq(t, "start\n", waitFile(t, filepath.Join(allocDir, "alloc", name+".log")))
		waitFileEq(t, filepath.Join(allocDir, name, "local", "out"), "v1")
		must.NoError(t, os.WriteFile(filepath.Join(allocDir, name, "local", "src"), []byte("v2 {{ env \"NOMAD_TASK_NAME\" }}"), 0o644))
	}
	for _, name := range []string{"restarter", "signalled", "quiet"} {
		want := "v2 " + name
		must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
			b, _ := os.ReadFile(filepath.Join(allocDir, name, "local", "out"))
			return string(b) == want
		}), wait.Timeout(20*time.Second), wait.Gap(20*time.Millisecond)), must.Sprint(name+" re-rendered"))
	}
	must.Eq(t, "start\nstart\n", waitFileEq(t, filepath.Join(allocDir, "alloc", "restarter.log"), "start\nstart\n"))
	must.Eq(t, "start\nhup\n", waitFileEq(t, filepath.Join(allocDir, "alloc", "signalled.log"), "start\nhup\n"))
	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusRunning)
	must.Eq(t, uint64(0), got.TaskStates["restarter"].Restarts, must.Sprint("a template restart is not a policy restart"))
	must.StrContains(t, describeTasks(got.TaskStates), "template with change_mode restart re-rendered: local/out")
	must.Eq(t, "start\n", waitFile(t, filepath.Join(allocDir, "alloc", "quiet.log")))
}

// waitFileEq waits until path holds want and returns what it holds.
func waitFileEq(t *testing.T, path, want string) string {
	t.Helper()
	var got string
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		b, _ := os.ReadFile(path)
		got = string(b)
		return got == want
	}), wait.Timeout(20*time.Second), wait.Gap(20*time.Millisecond)), must.Sprintf("%s holds %q", path, got))
	return got
}

// A FIFO the task put where a template reads or writes does not hold the
// client: the render fails (or is skipped by the watcher) at once, and
// the allocation still stops. Two templates writing one shared file do
// not trip over each other's temporary file.
func TestAllocRunner_TemplateFIFOAndSharedDestinations(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	m := startTestManagerWith(t, srv, dataDir, nil, func(c *allocManagerConfig) { c.TemplateCheckInterval = 20 * time.Millisecond })
	killTasksOnCleanup(t, m)
	task := shTask("fifo", `rm -f local/out; mkfifo local/out; echo made > local/made; exec sleep 60`)
	task.Templates = []*structs.Template{{EmbeddedTmpl: "x", DestPath: "local/out"}, {EmbeddedTmpl: `{{ file "local/out" }}`, DestPath: "local/copy", ChangeMode: "noop"}}
	alloc := testAlloc(srv.nodeID, structs.JobTypeService, noRestarts, task)
	allocDir := filepath.Join(dataDir, "alloc", alloc.ID)
	srv.upsert(alloc)
	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusRunning)
	waitFile(t, filepath.Join(allocDir, "fifo", "local", "made"))
	// Let the watcher meet the FIFO a few times.
	for i := 0; i < 5; i++ {
		_, err := m.allocStats(alloc.ID)
		must.NoError(t, err)
	}
	stop := alloc.Copy()
	stop.DesiredStatus = structs.AllocDesiredStatusStop
	srv.upsert(stop)
	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)

	// Concurrent writers of one destination each put a whole file there.
	root, err := os.OpenRoot(t.TempDir())
	must.NoError(t, err)
	defer root.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				errs <- writeAtomic(root, "shared.conf", []byte(strings.Repeat("y", 4096)), 0o644, -1, -1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must.NoError(t, err)
	}
	b, err := root.ReadFile("shared.conf")
	must.NoError(t, err)
	must.Eq(t, 4096, len(b))
}
