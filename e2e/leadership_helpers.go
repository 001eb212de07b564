//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
)

// Leadership helpers: leader changes as the servers' logs and APIs show
// them, and a check that claims, allocations and the plugins' attachments
// agree once the cluster has settled.

// dutiesLine is what a server logs once it has become leader and started
// the leader's duties (heartbeat timers, volume watcher, lanes, workers).
const dutiesLine = "leader duties started"

var leaderlessGap = regexp.MustCompile(`leaderless_gap=(\S+)`)

// dutyCounts returns, per server, how often its log (over all its starts)
// says its leader duties started.
func (c *Cluster) dutyCounts() []int {
	out := make([]int, len(c.Servers))
	for i, s := range c.Servers {
		out[i] = strings.Count(s.Log(), dutiesLine)
	}
	return out
}

// leaderOnDuty waits for a leader whose log shows its duties started, and
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
		if !strings.Contains(c.Servers[idx].Log(), dutiesLine) {
			return fmt.Errorf("%s leads but has not started its leader duties", c.Servers[idx].Name)
		}
		return nil
	})
	return idx
}

// waitNewLeader waits until the running servers agree on a leader other
// than old whose log shows its duties started more often than before says,
// and returns its index and the leaderless gap it logged ("" if none).
func (c *Cluster) waitNewLeader(t *testing.T, old int, before []int) (int, string) {
	t.Helper()
	var idx int
	WaitFor(t, leaderTimeout, func() error {
		var err error
		idx, err = c.LeaderNow()
		if err != nil {
			return err
		}
		if idx == old {
			return fmt.Errorf("%s still leads", c.Servers[idx].Name)
		}
		if n := strings.Count(c.Servers[idx].Log(), dutiesLine); n <= before[idx] {
			return fmt.Errorf("%s leads but has not started its leader duties", c.Servers[idx].Name)
		}
		return nil
	})
	gap := ""
	log := c.Servers[idx].Log()
	if i := strings.LastIndex(log, dutiesLine); i >= 0 {
		line := log[i:]
		if j := strings.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
		if m := leaderlessGap.FindStringSubmatch(line); m != nil {
			gap = m[1]
		}
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
		if !strings.Contains(c.Servers[leader].Log(), dutiesLine) {
			return fmt.Errorf("%s leads but has never started its duties", c.Servers[leader].Name)
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
