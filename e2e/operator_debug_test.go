//go:build e2e

package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// TestOperatorDebug_EveryServer runs roam operator debug against three
// real server processes: one archive, one directory per server with its
// CPU profile, goroutine stacks, heap profile and metrics.
func TestOperatorDebug_EveryServer(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, Opts{Servers: 3, ServerConfigExtra: "enable_debug = true\n"})
	c.Leader()
	var ids []string
	WaitFor(t, settle, func() error {
		m, err := Members(c.ServerHTTP(0))
		if err != nil {
			return err
		}
		ids = ids[:0]
		for _, mem := range m.Members {
			if mem.Status == "alive" {
				ids = append(ids, mem.Tags["id"])
			}
		}
		if len(ids) != 3 {
			return fmt.Errorf("%d servers alive, want 3", len(ids))
		}
		return nil
	})

	dir := t.TempDir()
	out, errOut, code := c.RunCLI("operator", "debug", "-duration", "1s", "-output", dir)
	must.Eq(t, 0, code, must.Sprintf("roam operator debug: %s%s", out, errOut))
	must.StrContains(t, out, "3 servers answered of 3")
	archives, err := filepath.Glob(filepath.Join(dir, "roam-debug-*.tar.gz"))
	must.NoError(t, err)
	must.SliceLen(t, 1, archives)

	f, err := os.Open(archives[0])
	must.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	must.NoError(t, err)
	tr := tar.NewReader(zr)
	files := map[string][]byte{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		must.NoError(t, err)
		b, err := io.ReadAll(tr)
		must.NoError(t, err)
		files[hdr.Name] = b
	}
	perServer := map[string]int{}
	for name, b := range files {
		_, rest, _ := strings.Cut(name, "/servers/")
		server, file, ok := strings.Cut(rest, "/")
		if !ok {
			continue
		}
		perServer[server]++
		switch file {
		case "profile.prof", "heap.prof":
			must.True(t, bytes.HasPrefix(b, []byte{0x1f, 0x8b}), must.Sprintf("%s is not in pprof's format", name))
		case "goroutine.txt":
			must.StrContains(t, string(b), "goroutine ")
		case "metrics.json":
			var m map[string]any
			must.NoError(t, json.Unmarshal(b, &m), must.Sprint(name))
		default:
			t.Errorf("unexpected file %s:\n%s", name, b)
		}
	}
	must.MapLen(t, 3, perServer, must.Sprintf("server directories: %v", perServer))
	for _, id := range ids {
		found := false
		for server, n := range perServer {
			if strings.HasSuffix(server, "-"+id[:8]) {
				found = true
				must.Eq(t, 4, n, must.Sprintf("files of server %s", server))
			}
		}
		must.True(t, found, must.Sprintf("no directory for server %s in %v", id, perServer))
	}
}
