//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
)

// What the rows of TestBadInput send and watch: blocking queries that
// hang up, held connections, small jobs, and a sentinel outside the data
// dirs.

// hangUpBlockingQueries sends n blocking queries for /v1/jobs to the HTTP
// API of target, from 50 attacker addresses starting at firstSrc (80 each
// for 4,000: under the per-address cap). Once all are waiting (target has
// a goroutine more for each) and 2 s have passed, their callers hang up;
// then every agent in watch must be back to its goroutine count from
// before within releaseBy.
func hangUpBlockingQueries(t *testing.T, target *Agent, watch []*Agent, n, firstSrc int) {
	t.Helper()
	const (
		sources   = 50
		hangUpAt  = 2 * time.Second
		arriveBy  = 30 * time.Second
		releaseBy = 10 * time.Second // the unfixed agent held them up to 10 minutes
		// goroutineSlack is what may remain above the baseline once the
		// callers are gone: timers, a GC worker, a log flush.
		goroutineSlack = 50
	)
	base := target.HTTPAddr()
	before := make([]int, len(watch))
	peak := make([]int, len(watch))
	for i, a := range watch {
		rt, err := ReadRuntime(a.HTTPAddr())
		must.NoError(t, err)
		before[i] = rt.Goroutines
	}
	targetBefore, err := ReadRuntime(base)
	must.NoError(t, err)
	var jobs []json.RawMessage
	m, err := GetJSONMeta(base, "/v1/jobs", &jobs)
	must.NoError(t, err)

	ctx, hangUp := context.WithCancel(context.Background())
	defer hangUp()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := blockingQueryUntil(ctx, attackerAddr(firstSrc+i%sources), base, m.Index); err != nil {
				errs <- err
			}
		}()
	}
	// Hang up once every query is waiting in the target (at least one
	// goroutine each) and 2 s have passed.
	err = poll(arriveBy, func() error {
		var targetNow int
		for i, a := range watch {
			rt, err := ReadRuntime(a.HTTPAddr())
			if err != nil {
				return err
			}
			peak[i] = max(peak[i], rt.Goroutines)
		}
		rt, err := ReadRuntime(base)
		if err != nil {
			return err
		}
		targetNow = rt.Goroutines
		if targetNow < targetBefore.Goroutines+n {
			return fmt.Errorf("%d goroutines in %s, want at least %d + %d waiting queries", targetNow, target.Name, targetBefore.Goroutines, n)
		}
		if time.Since(start) < hangUpAt {
			return errors.New("not 2 s yet")
		}
		return nil
	})
	hungUp := time.Now()
	hangUp()
	wg.Wait()
	close(errs)
	var failed []error
	for err := range errs {
		failed = append(failed, err)
	}
	t.Logf("%d blocking queries to %s from %d addresses; callers hung up after %s", n, target.Name, sources, hungUp.Sub(start).Round(time.Millisecond))
	if err != nil {
		t.Errorf("the queries did not all arrive within %s: %v", arriveBy, err)
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d queries failed before their caller hung up; first: %v", len(failed), n, failed[0])
	}
	after := make([]int, len(watch))
	err = poll(releaseBy, func() error {
		var errs []error
		for i, a := range watch {
			rt, err := ReadRuntime(a.HTTPAddr())
			if err != nil {
				return err
			}
			after[i] = rt.Goroutines
			if after[i] > before[i]+goroutineSlack {
				errs = append(errs, fmt.Errorf("%s: %d goroutines %s after the callers hung up (%d before)",
					a.Name, after[i], time.Since(hungUp).Round(time.Millisecond), before[i]))
			}
		}
		return errors.Join(errs...)
	})
	for i, a := range watch {
		t.Logf("%s goroutines: %d before, peak %d, %d %s after the callers hung up", a.Name, before[i], peak[i], after[i], time.Since(hungUp).Round(time.Millisecond))
	}
	if err != nil {
		t.Errorf("blocking queries outlive their callers: %v", err)
	}
}

// heldResult is how long each held connection stayed open, by kind.
type heldResult struct {
	mu    sync.Mutex
	took  map[string][]time.Duration
	fails map[string][]error
	notes map[string][]string
}

func newHeldResult() *heldResult {
	return &heldResult{took: map[string][]time.Duration{}, fails: map[string][]error{}, notes: map[string][]string{}}
}

func (r *heldResult) add(kind string, d time.Duration, note string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.fails[kind] = append(r.fails[kind], err)
		return
	}
	r.took[kind] = append(r.took[kind], d)
	if note != "" {
		r.notes[kind] = append(r.notes[kind], note)
	}
}

// summary describes the kind's durations: count, median, max.
func (r *heldResult) summary(kind string) string {
	ds := slices.Clone(r.took[kind])
	slices.Sort(ds)
	if len(ds) == 0 {
		return fmt.Sprintf("%s: none closed, %d failed", kind, len(r.fails[kind]))
	}
	return fmt.Sprintf("%s: %d closed (median %s, max %s), %d still open or failed",
		kind, len(ds), ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), len(r.fails[kind]))
}

// jobOpts shapes the one-group, one-task raw_exec jobs the rows submit.
type jobOpts struct {
	ID, Type string
	Count    uint64
	// Command is the task's command; with OmitCommand the config has none.
	Command     string
	OmitCommand bool
	Args        []string
	// VolumeSource, if set, is a CSI volume the group requests as "data"
	// and the task mounts at MountDest.
	VolumeSource, MountDest string
}

// jobJSON is a register body for o in the JSON shape of Nomad's API.
func jobJSON(o jobOpts) []byte {
	config := map[string]any{}
	if !o.OmitCommand {
		config["command"] = o.Command
	}
	if len(o.Args) > 0 {
		config["args"] = o.Args
	}
	task := map[string]any{"Name": "t", "Driver": "raw_exec", "Config": config,
		"Resources": map[string]any{"CPU": 20, "MemoryMB": 16}}
	group := map[string]any{"Name": "g", "Count": o.Count, "Tasks": []any{task}}
	if o.VolumeSource != "" {
		group["Volumes"] = map[string]any{"data": map[string]any{
			"Name": "data", "Type": "csi", "Source": o.VolumeSource,
			"AccessMode": api.CSIAccessModeSingleNodeWriter, "AttachmentMode": api.CSIAttachmentModeFilesystem,
		}}
		task["VolumeMounts"] = []any{map[string]any{"Volume": "data", "Destination": o.MountDest}}
	}
	b, _ := json.Marshal(map[string]any{"Job": map[string]any{
		"ID": o.ID, "Name": o.ID, "Type": o.Type, "Datacenters": []string{"dc1"}, "TaskGroups": []any{group},
	}})
	return b
}

// jobHCL is o as a job file.
func jobHCL(o jobOpts) string {
	var config strings.Builder
	if !o.OmitCommand {
		fmt.Fprintf(&config, "        command = %q\n", o.Command)
	}
	if len(o.Args) > 0 {
		fmt.Fprintf(&config, "        args    = %s\n", hclList(o.Args))
	}
	var volume, mount string
	if o.VolumeSource != "" {
		volume = fmt.Sprintf(`    volume "data" {
      type            = "csi"
      source          = %q
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }
`, o.VolumeSource)
		mount = fmt.Sprintf(`      volume_mount {
        volume      = "data"
        destination = %q
      }
`, o.MountDest)
	}
	return fmt.Sprintf(`job %q {
  type        = %q
  datacenters = ["dc1"]
  group "g" {
    count = %d
%s    task "t" {
      driver = "raw_exec"
      config {
%s      }
%s      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
`, o.ID, o.Type, o.Count, volume, config.String(), mount)
}

// parseBody is a /v1/jobs/parse body for an HCL job file.
func parseBody(hcl string) []byte {
	b, _ := json.Marshal(map[string]any{"JobHCL": hcl, "Canonicalize": true})
	return b
}

// sentinel is a directory outside every data dir, where a ../ volume ID
// would land, with a file in it; and the other places such an ID could
// land, which must stay empty.
type sentinel struct {
	// name is the last segment of an escaping volume ID that lands on the
	// sentinel directory; fresh that of one that lands where nothing is.
	name, fresh string
	// dir is the sentinel directory, marker the file in it.
	dir, marker string
	content     []byte
	// elsewhere are the other landing places, none of which may appear.
	elsewhere []string
	// watch sees a landing place appear and go again between two checks,
	// and any change inside the sentinel directory.
	watch *fsWatch
}

// plantSentinel picks two names, and for every ancestor of every base dir
// (where `../` segments climbing out of that base stop) a landing place
// for each: the highest writable landing of the first gets the sentinel
// directory, and none of the others may ever appear. With more ../
// segments than a path is deep the landing is the root, so that is where
// the sentinel goes when it can.
func plantSentinel(t *testing.T, bases ...string) *sentinel {
	t.Helper()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	s := &sentinel{
		name:  "roam-e2e-sentinel-" + hex.EncodeToString(rnd[:]),
		fresh: "roam-e2e-absent-" + hex.EncodeToString(rnd[:]),
	}
	seen := map[string]bool{}
	var landings []string
	for _, b := range bases {
		abs, err := filepath.Abs(b)
		must.NoError(t, err)
		for dir := abs; ; dir = filepath.Dir(dir) {
			if !seen[dir] {
				seen[dir] = true
				landings = append(landings, filepath.Join(dir, s.name))
				s.elsewhere = append(s.elsewhere, filepath.Join(dir, s.fresh))
			}
			if dir == filepath.Dir(dir) {
				break
			}
		}
	}
	// Shallowest first: the root, then /tmp, ...
	sort.SliceStable(landings, func(i, j int) bool {
		return strings.Count(landings[i], string(filepath.Separator)) < strings.Count(landings[j], string(filepath.Separator))
	})
	for i, l := range landings {
		if s.dir == "" && os.Mkdir(l, 0o755) == nil {
			s.dir = l
			s.elsewhere = append(s.elsewhere, landings[:i]...)
			s.elsewhere = append(s.elsewhere, landings[i+1:]...)
			break
		}
	}
	must.NotEq(t, "", s.dir, must.Sprintf("no writable place for the sentinel among %v", landings))
	t.Cleanup(func() { os.RemoveAll(s.dir) })
	s.marker = filepath.Join(s.dir, "keep")
	s.content = []byte("planted by " + t.Name() + "\n")
	must.NoError(t, os.WriteFile(s.marker, s.content, 0o644))
	var parents []string
	for _, l := range append([]string{s.dir}, s.elsewhere...) {
		if p := filepath.Dir(l); !slices.Contains(parents, p) {
			parents = append(parents, p)
		}
	}
	w, err := watchFS(parents, []string{s.name, s.fresh}, []string{s.dir})
	if err != nil {
		t.Logf("sentinel: no watch (%v); checked only after the fact", err)
	} else {
		s.watch = w
		t.Cleanup(w.close)
	}
	t.Logf("sentinel %s; %d other landing places must stay absent", s.dir, len(s.elsewhere))
	return s
}

// check reports anything a ../ volume ID changed: the sentinel directory
// gone, replaced by a link, or its contents changed; any other landing
// place created; or any of that seen happening since the sentinel was
// planted, even if undone since.
func (s *sentinel) check() error {
	var errs []error
	st, err := os.Lstat(s.dir)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("sentinel directory %s: %w", s.dir, err))
	case !st.IsDir():
		errs = append(errs, fmt.Errorf("sentinel %s is no longer a directory (%s)", s.dir, st.Mode()))
	default:
		entries, err := os.ReadDir(s.dir)
		if err != nil {
			errs = append(errs, err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, []string{"keep"}) {
			errs = append(errs, fmt.Errorf("sentinel %s now holds %v", s.dir, names))
		}
		if b, err := os.ReadFile(s.marker); err != nil || string(b) != string(s.content) {
			errs = append(errs, fmt.Errorf("sentinel file %s changed: %q, %v", s.marker, b, err))
		}
	}
	for _, l := range s.elsewhere {
		if st, err := os.Lstat(l); err == nil {
			errs = append(errs, fmt.Errorf("%s appeared (%s)", l, st.Mode()))
		}
	}
	if s.watch != nil {
		for _, ev := range s.watch.events() {
			errs = append(errs, fmt.Errorf("seen: %s", ev))
		}
	}
	return errors.Join(errs...)
}
