package client

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

func tarGz(t *testing.T, entries map[string]string, links map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, body := range entries {
		must.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(body))
		must.NoError(t, err)
	}
	for name, target := range links {
		must.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Linkname: target, Typeflag: tar.TypeSymlink}))
	}
	must.NoError(t, tw.Close())
	must.NoError(t, gz.Close())
	return buf.Bytes()
}

// Artifacts are fetched before the task starts: a file with its checksum
// checked, an archive unpacked into local/; a wrong checksum or an
// archive that climbs out fails the task with the reason and writes
// nothing outside the task dir.
func TestAllocRunner_Artifacts(t *testing.T) {
	outside := t.TempDir()
	files := map[string][]byte{
		"/tool.sh":     []byte("echo tool\n"),
		"/bundle.tgz":  tarGz(t, map[string]string{"conf/app.conf": "port=1\n", "README": "hi\n"}, nil),
		"/evil.tgz":    tarGz(t, map[string]string{"../../../../../../../../" + strings.TrimPrefix(outside, "/") + "/pwned": "x"}, nil),
		"/linkout.tgz": tarGz(t, map[string]string{"ok": "y"}, map[string]string{"etc": "/etc"}),
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	}))
	defer srv.Close()
	sum := sha256.Sum256(files["/tool.sh"])

	dataDir := t.TempDir()
	fake := newFakeServer(uuid.NewString())
	startTestManager(t, fake, dataDir, nil)

	good := shTask("good", `cat local/tool.sh local/conf/app.conf local/README; test -e local/etc && echo "etc link" >&2; exit 0`)
	good.Artifacts = []*structs.TaskArtifact{
		{GetterSource: srv.URL + "/tool.sh", GetterOptions: map[string]string{"checksum": "sha256:" + hex.EncodeToString(sum[:])}},
		{GetterSource: srv.URL + "/bundle.tgz"},
	}
	alloc := testAlloc(fake.nodeID, structs.JobTypeBatch, noRestarts, good)
	fake.upsert(alloc)
	got := waitStatus(t, fake, alloc.ID, structs.AllocClientStatusComplete)
	must.StrContains(t, describeTasks(got.TaskStates), "Downloading Artifacts")
	out := waitFile(t, filepath.Join(dataDir, "alloc", alloc.ID, "alloc", "logs", "good.stdout.0"))
	must.Eq(t, "echo tool\nport=1\nhi\n", out)

	for name, art := range map[string]*structs.TaskArtifact{
		"badsum": {GetterSource: srv.URL + "/tool.sh", GetterOptions: map[string]string{"checksum": "sha256:" + strings.Repeat("0", 64)}},
		"evil":   {GetterSource: srv.URL + "/evil.tgz"},
	} {
		task := shTask(name, `exit 0`)
		task.Artifacts = []*structs.TaskArtifact{art}
		a := testAlloc(fake.nodeID, structs.JobTypeBatch, noRestarts, task)
		fake.upsert(a)
		st := waitStatus(t, fake, a.ID, structs.AllocClientStatusFailed)
		must.StrContains(t, describeTasks(st.TaskStates), "Failed Artifact Download", must.Sprint(name))
	}
	// A file source is a file of the task directory, copied through it:
	// a link the task left there is not followed.
	must.NoError(t, os.WriteFile(filepath.Join(outside, "host-secret"), []byte("host"), 0o600))
	copier := shTask("copier", `cat local/copy/notes.txt`)
	copier.Artifacts = []*structs.TaskArtifact{{GetterSource: "file:local/notes.txt", RelativeDest: "local/copy"}}
	ca := testAlloc(fake.nodeID, structs.JobTypeBatch, noRestarts, copier)
	caDir := filepath.Join(dataDir, "alloc", ca.ID, "copier", "local")
	must.NoError(t, os.MkdirAll(caDir, 0o755))
	must.NoError(t, os.WriteFile(filepath.Join(caDir, "notes.txt"), []byte("mine\n"), 0o644))
	fake.upsert(ca)
	waitStatus(t, fake, ca.ID, structs.AllocClientStatusComplete)
	must.Eq(t, "mine\n", waitFile(t, filepath.Join(dataDir, "alloc", ca.ID, "alloc", "logs", "copier.stdout.0")))
	linked := shTask("linked", `exit 0`)
	linked.Artifacts = []*structs.TaskArtifact{{GetterSource: "file:local/secret"}}
	la := testAlloc(fake.nodeID, structs.JobTypeBatch, noRestarts, linked)
	laDir := filepath.Join(dataDir, "alloc", la.ID, "linked", "local")
	must.NoError(t, os.MkdirAll(laDir, 0o755))
	must.NoError(t, os.Symlink(filepath.Join(outside, "host-secret"), filepath.Join(laDir, "secret")))
	fake.upsert(la)
	st := waitStatus(t, fake, la.ID, structs.AllocClientStatusFailed)
	must.StrContains(t, describeTasks(st.TaskStates), "Failed Artifact Download")
	must.NoError(t, os.Remove(filepath.Join(outside, "host-secret")))

	entries, err := os.ReadDir(outside)
	must.NoError(t, err)
	must.SliceEmpty(t, entries, must.Sprint("an archive wrote outside the task dir"))

	// A symlink in an archive is not made a link out of the task dir.
	linker := shTask("linker", `if [ -L local/etc ]; then echo link; fi; cat local/ok`)
	linker.Artifacts = []*structs.TaskArtifact{{GetterSource: srv.URL + "/linkout.tgz"}}
	a := testAlloc(fake.nodeID, structs.JobTypeBatch, noRestarts, linker)
	fake.upsert(a)
	waitStatus(t, fake, a.ID, structs.AllocClientStatusComplete)
	must.Eq(t, "y", waitFileEq(t, filepath.Join(dataDir, "alloc", a.ID, "alloc", "logs", "linker.stdout.0"), "y"))
}

// A source on a link-local address (where clouds serve instance
// credentials) is refused; a download that hangs ends when the task is
// stopped.
func TestAllocRunner_ArtifactRefusalsAndStop(t *testing.T) {
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000000")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(hang) // before Close, which waits for the handler
	dataDir := t.TempDir()
	fake := newFakeServer(uuid.NewString())
	startTestManager(t, fake, dataDir, nil)

	meta := shTask("meta", `exit 0`)
	meta.Artifacts = []*structs.TaskArtifact{{GetterSource: "http://169.254.169.254/latest/meta-data/?token=s3cret"}}
	a := testAlloc(fake.nodeID, structs.JobTypeBatch, noRestarts, meta)
	fake.upsert(a)
	st := waitStatus(t, fake, a.ID, structs.AllocClientStatusFailed)
	desc := describeTasks(st.TaskStates)
	must.StrContains(t, desc, "link-local addresses are refused")
	must.StrNotContains(t, desc, "s3cret")

	slow := shTask("slow", `exit 0`)
	slow.Artifacts = []*structs.TaskArtifact{{GetterSource: srv.URL + "/big.bin"}}
	b := testAlloc(fake.nodeID, structs.JobTypeService, noRestarts, slow)
	fake.upsert(b)
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		return strings.Contains(describeTasks(fake.alloc(b.ID).TaskStates), "Downloading Artifacts")
	}), wait.Timeout(20*time.Second), wait.Gap(20*time.Millisecond)))
	stop := b.Copy()
	stop.DesiredStatus = structs.AllocDesiredStatusStop
	fake.upsert(stop)
	waitStatus(t, fake, b.ID, structs.AllocClientStatusComplete)
}
