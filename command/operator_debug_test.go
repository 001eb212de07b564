package command

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/api"
)

// readArchive returns the files of a .tar.gz by name.
func readArchive(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	must.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	must.NoError(t, err)
	tr := tar.NewReader(zr)
	files := map[string][]byte{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		must.NoError(t, err)
		b, err := io.ReadAll(tr)
		must.NoError(t, err)
		files[hdr.Name] = b
	}
}

// roam operator debug gathers each server's profiles, taken on that
// server (the file names carry the ID each answer came from), and the
// cluster's view into one archive.
func TestCLI_OperatorDebug(t *testing.T) {
	agents := startServers(t, 3)
	addr := "http://" + agents[0].HTTPAddr()
	c, err := api.NewClient(&api.Config{Address: addr})
	must.NoError(t, err)
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		m, err := c.Agent().Members()
		if err != nil {
			return false
		}
		alive := 0
		for _, mem := range m.Members {
			if mem.Status == "alive" {
				alive++
			}
		}
		return alive == 3
	}), wait.Gap(50*time.Millisecond), wait.Timeout(20*time.Second)))

	dir := t.TempDir()
	code, out, errOut := run("operator", "debug", "-address", addr, "-duration", "1s", "-output", dir)
	must.EqOp(t, 0, code, must.Sprintf("%s\n%s", out, errOut))
	must.Eq(t, "", errOut)
	matches, err := filepath.Glob(filepath.Join(dir, "roam-debug-*.tar.gz"))
	must.NoError(t, err)
	must.SliceLen(t, 1, matches)
	must.StrContains(t, out, "3 servers answered of 3")

	files := readArchive(t, matches[0])
	root := strings.TrimSuffix(filepath.Base(matches[0]), ".tar.gz") + "/"
	for _, name := range []string{"cluster/members.json", "cluster/raft.json", "cluster/leader.json"} {
		must.MapContainsKey(t, files, root+name)
	}
	for _, a := range agents {
		dir := root + "servers/" + debugDirName(a.Config().Name, a.Server().ID()) + "/"
		must.True(t, bytes.HasPrefix(files[dir+"profile.prof"], []byte{0x1f, 0x8b}), must.Sprintf("%sprofile.prof", dir))
		must.True(t, bytes.HasPrefix(files[dir+"heap.prof"], []byte{0x1f, 0x8b}), must.Sprintf("%sheap.prof", dir))
		must.StrContains(t, string(files[dir+"goroutine.txt"]), "goroutine ")
		var summary map[string]any
		must.NoError(t, json.Unmarshal(files[dir+"metrics.json"], &summary), must.Sprintf("%smetrics.json", dir))
		must.MapNotContainsKey(t, files, dir+"errors.txt")
	}

	// Bad input is refused before anything is taken or written.
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-duration", "0s"}, "Invalid -duration"},
		{[]string{"-duration", "301s"}, "Invalid -duration"},
		{[]string{"-duration", "1500ms"}, "whole seconds"},
		{[]string{"-server-id", "no-such-server"}, `no server has ID "no-such-server"`},
		{[]string{"-output", filepath.Join(dir, "missing")}, "not a directory"},
		{[]string{"extra"}, "takes no arguments"},
	} {
		args := append([]string{"operator", "debug", "-address", addr, "-output", dir}, tc.args...)
		code, _, errOut := run(args...)
		must.EqOp(t, 1, code, must.Sprint(tc.args))
		must.StrContains(t, errOut, tc.says, must.Sprint(tc.args))
	}
	after, err := filepath.Glob(filepath.Join(dir, "roam-debug-*"))
	must.NoError(t, err)
	must.Eq(t, matches, after, must.Sprint("a refused run wrote an archive"))

	// Only the leader.
	dir2 := t.TempDir()
	code, out, errOut = run("operator", "debug", "-address", addr, "-duration", "1s", "-server-id", "leader", "-output", dir2)
	must.EqOp(t, 0, code, must.Sprintf("%s\n%s", out, errOut))
	must.StrContains(t, out, "1 servers answered of 1")
}
