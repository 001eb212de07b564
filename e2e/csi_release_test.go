//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// The claim of a stopping allocation is the volume's until the client says
// its tasks are gone (DESIGN.md, "A claim released as soon as the servers
// ask the allocation to stop"). These tests stop a writer that takes 4 s to
// finish after SIGTERM, by `roam job stop` and by a node drain, and check,
// on real processes and the plugin's own call record, that nothing
// unpublishes the volume, and nothing else publishes it, before the
// writer's last write.

const (
	// releaseKillTimeout is the writer's kill_timeout: far longer than its
	// 4 s of writes after SIGTERM, so that it always exits on its own and
	// the test never races a SIGKILL.
	releaseKillTimeout = 20 * time.Second
	// releaseLines is how many numbered lines the writer appends after
	// SIGTERM, 100 ms apart.
	releaseLines = 40
	// releaseMinPolls is the fewest claim checks the test accepts during
	// the writer's 4 s of dying: fewer means the test did not watch the
	// window it is about.
	releaseMinPolls = 10
)

// releaseWriterScript appends "tick N" to data/log every 100 ms. On
// SIGTERM it appends "after-sigterm 1" .. "after-sigterm 40" 100 ms apart,
// then "DONE", then writes its exit time (date +%s%N) to the volume and to
// stdout, and exits 0. At start it prints its pid and the volume's log as
// it finds it (a replacement shows what its predecessor left). It uses no
// ${...}: HCL would take that for a template.
const releaseWriterScript = `v="$ROAM_TASK_DIR/data"
echo "start pid=$$ at=$(date +%s%N)"
echo "==== volume log at start"
cat "$v/log" 2>/dev/null
echo "==== end of volume log"
finish() {
  echo "sigterm at=$(date +%s%N)"
  i=1
  while [ "$i" -le 40 ]; do
    echo "after-sigterm $i" >> "$v/log"
    sleep 0.1
    i=$((i + 1))
  done
  echo DONE >> "$v/log"
  t=$(date +%s%N)
  echo "$t" > "$v/exit-$ROAM_ALLOC_ID"
  echo "exit at=$t"
  exit 0
}
trap finish TERM
n=0
while :; do
  n=$((n + 1))
  echo "tick $n" >> "$v/log"
  sleep 0.1
done
`

// releaseWriterJob is the service job "writer": one releaseWriterScript
// task on volume vol1, stopped with SIGTERM and releaseKillTimeout.
func releaseWriterJob() string {
	return csiJobTask("writer", "service", 1, "vol1", false, "",
		fmt.Sprintf("      kill_signal  = \"SIGTERM\"\n      kill_timeout = %q\n", releaseKillTimeout.String()),
		releaseWriterScript)
}

// releaseWriter is a running allocation of releaseWriterScript.
type releaseWriter struct {
	Alloc *Alloc
	// PID is the task's shell.
	PID int
	// Client is the client it runs on, which is also the hostpath node ID.
	Client string
}

// startReleaseWriter runs the writer job and waits until its allocation
// runs, holds a taken claim on vol1, and has written to the volume.
func (cc *csiCluster) startReleaseWriter(t *testing.T, ext string) *releaseWriter {
	t.Helper()
	cc.RunJob(releaseWriterJob())
	a := cc.waitCSIAllocs(t, "writer", csiSettle, oneAlloc("running"))[0]
	w := &releaseWriter{Alloc: a, Client: a.NodeName}
	WaitFor(t, csiSettle, func() error {
		v, err := cc.volume("vol1")
		if err != nil {
			return err
		}
		if len(v.Claims) != 1 || v.Claims[0].AllocationID != a.ID || v.Claims[0].State != "taken" {
			return fmt.Errorf("want one taken claim by %s: %s", a, claimsString(v))
		}
		out := cc.taskOutput(a, "stdout")
		if w.PID = stamp(out, "start pid="); w.PID == 0 {
			return fmt.Errorf("writer %s has not printed its pid; stdout:\n%s", a, out)
		}
		// A few ticks on the volume: the mount works and the trap is set.
		data, err := os.ReadFile(cc.volumeFile(ext, "log"))
		if err != nil || !bytes.Contains(data, []byte("tick 3\n")) {
			return fmt.Errorf("writer %s has not written 3 ticks to the volume (%v); stderr:\n%s", a, err, cc.taskOutput(a, "stderr"))
		}
		return nil
	})
	t.Logf("writer %s running on %s as pid %d", a, w.Client, w.PID)
	return w
}

// claimWindow is what watchClaim saw while the writer was dying.
type claimWindow struct {
	// Polls counts the claim checks made while the writer was alive.
	Polls int
	// Bad lists every check that found the claim not held: its time since
	// the trigger and the claims it saw.
	Bad []badCheck
	// FirstBad is when the first bad check was made, since the trigger.
	FirstBad time.Duration
	// Gone is when the writer was first seen gone, since the trigger.
	Gone time.Duration
}

// badCheck is a claim check that found the claim not held.
type badCheck struct {
	At     time.Duration
	Claims string
}

// renderChecks lists the checks, one line per run of checks that saw the same
// claims.
func renderChecks(checks []badCheck) string {
	var lines []string
	for i := 0; i < len(checks); {
		j := i
		for j+1 < len(checks) && checks[j+1].Claims == checks[i].Claims {
			j++
		}
		at := "+" + checks[i].At.Round(time.Millisecond).String()
		if j > i {
			at += fmt.Sprintf(" .. +%s (%d checks)", checks[j].At.Round(time.Millisecond), j-i+1)
		}
		lines = append(lines, at+": "+checks[i].Claims)
		i = j + 1
	}
	return strings.Join(lines, "\n  ")
}

// watchClaim polls vol1 from the trigger (a stop or a drain, at since)
// until the writer's process is gone. Each check reads the volume first,
// then looks at the process: if the process is still alive after the read,
// it was alive during it, so the volume must show exactly one claim, the
// writer's, taken. A check whose process is gone ends the watch.
func (cc *csiCluster) watchClaim(t *testing.T, w *releaseWriter, since time.Time) claimWindow {
	t.Helper()
	var win claimWindow
	err := poll(releaseKillTimeout+csiSettle, func() error {
		v, err := cc.volume("vol1")
		if err != nil {
			return err
		}
		at := time.Since(since)
		if !pidAlive(w.PID) {
			win.Gone = at
			return nil
		}
		win.Polls++
		held := len(v.Claims) == 1 && v.Claims[0].AllocationID == w.Alloc.ID && v.Claims[0].State == "taken"
		if !held {
			if len(win.Bad) == 0 {
				win.FirstBad = at
			}
			win.Bad = append(win.Bad, badCheck{at, claimsString(v)})
		}
		return fmt.Errorf("writer %s (pid %d) still running", w.Alloc, w.PID)
	})
	if err != nil {
		t.Fatalf("e2e: writer never exited: %v", err)
	}
	return win
}

// check reports what the watch found: the writer must have been watched
// through its dying (else the test is broken), and every check must have
// found the claim held.
func (win claimWindow) check(t *testing.T, w *releaseWriter, trigger string) {
	t.Helper()
	t.Logf("claim checks while the writer ran after the %s: %d, %d found it not held; writer gone at +%s",
		trigger, win.Polls, len(win.Bad), win.Gone.Round(time.Millisecond))
	must.GreaterEq(t, releaseMinPolls, win.Polls, must.Sprintf(
		"only %d claim checks while the writer was dying: the test did not watch the window", win.Polls))
	if len(win.Bad) > 0 {
		t.Errorf("claim of %s not held while its task was still running after the %s, first at +%s (%d of %d checks):\n  %s",
			shortAlloc(w.Alloc.ID), trigger, win.FirstBad.Round(time.Millisecond), len(win.Bad), win.Polls,
			renderChecks(win.Bad))
	}
}

// exitTimes reads when the writer got SIGTERM and when it exited, from its
// stdout. Both are there unless the task was killed or never trapped.
func (cc *csiCluster) exitTimes(t *testing.T, w *releaseWriter) (sigterm, exit time.Time) {
	t.Helper()
	out := cc.taskOutput(w.Alloc, "stdout")
	s, e := stamp(out, "sigterm at="), stamp(out, "exit at=")
	if s == 0 || e == 0 {
		t.Fatalf("e2e: writer %s did not finish its script (SIGKILLed or no trap?); stdout:\n%s\nstderr:\n%s",
			w.Alloc, out, cc.taskOutput(w.Alloc, "stderr"))
	}
	return time.Unix(0, int64(s)), time.Unix(0, int64(e))
}

// csiCall is one line of a hostpath plugin's call log
// (calllog-<node-id>.jsonl in the state dir; see plugins/csi/hostpath).
type csiCall struct {
	Method    string `json:"method"`
	VolumeID  string `json:"volume_id"`
	NodeID    string `json:"node_id"`
	Start     int64  `json:"start_unix_nano"`
	End       int64  `json:"end_unix_nano"`
	Error     string `json:"error"`
	Truncated bool   `json:"truncated"`
	// Plugin is the node ID of the plugin process that served the call.
	Plugin string `json:"-"`
}

// volumeCalls reads every plugin instance's call log and returns the calls
// that name volume ext, by start time. A line still being written (no
// newline yet) is left out.
func (cc *csiCluster) volumeCalls(ext string) ([]csiCall, error) {
	var out []csiCall
	for _, name := range sortedKeys(cc.Plugins) {
		data, err := os.ReadFile(filepath.Join(cc.StateDir, "calllog-"+name+".jsonl"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if i := bytes.LastIndexByte(data, '\n'); i < len(data)-1 {
			data = data[:i+1]
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			var c csiCall
			if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
				return nil, fmt.Errorf("calllog-%s.jsonl: %w", name, err)
			}
			if c.Truncated {
				return nil, fmt.Errorf("calllog-%s.jsonl is truncated", name)
			}
			c.Plugin = name
			if c.VolumeID == ext {
				out = append(out, c)
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out, nil
}

// waitCall waits until a successful call of method for ext on node is in
// the call logs, and returns every call for ext.
func (cc *csiCluster) waitCall(t *testing.T, ext, method, node string) []csiCall {
	t.Helper()
	var calls []csiCall
	WaitFor(t, csiSettle, func() error {
		var err error
		if calls, err = cc.volumeCalls(ext); err != nil {
			return err
		}
		for _, c := range calls {
			if c.Method == method && c.NodeID == node && c.Error == "" {
				return nil
			}
		}
		return fmt.Errorf("no successful %s of %s for node %s yet", method, ext, node)
	})
	return calls
}

// callsBefore returns the calls among calls of one of methods for node
// that started before at, rendered for a failure message.
func callsBefore(calls []csiCall, at time.Time, node string, methods ...string) []string {
	var bad []string
	for _, c := range calls {
		if c.NodeID == node && slices.Contains(methods, c.Method) && c.Start < at.UnixNano() {
			bad = append(bad, fmt.Sprintf("%s node=%s (served by %s) started %s before the writer's exit",
				c.Method, c.NodeID, c.Plugin, at.Sub(time.Unix(0, c.Start)).Round(time.Millisecond)))
		}
	}
	return bad
}

// logTimeline logs the volume's calls and the writer's times relative to
// the trigger, the evidence for (or against) the ordering.
func logTimeline(t *testing.T, trigger time.Time, sigterm, exit time.Time, calls []csiCall) {
	t.Helper()
	rel := func(ns int64) string {
		return fmt.Sprintf("%+8dms", time.Unix(0, ns).Sub(trigger).Milliseconds())
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s  writer got SIGTERM\n", rel(sigterm.UnixNano()))
	fmt.Fprintf(&b, "%s  writer exited\n", rel(exit.UnixNano()))
	for _, c := range calls {
		if c.End < trigger.UnixNano() {
			continue
		}
		e := ""
		if c.Error != "" {
			e = " error=" + c.Error
		}
		fmt.Fprintf(&b, "%s  %s node=%s (plugin %s) took %dms%s\n", rel(c.Start), c.Method, c.NodeID, c.Plugin,
			time.Duration(c.End-c.Start).Milliseconds(), e)
	}
	t.Logf("timeline since the trigger (0 ms), sorted by start for calls:\n%s", b.String())
}

// detachMethods release a volume from a node; publishMethods give it to one.
var (
	detachMethods  = []string{"NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume"}
	publishMethods = []string{"ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume"}
)

// afterSigtermLine matches one of the writer's numbered lines.
var afterSigtermLine = regexp.MustCompile(`^after-sigterm (\d+)$`)

// checkVolumeLog checks a copy of the volume's log: every one of the
// writer's numbered lines, once and in order, then DONE as the last line.
func checkVolumeLog(log string) error {
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	next := 1
	for _, l := range lines {
		if m := afterSigtermLine.FindStringSubmatch(l); m != nil {
			if m[1] != strconv.Itoa(next) {
				return fmt.Errorf("after-sigterm %s where %d was due", m[1], next)
			}
			next++
		}
	}
	if next != releaseLines+1 {
		return fmt.Errorf("%d of %d after-sigterm lines", next-1, releaseLines)
	}
	if last := lines[len(lines)-1]; last != "DONE" {
		return fmt.Errorf("last line %q, want DONE", last)
	}
	return nil
}

// taskOutput reads task "t"'s stdout or stderr of a from its client's data
// dir, which keeps it after the task (or the client) is gone.
func (cc *csiCluster) taskOutput(a *Alloc, stream string) string {
	i := cc.clientIndex(a.NodeName)
	if i < 0 {
		return fmt.Sprintf("(no client named %q)", a.NodeName)
	}
	data, err := os.ReadFile(filepath.Join(cc.Clients[i].DataDir, "alloc", a.ID, "alloc", "logs", "t."+stream+".0"))
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	return string(data)
}

// firstLines returns the first n lines of s and how many more there are.
func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) <= n {
		return strings.Join(lines, "\n")
	}
	return fmt.Sprintf("%s\n(%d more lines)", strings.Join(lines[:n], "\n"), len(lines)-n)
}

// stamp returns the number after the last occurrence of prefix in out, 0
// if there is none.
func stamp(out, prefix string) int {
	i := strings.LastIndex(out, prefix)
	if i < 0 {
		return 0
	}
	rest := out[i+len(prefix):]
	if j := strings.IndexAny(rest, " \n"); j >= 0 {
		rest = rest[:j]
	}
	n, _ := strconv.Atoi(rest)
	return n
}

// TestCSI_StopKeepsClaimUntilTaskExits stops a job whose task writes to a
// single-node-writer volume and takes 4 s to finish after SIGTERM. While
// the task runs, the volume stays claimed by it; the node and controller
// unpublish start only after its exit; and a reader on another node finds
// every line the task wrote after SIGTERM.
func TestCSI_StopKeepsClaimUntilTaskExits(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 1, Clients: 2, PublishLatency: 100 * time.Millisecond})
	ext := cc.createVolumes(t, "client-0", "vol1")[0]
	cc.registerVolumeHTTP(t, "vol1", ext)
	w := cc.startReleaseWriter(t, ext)

	stopped := time.Now()
	cc.MustCLI("job", "stop", "-detach", "writer")
	win := cc.watchClaim(t, w, stopped)
	sigterm, exit := cc.exitTimes(t, w)

	// The client's exit report frees the claim.
	WaitFor(t, csiSettle, func() error {
		v, err := cc.volume("vol1")
		if err != nil {
			return err
		}
		if len(v.Claims) != 0 {
			return fmt.Errorf("volume vol1 still claimed: %s", claimsString(v))
		}
		return nil
	})
	cc.waitCall(t, ext, "NodeUnpublishVolume", w.Client)
	calls := cc.waitCall(t, ext, "ControllerUnpublishVolume", w.Client)
	logTimeline(t, stopped, sigterm, exit, calls)

	win.check(t, w, "job stop")
	if bad := callsBefore(calls, exit, w.Client, detachMethods...); len(bad) > 0 {
		t.Errorf("volume detached from %s while its writer was running:\n  %s", w.Client, strings.Join(bad, "\n  "))
	}

	// Read it back from the other node.
	cc.SetEligible(w.Alloc.NodeID, false)
	cc.RunJob(csiJob("reader", "batch", 1, "vol1", false, "", `cat "$ROAM_TASK_DIR/data/log"`))
	reader := cc.waitCSIAllocs(t, "reader", csiSettle, oneAlloc("complete"))[0]
	must.NotEq(t, w.Alloc.NodeID, reader.NodeID, must.Sprint("reader ran on the writer's node"))
	out := cc.MustCLI("alloc", "logs", reader.ID, "t")
	must.NoError(t, checkVolumeLog(out), must.Sprintf("volume log as the reader saw it:\n%s\nwriter's stderr:\n%s",
		out, firstLines(cc.taskOutput(w.Alloc, "stderr"), 5)))
	cc.mustNoOverlaps(t)
}

// TestCSI_DrainKeepsClaimUntilTaskExits drains the node of the same
// writer. While the task runs, the volume stays claimed by it alone; its
// node and controller unpublish, and the replacement's publish on the
// other node, start only after its exit; and the replacement finds every
// line the old task wrote after SIGTERM.
func TestCSI_DrainKeepsClaimUntilTaskExits(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 1, Clients: 2, PublishLatency: 100 * time.Millisecond})
	ext := cc.createVolumes(t, "client-0", "vol1")[0]
	cc.registerVolumeHTTP(t, "vol1", ext)
	w := cc.startReleaseWriter(t, ext)

	// A deadline far past the writer's 4 s: the migration, not the
	// deadline, stops it. -ignore-system keeps the drained node's plugin,
	// which the old claim's node unpublish needs, out of the picture.
	drained := time.Now()
	drain(cc.Cluster, w.Alloc.NodeID, "-deadline", "60s", "-ignore-system")
	win := cc.watchClaim(t, w, drained)
	sigterm, exit := cc.exitTimes(t, w)

	var repl *Alloc
	WaitFor(t, 2*csiSettle, func() error {
		list, err := JobAllocs(cc.API(), "writer")
		if err != nil {
			return err
		}
		// The replacement waits for the claim; it must not be placed,
		// fail to get the volume, and be replaced in turn (Nomad #8609).
		for _, a := range list {
			if a.ID != w.Alloc.ID && a.ClientStatus == "failed" {
				t.Fatalf("replacement %s failed: %s\nallocations:\n%s", a, taskEvents(a), allocTable(list))
			}
		}
		r := running(list)
		if len(r) != 1 || r[0].ID == w.Alloc.ID {
			return fmt.Errorf("want one running replacement of %s:\n%s", shortAlloc(w.Alloc.ID), allocTable(list))
		}
		repl = r[0]
		v, err := cc.volume("vol1")
		if err != nil {
			return err
		}
		if len(v.Claims) != 1 || v.Claims[0].AllocationID != repl.ID || v.Claims[0].State != "taken" {
			return fmt.Errorf("want one taken claim by %s: %s", repl, claimsString(v))
		}
		return nil
	})
	must.NotEq(t, w.Alloc.NodeID, repl.NodeID, must.Sprint("replacement on the drained node"))
	must.Eq(t, w.Alloc.ID, repl.PreviousAllocation, must.Sprintf("replacement %s does not replace %s directly", repl, shortAlloc(w.Alloc.ID)))
	t.Logf("replacement %s running on %s", repl, repl.NodeName)
	cc.waitCall(t, ext, "ControllerUnpublishVolume", w.Client)
	calls := cc.waitCall(t, ext, "NodePublishVolume", repl.NodeName)
	logTimeline(t, drained, sigterm, exit, calls)

	win.check(t, w, "drain")
	if bad := callsBefore(calls, exit, w.Client, detachMethods...); len(bad) > 0 {
		t.Errorf("volume detached from the drained %s while its writer was running:\n  %s", w.Client, strings.Join(bad, "\n  "))
	}
	if bad := callsBefore(calls, exit, repl.NodeName, publishMethods...); len(bad) > 0 {
		t.Errorf("volume given to the replacement's %s while the old writer was running:\n  %s", repl.NodeName, strings.Join(bad, "\n  "))
	}
	if ts := repl.TaskStates["t"]; ts != nil && ts.StartedAt.Before(exit) {
		t.Errorf("replacement %s started at %s, %s before the old writer exited",
			repl, ts.StartedAt.Format(time.RFC3339Nano), exit.Sub(ts.StartedAt).Round(time.Millisecond))
	}

	// The replacement printed the volume's log as it found it at start.
	var seen string
	WaitFor(t, csiSettle, func() error {
		out := cc.taskOutput(repl, "stdout")
		_, rest, ok := strings.Cut(out, "==== volume log at start\n")
		if !ok {
			return fmt.Errorf("replacement %s has not printed the volume log yet:\n%s", repl, out)
		}
		seen, _, ok = strings.Cut(rest, "==== end of volume log\n")
		if !ok {
			return fmt.Errorf("replacement %s is printing the volume log", repl)
		}
		return nil
	})
	must.NoError(t, checkVolumeLog(seen), must.Sprintf("volume log as the replacement found it:\n%s\nold writer's stderr:\n%s",
		seen, firstLines(cc.taskOutput(w.Alloc, "stderr"), 5)))
	cc.mustNoOverlaps(t)
}
