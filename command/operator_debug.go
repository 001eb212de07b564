package command

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/roamhq/roam/api"
	"github.com/roamhq/roam/internal/fsutil"
)

func init() {
	register("operator debug", &Command{Synopsis: "Gather profiles and metrics from every server into one archive", Run: runOperatorDebug})
}

const operatorDebugUsage = `Usage: roam operator debug [options]

  Gathers from every server (or those -server-id names) a CPU profile over
  -duration, every goroutine's stack, a heap profile and its metrics, and
  from the cluster its members, Raft configuration and leader, into one
  archive, roam-debug-<time>.tar.gz in -output, for a bug report or go tool
  pprof. The servers' profiles are taken at the same time.

  A server that cannot answer (down, or run without enable_debug while
  ACLs are off) gets an errors.txt in its directory instead; the archive is
  written if any server answered. With ACLs on, the token needs
  agent:write (and operator:read for the Raft configuration).
`

// debugMaxDuration bounds -duration, as the agents bound a CPU profile.
const debugMaxDuration = 300 * time.Second

// debugServer is one server to profile and what came back.
type debugServer struct {
	id, name string
	files    map[string][]byte
	errs     []string
}

func runOperatorDebug(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("operator debug", operatorDebugUsage, errOut)
	duration := fs.Duration("duration", 2*time.Second, "length of each server's CPU profile (1s to 5m)")
	serverIDs := fs.String("server-id", "all", `servers to profile: "all", "leader", or IDs separated by commas`)
	output := fs.String("output", ".", "directory the archive is written to")
	if code, ok := parseNoArgs(fs, args, errOut); !ok {
		return code
	}
	if *duration < time.Second || *duration > debugMaxDuration || *duration%time.Second != 0 {
		fmt.Fprintf(errOut, "Invalid -duration %s: must be whole seconds from 1s to %s\n", *duration, debugMaxDuration)
		return 1
	}
	if st, err := os.Stat(*output); err != nil || !st.IsDir() {
		fmt.Fprintf(errOut, "Invalid -output %q: not a directory\n", *output)
		return 1
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	members, err := c.Agent().Members()
	if err != nil {
		return fail(errOut, "listing the servers", err)
	}
	servers, err := debugTargets(members, *serverIDs)
	if err != nil {
		fmt.Fprintln(errOut, err)
		return 1
	}

	files := map[string][]byte{}
	addJSON := func(name string, v any) {
		buf, err := json.MarshalIndent(v, "", "  ")
		if err == nil {
			files[name] = append(buf, '\n')
		}
	}
	addJSON("cluster/members.json", members)
	var clusterErrs []string
	if cfg, err := c.Operator().RaftGetConfiguration(nil); err != nil {
		clusterErrs = append(clusterErrs, fmt.Sprintf("raft configuration: %v", err))
	} else {
		addJSON("cluster/raft.json", cfg)
	}
	if leader, err := c.Status().Leader(); err != nil {
		clusterErrs = append(clusterErrs, fmt.Sprintf("leader: %v", err))
	} else {
		addJSON("cluster/leader.json", leader)
	}
	if len(clusterErrs) > 0 {
		files["cluster/errors.txt"] = []byte(strings.Join(clusterErrs, "\n") + "\n")
	}

	secs := int(*duration / time.Second)
	fmt.Fprintf(out, "Profiling %d servers for %s\n", len(servers), *duration)
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.collect(c, secs, len(servers))
		}()
	}
	wg.Wait()

	answered := 0
	for _, s := range servers {
		dir := "servers/" + debugDirName(s.name, s.id) + "/"
		for name, b := range s.files {
			files[dir+name] = b
		}
		if len(s.errs) > 0 {
			files[dir+"errors.txt"] = []byte(strings.Join(s.errs, "\n") + "\n")
			fmt.Fprintf(errOut, "Server %s (%s): %s\n", s.name, s.id, strings.Join(s.errs, "; "))
		}
		if len(s.files) > 0 {
			answered++
		}
		fmt.Fprintf(out, "  %s (%s): %d of %d files\n", s.name, s.id, len(s.files), len(s.files)+len(s.errs))
	}
	if answered == 0 {
		fmt.Fprintln(errOut, "Error: no server answered; no archive written")
		return 1
	}
	stamp := time.Now().UTC().Format("20060102T150405Z")
	archive, err := debugArchive("roam-debug-"+stamp, files)
	if err != nil {
		return fail(errOut, "building the archive", err)
	}
	path := filepath.Join(*output, "roam-debug-"+stamp+".tar.gz")
	if err := fsutil.WriteFileAtomic(path, archive, 0o600); err != nil {
		return fail(errOut, "writing the archive", err)
	}
	fmt.Fprintf(out, "Wrote %s (%d servers answered of %d)\n", path, answered, len(servers))
	return 0
}

// debugTargets picks the servers to profile from the members list.
func debugTargets(members *api.ServerMembers, which string) ([]*debugServer, error) {
	byID := map[string]*api.AgentMember{}
	var ids []string
	for _, m := range members.Members {
		if id := m.Tags["id"]; id != "" {
			byID[id] = m
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var want []string
	switch which {
	case "all":
		want = ids
	case "leader":
		for _, id := range ids {
			if byID[id].Tags["leader"] == "true" {
				want = []string{id}
			}
		}
		if want == nil {
			return nil, fmt.Errorf("Invalid -server-id leader: no server leads now")
		}
	default:
		for _, id := range strings.Split(which, ",") {
			id = strings.TrimSpace(id)
			if byID[id] == nil {
				return nil, fmt.Errorf("Invalid -server-id: no server has ID %q (see roam server members)", id)
			}
			if !slices.Contains(want, id) {
				want = append(want, id)
			}
		}
	}
	out := make([]*debugServer, 0, len(want))
	for _, id := range want {
		out = append(out, &debugServer{id: id, name: byID[id].Name, files: map[string][]byte{}})
	}
	return out, nil
}

// collect takes s's profiles one after the other: the CPU profile, while
// the other servers take theirs, then the quick ones. A server already
// taking a CPU profile (another operator's, or several servers in one
// process, as in tests) is asked again once it may be done: for up to
// the length of one profile per server asked, and 10 s.
func (s *debugServer) collect(c *api.Client, secs, servers int) {
	get := func(file, what string, fetch func() ([]byte, error)) {
		b, err := fetch()
		if err != nil {
			s.errs = append(s.errs, fmt.Sprintf("%s: %v", what, err))
			return
		}
		s.files[file] = b
	}
	a := c.Agent()
	busyUntil := time.Now().Add(time.Duration(secs*(servers+1))*time.Second + 10*time.Second)
	get("profile.prof", "cpu profile", func() ([]byte, error) {
		for {
			b, err := a.CPUProfile(api.PprofOptions{ServerID: s.id, Seconds: secs}, nil)
			var re *api.UnexpectedResponseError
			if !errors.As(err, &re) || re.StatusCode() != http.StatusConflict || time.Now().After(busyUntil) {
				return b, err
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	get("goroutine.txt", "goroutines", func() ([]byte, error) {
		return a.Lookup("goroutine", api.PprofOptions{ServerID: s.id, Debug: 2}, nil)
	})
	get("heap.prof", "heap profile", func() ([]byte, error) {
		return a.Lookup("heap", api.PprofOptions{ServerID: s.id}, nil)
	})
	get("metrics.json", "metrics", func() ([]byte, error) { return a.ServerMetrics(s.id, nil) })
}

// debugDirName is a server's directory in the archive: its name and the
// start of its ID, kept to characters safe in any file system.
func debugDirName(name, id string) string {
	clean := func(s string) string {
		return strings.Map(func(r rune) rune {
			switch {
			case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
				return r
			}
			return '_'
		}, s)
	}
	short := id
	if len(short) > 8 {
		short = short[:8]
	}
	n := strings.Trim(clean(name), ".")
	if n == "" {
		n = "server"
	}
	if len(n) > 64 {
		n = n[:64]
	}
	return n + "-" + clean(short)
}

// debugArchive packs files under root into a gzipped tar, in name order.
func debugArchive(root string, files map[string][]byte) ([]byte, error) {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	now := time.Now()
	for _, n := range names {
		b := files[n]
		hdr := &tar.Header{Name: root + "/" + n, Mode: 0o600, Size: int64(len(b)), ModTime: now, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
