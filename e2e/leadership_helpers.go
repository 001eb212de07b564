//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
)

// Leadership helpers: leader changes as the servers' logs and APIs show
// them, and a check that claims, allocations and the plugins' attachments
// agree once the cluster has settled.

// Metrics a server publishes about changes of leader (nomad/leader_metrics.go),
// as their Prometheus names.
const (
	// metricDutiesStarted counts the times the server's current process
	// opened its leader duties (lanes, claims, heartbeats, watcher).
	metricDutiesStarted = "roam_leader_duties_started"
	// metricGapMS is the leaderless gap the latest new leader measured:
	// from the last contact with the old leader to its duties open.
	metricGapMS = "roam_leader_takeover_leaderless_gap_ms"
	// metricTakeoverDone counts the times the server finished the work a
	// new leader does once its duties are open.
	metricTakeoverDone = "roam_leader_takeover_completed"
	// metricCatchUpWaited counts the takeovers whose FSM had not yet
	// applied the previous terms' last command when the server won, so
	// that it waited for its first commit (or a barrier).
	metricCatchUpWaited = "roam_leader_takeover_catch_up_waited"
	// metricHandoffDone counts the handoffs the server completed; the
	// roam_leader_handoff_* gauges describe the latest.
	metricHandoffDone = "roam_leader_handoff_completed"
	// metricDrainedCalls is how many controller calls the latest handoff
	// waited for.
	metricDrainedCalls = "roam_leader_handoff_drained_calls"
)

// survivorMetrics reads every server's metrics but old's, before old is
// stopped, so that only a takeover after that counts (awaitTakeover).
func survivorMetrics(tb testing.TB, c *Cluster, old int) map[int]map[string]float64 {
	tb.Helper()
	before := make(map[int]map[string]float64)
	for i, a := range c.Servers {
		if i != old {
			m, err := promMetrics(a.HTTPAddr())
			if err != nil {
				tb.Fatalf("metrics of %s: %v", a.Name, err)
			}
			before[i] = m
		}
	}
	return before
}

// awaitTakeover waits until the survivors agree on a new leader other than
// old and it has opened its duties and finished its takeover since before
// (survivorMetrics), and returns it with its metrics then.
func awaitTakeover(tb testing.TB, c *Cluster, old int, before map[int]map[string]float64, timeout time.Duration) (int, map[string]float64) {
	tb.Helper()
	var idx int
	var now map[string]float64
	WaitFor(tb, timeout, func() error {
		i, err := c.LeaderNow()
		if err != nil {
			return err
		}
		if i == old {
			return fmt.Errorf("%s still named leader", c.Servers[old].Name)
		}
		m, err := promMetrics(c.Servers[i].HTTPAddr())
		if err != nil {
			return err
		}
		if m[metricDutiesStarted] <= before[i][metricDutiesStarted] {
			return fmt.Errorf("new leader %s has not opened its duties yet", c.Servers[i].Name)
		}
		if m[metricTakeoverDone] <= before[i][metricTakeoverDone] {
			return fmt.Errorf("new leader %s has not finished its takeover yet", c.Servers[i].Name)
		}
		idx, now = i, m
		return nil
	})
	return idx, now
}

// promMetrics reads an agent's /v1/metrics?format=prometheus as a map from
// series (name, with its labels if any) to value.
func promMetrics(base string) (map[string]float64, error) {
	resp, err := httpClient.Get(base + "/v1/metrics?format=prometheus")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET %s/v1/metrics?format=prometheus: %s", base, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read %s/v1/metrics: %w", base, err)
	}
	return parseProm(string(b)), nil
}

// exitMetrics reads the metrics an agent left in its data dir as it last
// stopped (command/agent.ExitMetricsFile).
func exitMetrics(a *Agent) (map[string]float64, error) {
	b, err := os.ReadFile(filepath.Join(a.DataDir, exitMetricsFile))
	if err != nil {
		return nil, fmt.Errorf("%s left no metrics at exit: %w", a.Name, err)
	}
	return parseProm(string(b)), nil
}

// parseProm reads the Prometheus text format: comments skipped, one
// "series value" per line.
func parseProm(text string) map[string]float64 {
	out := make(map[string]float64)
	for _, l := range strings.Split(text, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			continue
		}
		out[l[:i]] = v
	}
	return out
}

// dutyCounts returns, per server, how often its current process has opened
// its leader duties; -1 for a server not running or not answering.
func (c *Cluster) dutyCounts() []int {
	out := make([]int, len(c.Servers))
	for i, s := range c.Servers {
		out[i] = -1
		if !s.Running() {
			continue
		}
		if m, err := promMetrics(s.HTTPAddr()); err == nil {
			out[i] = int(m[metricDutiesStarted])
		}
	}
	return out
}

// dutiesOpen reports whether server i's current process has opened its
// leader duties at least once.
func (c *Cluster) dutiesOpen(i int) error {
	m, err := promMetrics(c.Servers[i].HTTPAddr())
	if err != nil {
		return err
	}
	if m[metricDutiesStarted] < 1 {
		return fmt.Errorf("%s leads but has not started its leader duties", c.Servers[i].Name)
	}
	return nil
}

// leaderOnDuty waits for a leader whose metrics show its duties open, and
// returns its index: Raft names a leader a moment before its duties run,
// and a duty count read in that moment would miss the start.
func (c *Cluster) leaderOnDuty(t *testing.T) int {
	t.Helper()
	var idx int
	WaitFor(t, leaderTimeout, func() error {
		var err error
		if idx, err = c.LeaderNow(); err != nil {
			return err
		}
		return c.dutiesOpen(idx)
	})
	return idx
}

// waitNewLeader waits until the running servers agree on a leader other
// than old whose duty count has moved past before's, and returns its
// index and the leaderless gap it measured ("" if none).
func (c *Cluster) waitNewLeader(t *testing.T, old int, before []int) (int, string) {
	t.Helper()
	var idx int
	var m map[string]float64
	WaitFor(t, leaderTimeout, func() error {
		var err error
		idx, err = c.LeaderNow()
		if err != nil {
			return err
		}
		if idx == old {
			return fmt.Errorf("%s still leads", c.Servers[idx].Name)
		}
		if m, err = promMetrics(c.Servers[idx].HTTPAddr()); err != nil {
			return err
		}
		if n := int(m[metricDutiesStarted]); n <= before[idx] {
			return fmt.Errorf("%s leads but has not started its leader duties", c.Servers[idx].Name)
		}
		return nil
	})
	gap := ""
	if v, ok := m[metricGapMS]; ok && v > 0 {
		gap = time.Duration(v * float64(time.Millisecond)).Round(10 * time.Microsecond).String()
	}
	return idx, gap
}

// waitRejoined waits until server i, restarted, is a voter that agrees
// with the others on a leader whose duties have started, and returns the
// leader's index.
func (c *Cluster) waitRejoined(t *testing.T, i int) int {
	t.Helper()
	var leader int
	WaitFor(t, leaderTimeout, func() error {
		var err error
		leader, err = c.LeaderNow()
		if err != nil {
			return err
		}
		if err := c.dutiesOpen(leader); err != nil {
			return err
		}
		return checkRaft(c, c.Servers[i].HTTPAddr(), leader, -1)
	})
	return leader
}

// logSource is a process whose log a test reads: an Agent or a plugin
// instance.
type logSource interface{ Log() string }

// logLines returns the lines of a's log since its last start that contain
// any of the needles.
func logLines(a logSource, needles ...string) []string {
	log := a.Log()
	if i := strings.LastIndex(log, "==== e2e: start #"); i >= 0 {
		log = log[i:]
	}
	var out []string
	for _, l := range strings.Split(log, "\n") {
		for _, n := range needles {
			if strings.Contains(l, n) {
				out = append(out, l)
				break
			}
		}
	}
	return out
}

// timerValue reads a duration setting of serverTimers, the server config
// every e2e cluster runs with.
func timerValue(t *testing.T, name string) time.Duration {
	t.Helper()
	m := regexp.MustCompile(name + `\s*=\s*"([^"]+)"`).FindStringSubmatch(serverTimers)
	must.NotNil(t, m, must.Sprintf("%s not set in serverTimers", name))
	d, err := time.ParseDuration(m[1])
	must.NoError(t, err)
	return d
}

// pluginState is the part of a hostpath plugin's state.json read here.
type pluginState struct {
	Nodes map[string]struct {
		Attachments map[string]json.RawMessage `json:"attachments"`
	} `json:"nodes"`
}

// attachments returns, by plugin node ID, the volumes (external IDs) the
// plugins sharing stateDir have attached to that node.
func attachments(stateDir string) (map[string]map[string]bool, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, "state.json"))
	if err != nil {
		return nil, err
	}
	var st pluginState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s/state.json: %w", stateDir, err)
	}
	out := make(map[string]map[string]bool)
	for node, n := range st.Nodes {
		for ext := range n.Attachments {
			if out[node] == nil {
				out[node] = make(map[string]bool)
			}
			out[node][ext] = true
		}
	}
	return out, nil
}

// volRef is a registered volume and where its plugin keeps its state.
type volRef struct {
	ID, ExtID, StateDir string
}

// registerVolumeFor registers a single-node-writer file-system volume of
// pluginID with PUT /v1/volume/csi/:id.
func (cc *csiCluster) registerVolumeFor(t *testing.T, pluginID, id, externalID string) {
	t.Helper()
	body := map[string]any{"Volumes": []map[string]any{{
		"ID": id, "Name": id, "ExternalID": externalID, "PluginID": pluginID,
		"RequestedCapabilities": []map[string]string{{
			"AccessMode": api.CSIAccessModeSingleNodeWriter, "AttachmentMode": api.CSIAttachmentModeFilesystem,
		}},
	}}}
	must.NoError(t, SendJSON("PUT", cc.API(), "/v1/volume/csi/"+url.PathEscape(id), body, nil))
}

// allocByID reads GET /v1/allocation/:id.
func (cc *csiCluster) allocByID(id string) (*Alloc, error) {
	var a Alloc
	err := GetJSON(cc.API(), "/v1/allocation/"+id, &a)
	return &a, err
}

// claimsSettled checks that claims, allocations and attachments agree, and
// says what does not:
//   - every claim on vols is taken, by a running allocation (desired run) of
//     jobs on the claim's node, which asks for that volume (volFor);
//   - every running allocation of jobs holds its claim, and none is still
//     pending;
//   - every volume attached at a plugin to a node has a claim for that node
//     and every claim's volume is attached to its node: no publish without
//     a claim, no claim without a publish.
func (cc *csiCluster) claimsSettled(vols []volRef, jobs []string, volFor func(*Alloc) string) error {
	allocs := make(map[string]*Alloc)
	var list []*Alloc
	for _, j := range jobs {
		l, err := JobAllocs(cc.API(), j)
		if err != nil {
			return err
		}
		for _, a := range l {
			allocs[a.ID] = a
		}
		list = append(list, l...)
	}
	var problems []string
	claimed := make(map[string]bool)           // volume ID + "/" + alloc ID
	want := make(map[string]map[string]bool)   // stateDir → node/ext
	ours := make(map[string]map[string]string) // stateDir → ext → volume ID
	for _, ref := range vols {
		if ours[ref.StateDir] == nil {
			ours[ref.StateDir] = make(map[string]string)
			want[ref.StateDir] = make(map[string]bool)
		}
		ours[ref.StateDir][ref.ExtID] = ref.ID
		v, err := cc.volume(ref.ID)
		if err != nil {
			return err
		}
		for _, c := range v.Claims {
			a := allocs[c.AllocationID]
			if a == nil {
				if a, err = cc.allocByID(c.AllocationID); err != nil {
					problems = append(problems, fmt.Sprintf("volume %s claimed by allocation %s, which is not of %v: %v",
						ref.ID, shortAlloc(c.AllocationID), jobs, err))
					continue
				}
			}
			switch {
			case a.DesiredStatus != "run" || a.ClientStatus != "running":
				problems = append(problems, fmt.Sprintf("volume %s claimed (%s) by %s, which is not running", ref.ID, c.State, a))
			case c.State != "taken":
				problems = append(problems, fmt.Sprintf("volume %s claim by running %s is %s, not taken", ref.ID, a, c.State))
			case c.NodeID != a.NodeID:
				problems = append(problems, fmt.Sprintf("volume %s claim by %s names node %.8s", ref.ID, a, c.NodeID))
			case volFor(a) != ref.ID:
				problems = append(problems, fmt.Sprintf("volume %s claimed by %s, which asks for %s", ref.ID, a, volFor(a)))
			}
			claimed[ref.ID+"/"+a.ID] = true
			want[ref.StateDir][c.ExternalNodeID+"/"+ref.ExtID] = true
		}
	}
	for _, a := range list {
		if a.DesiredStatus != "run" || a.ClientTerminal() {
			continue
		}
		if a.ClientStatus != "running" {
			problems = append(problems, fmt.Sprintf("%s not settled", a))
			continue
		}
		if !claimed[volFor(a)+"/"+a.ID] {
			problems = append(problems, fmt.Sprintf("running %s holds no claim on %s", a, volFor(a)))
		}
	}
	for dir, exts := range ours {
		att, err := attachments(dir)
		if err != nil {
			return err
		}
		for node, set := range att {
			for ext := range set {
				if id, ok := exts[ext]; ok && !want[dir][node+"/"+ext] {
					problems = append(problems, fmt.Sprintf("volume %s attached to plugin node %s without a claim for it", id, node))
				}
			}
		}
		for key := range want[dir] {
			node, ext, _ := strings.Cut(key, "/")
			if !att[node][ext] {
				problems = append(problems, fmt.Sprintf("volume %s claimed for plugin node %s but not attached there", exts[ext], node))
			}
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return fmt.Errorf("claims, allocations and attachments disagree:\n  %s\nallocations:\n%s",
			strings.Join(problems, "\n  "), allocTable(list))
	}
	return nil
}

// pluginCalls sums method's calls over the plugin processes of a plugin
// set (nil: the default plugin).
func (cc *csiCluster) pluginCalls(t *testing.T, set *csiPluginSet, method string) int64 {
	t.Helper()
	dir, procs := cc.StateDir, cc.Plugins
	if set != nil {
		dir, procs = set.StateDir, set.Plugins
	}
	var n int64
	for name := range procs {
		b, err := os.ReadFile(filepath.Join(dir, "calls-"+name+".json"))
		must.NoError(t, err)
		m := make(map[string]int64)
		must.NoError(t, json.Unmarshal(b, &m))
		n += m[method]
	}
	return n
}

// mustNoOverlapsIn is mustNoOverlaps for an extra plugin set.
func (cc *csiCluster) mustNoOverlapsIn(t *testing.T, set *csiPluginSet) {
	t.Helper()
	for name, p := range set.Plugins {
		b, err := os.ReadFile(filepath.Join(set.StateDir, "overlaps-"+name))
		must.NoError(t, err)
		must.Eq(t, "0", strings.TrimSpace(string(b)), must.Sprintf("plugin %s of %s counted overlapping controller calls; its log:\n%s",
			set.ID, name, p.LogTail(40)))
	}
}
