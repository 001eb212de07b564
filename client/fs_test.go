package client

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// The fs API lists, describes and reads an allocation's files, beneath
// its directory only: a link the task left that leads out, a task's
// secrets and the executor's files are refused.
func TestAllocFS(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	m := startTestManager(t, srv, dataDir, nil)
	killTasksOnCleanup(t, m)
	outside := filepath.Join(t.TempDir(), "host-secret")
	must.NoError(t, os.WriteFile(outside, []byte("host"), 0o644))
	task := shTask("web", `echo hello > local/greeting; echo s > secrets/token; ln -s `+outside+` local/escape
ln -s ../secrets local/s; ln -s ../.rawexec local/r; ln -s ../web/secrets "$NOMAD_ALLOC_DIR/x"; ln -s /etc local/etc; exec sleep 60`)
	alloc := testAlloc(srv.nodeID, structs.JobTypeService, noRestarts, task)
	srv.upsert(alloc)
	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusRunning)
	waitFile(t, filepath.Join(dataDir, "alloc", alloc.ID, "web", "local", "greeting"))
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		_, err := os.Lstat(filepath.Join(dataDir, "alloc", alloc.ID, "web", "local", "etc"))
		return err == nil
	}), wait.Timeout(20*time.Second), wait.Gap(20*time.Millisecond)))

	req := func(op, p string) (*structs.AllocFSResponse, error) {
		return m.allocFS(&structs.AllocFSRequest{AllocID: alloc.ID, Op: op, Path: p})
	}
	root, err := req(structs.AllocFSList, "/")
	must.NoError(t, err)
	names := map[string]bool{}
	for _, f := range root.Files {
		names[f.Name] = f.IsDir
	}
	must.Eq(t, map[string]bool{"alloc": true, "web": true}, names)
	web, err := req(structs.AllocFSList, "web")
	must.NoError(t, err)
	for _, f := range web.Files {
		must.NotEq(t, ".rawexec", f.Name)
		must.NotEq(t, "secrets", f.Name)
	}
	cat, err := req(structs.AllocFSCat, "web/local/greeting")
	must.NoError(t, err)
	must.Eq(t, "hello\n", string(cat.Data))
	must.Eq(t, int64(6), cat.Size)
	st, err := req(structs.AllocFSStat, "/web/local/../local/greeting")
	must.NoError(t, err)
	must.Eq(t, "greeting", st.File.Name)

	// Links inside the directory are followed, but not into secrets or
	// the executor's files, however they are reached.
	for _, p := range []string{"web/secrets/token", "web/secrets", "web/.rawexec/spec.json", "web/local/escape", "web/local/etc/passwd",
		"web/local/s/token", "web/local/s", "web/local/r/spec.json", "alloc/x/token"} {
		_, err := req(structs.AllocFSCat, p)
		must.ErrorIs(t, err, ErrFSDenied, must.Sprint(p))
	}
	// Climbing stops at the allocation directory: ../.. is its root.
	up, err := req(structs.AllocFSList, "../../..")
	must.NoError(t, err)
	must.Eq(t, len(root.Files), len(up.Files))
	_, err = req(structs.AllocFSCat, "web/local")
	must.ErrorIs(t, err, ErrBadLogRequest)
	_, err = req(structs.AllocFSList, "web/local/r")
	must.ErrorIs(t, err, ErrFSDenied)
	_, err = req(structs.AllocFSCat, "web/local/nope")
	must.ErrorIs(t, err, os.ErrNotExist)
	_, err = m.allocFS(&structs.AllocFSRequest{AllocID: "nope", Op: structs.AllocFSList, Path: "/"})
	must.ErrorIs(t, err, ErrUnknownAlloc)
}
