//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Workload helpers: jobs, allocations, evaluations and nodes read over the
// HTTP API, changed through the CLI.

// TaskEvent is one entry of a task's event list.
type TaskEvent struct {
	Type     string
	Time     int64 // Unix nanoseconds
	Message  string
	ExitCode int
	Signal   int
}

// TaskState is a task's lifecycle as the client reports it.
type TaskState struct {
	State      string
	Failed     bool
	Restarts   uint64
	StartedAt  time.Time
	FinishedAt time.Time
	Events     []TaskEvent
}

// RescheduleEvent is one replacement in an allocation's lineage.
type RescheduleEvent struct {
	RescheduleTime int64
	PrevAllocID    string
	PrevNodeID     string
	Delay          time.Duration
}

// Alloc is an allocation as /v1/job/:id/allocations and /v1/allocation/:id
// serve it (the fields the suites read).
type Alloc struct {
	ID                 string
	EvalID             string
	Name               string
	NodeID             string
	NodeName           string
	JobID              string
	JobType            string
	TaskGroup          string
	DesiredStatus      string
	DesiredDescription string
	ClientStatus       string
	ClientDescription  string
	TaskStates         map[string]*TaskState
	DesiredTransition  struct{ Migrate *bool }
	PreviousAllocation string
	NextAllocation     string
	RescheduleTracker  *struct{ Events []RescheduleEvent }
	FollowupEvalID     string
	CreateIndex        uint64
	ModifyIndex        uint64
	CreateTime         int64 // Unix nanoseconds
	ModifyTime         int64
}

// Live reports whether the servers want the allocation to run and the
// client has not finished with it.
func (a *Alloc) Live() bool {
	return a.DesiredStatus == "run" && !a.ClientTerminal()
}

// ClientTerminal reports whether the client has finished with it.
func (a *Alloc) ClientTerminal() bool {
	switch a.ClientStatus {
	case "complete", "failed", "lost":
		return true
	}
	return false
}

// Migrating reports whether a drain asked the allocation to move.
func (a *Alloc) Migrating() bool {
	return a.DesiredTransition.Migrate != nil && *a.DesiredTransition.Migrate
}

// Created is CreateTime as a time.
func (a *Alloc) Created() time.Time { return time.Unix(0, a.CreateTime) }

func (a *Alloc) String() string {
	return fmt.Sprintf("%s %s node=%s desired=%s client=%s prev=%.8s next=%.8s migrate=%t",
		shortAlloc(a.ID), a.Name, a.NodeName, a.DesiredStatus, a.ClientStatus,
		a.PreviousAllocation, a.NextAllocation, a.Migrating())
}

func shortAlloc(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// Eval is an evaluation (the fields the suites read).
type Eval struct {
	ID                string
	Status            string
	StatusDescription string
	Type              string
	TriggeredBy       string
	JobID             string
	NodeID            string
	WaitUntil         time.Time
	PreviousEval      string
	NextEval          string
	BlockedEval       string
	// FailedTGAllocs says, per group, why placements failed.
	FailedTGAllocs map[string]*struct {
		ConstraintFiltered map[string]int
	}
}

// Terminal reports whether the evaluation is finished.
func (e *Eval) Terminal() bool {
	switch e.Status {
	case "complete", "failed", "canceled":
		return true
	}
	return false
}

// Node is /v1/node/:id (the fields the suites read).
type Node struct {
	ID                    string
	Name                  string
	Status                string
	SchedulingEligibility string
	Drain                 bool
	DrainStrategy         json.RawMessage
}

// Draining reports whether the node has a drain strategy.
func (n *Node) Draining() bool {
	return n.Drain || (len(n.DrainStrategy) > 0 && string(n.DrainStrategy) != "null")
}

// JobAllocs returns every allocation of jobID, terminal ones included,
// oldest first.
func JobAllocs(base, jobID string) ([]*Alloc, error) {
	var out []*Alloc
	if err := GetJSON(base, "/v1/job/"+jobID+"/allocations?all=true", &out); err != nil {
		return nil, err
	}
	sortAllocs(out)
	return out, nil
}

// NodeAllocs returns every allocation on nodeID, oldest first.
func NodeAllocs(base, nodeID string) ([]*Alloc, error) {
	var out []*Alloc
	if err := GetJSON(base, "/v1/node/"+nodeID+"/allocations", &out); err != nil {
		return nil, err
	}
	sortAllocs(out)
	return out, nil
}

func sortAllocs(list []*Alloc) {
	sort.SliceStable(list, func(i, j int) bool {
		if list[i].CreateIndex != list[j].CreateIndex {
			return list[i].CreateIndex < list[j].CreateIndex
		}
		return list[i].Name < list[j].Name
	})
}

// JobEvals returns jobID's evaluations.
func JobEvals(base, jobID string) ([]*Eval, error) {
	var out []*Eval
	err := GetJSON(base, "/v1/job/"+jobID+"/evaluations", &out)
	return out, err
}

// NodeInfo returns /v1/node/:id.
func NodeInfo(base, nodeID string) (*Node, error) {
	var n Node
	err := GetJSON(base, "/v1/node/"+nodeID, &n)
	return &n, err
}

// JobInfo is the part of /v1/job/:id the suites read.
type JobInfo struct {
	ID     string
	Status string
	Stop   bool
}

// GetJob returns /v1/job/:id.
func GetJob(base, jobID string) (*JobInfo, error) {
	var j JobInfo
	err := GetJSON(base, "/v1/job/"+jobID, &j)
	return &j, err
}

// SendJSON sends in as JSON with method to base+path and decodes a 2xx
// answer into out (unless out is nil).
func SendJSON(method, base, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequest(method, base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s%s: %s: %s", method, base, path, resp.Status, data)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// API is the HTTP base URL of the first running server.
func (c *Cluster) API() string {
	c.t.Helper()
	i := c.LiveServer()
	if i < 0 {
		c.t.Fatalf("e2e: no server is running")
	}
	return c.ServerHTTP(i)
}

// NodeIDs waits until every client is registered and ready and returns
// their node IDs by client name.
func (c *Cluster) NodeIDs() map[string]string {
	c.t.Helper()
	ids := make(map[string]string)
	WaitFor(c.t, settle, func() error {
		nodes, err := Nodes(c.API(), false)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if n.Status == "ready" {
				ids[n.Name] = n.ID
			}
		}
		for _, a := range c.Clients {
			if ids[a.Name] == "" {
				return fmt.Errorf("node %s not ready; nodes: %+v", a.Name, nodes)
			}
		}
		return nil
	})
	return ids
}

// RunJob writes jobHCL to a file and registers it with `roam job run
// -detach`.
func (c *Cluster) RunJob(jobHCL string) {
	c.t.Helper()
	path := filepath.Join(c.t.TempDir(), "job.hcl")
	if err := os.WriteFile(path, []byte(jobHCL), 0o644); err != nil {
		c.t.Fatalf("e2e: %v", err)
	}
	c.MustCLI("job", "run", "-detach", path)
}

// MustCLI runs the CLI and fails the test unless it exits 0.
func (c *Cluster) MustCLI(args ...string) string {
	c.t.Helper()
	out, errOut, code := c.RunCLI(args...)
	if code != 0 {
		c.t.Fatalf("e2e: roam %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// SetEligible marks nodeID eligible or ineligible with `roam node
// eligibility` and waits until the servers show it.
func (c *Cluster) SetEligible(nodeID string, eligible bool) {
	c.t.Helper()
	flag, want := "-disable", "ineligible"
	if eligible {
		flag, want = "-enable", "eligible"
	}
	c.MustCLI("node", "eligibility", flag, nodeID)
	WaitFor(c.t, settle, func() error {
		n, err := NodeInfo(c.API(), nodeID)
		if err != nil {
			return err
		}
		if n.SchedulingEligibility != want {
			return fmt.Errorf("node %s is %s, want %s", n.Name, n.SchedulingEligibility, want)
		}
		return nil
	})
}

// WaitJobAllocs polls jobID's allocations until cond accepts them, and
// returns the list cond accepted.
func (c *Cluster) WaitJobAllocs(jobID string, timeout time.Duration, cond func([]*Alloc) error) []*Alloc {
	c.t.Helper()
	var last []*Alloc
	WaitFor(c.t, timeout, func() error {
		list, err := JobAllocs(c.API(), jobID)
		if err != nil {
			return err
		}
		last = list
		if err := cond(list); err != nil {
			return fmt.Errorf("%w\nallocations of %s:\n%s", err, jobID, allocTable(list))
		}
		return nil
	})
	return last
}

// WaitEvalsSettled polls until every evaluation of jobID is terminal.
func (c *Cluster) WaitEvalsSettled(jobID string, timeout time.Duration) {
	c.t.Helper()
	WaitFor(c.t, timeout, func() error {
		evals, err := JobEvals(c.API(), jobID)
		if err != nil {
			return err
		}
		if len(evals) == 0 {
			return fmt.Errorf("job %s has no evaluations", jobID)
		}
		for _, e := range evals {
			if !e.Terminal() {
				return fmt.Errorf("eval %.8s (%s) is %s (wait until %s)", e.ID, e.TriggeredBy, e.Status, e.WaitUntil.Format(time.RFC3339Nano))
			}
		}
		return nil
	})
}

// running returns the allocations the client reports running.
func running(list []*Alloc) []*Alloc {
	var out []*Alloc
	for _, a := range list {
		if a.Live() && a.ClientStatus == "running" {
			out = append(out, a)
		}
	}
	return out
}

// live returns the allocations the servers want running and the client
// has not finished.
func live(list []*Alloc) []*Alloc {
	var out []*Alloc
	for _, a := range list {
		if a.Live() {
			out = append(out, a)
		}
	}
	return out
}

// onNode returns the allocations on nodeID.
func onNode(list []*Alloc, nodeID string) []*Alloc {
	var out []*Alloc
	for _, a := range list {
		if a.NodeID == nodeID {
			out = append(out, a)
		}
	}
	return out
}

// allocTable renders allocations one a line, for failure messages.
func allocTable(list []*Alloc) string {
	var b strings.Builder
	for _, a := range list {
		b.WriteString("  ")
		b.WriteString(a.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// killStrays SIGKILLs every process, other than this test binary, whose
// command line or environment mentions dir: the executors and tasks that
// the cluster's clients started. Executors detach into their own session,
// so stopping (or kill -9 of) a client leaves them running.
func killStrays(t testing.TB, dir string) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return // not Linux: nothing to scan
	}
	self := os.Getpid()
	needle := []byte(dir + string(filepath.Separator))
	// An exec task is pivoted into its own root (its /proc root link says
	// "/"): it is known by its cgroup, named after an allocation one of
	// the cluster's clients holds.
	allocs := map[string]bool{}
	if dirs, err := filepath.Glob(filepath.Join(dir, "*", "data", "alloc", "*")); err == nil {
		for _, d := range dirs {
			allocs[filepath.Base(d)] = true
		}
	}
	var (
		killed  []int
		cgroups []string
	)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		environ, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		taskCgs, alloc := taskCgroups(pid)
		isTask := alloc != "" && allocs[alloc]
		if !bytes.Contains(cmdline, needle) && !bytes.Contains(environ, needle) && !isTask {
			continue
		}
		if isTask {
			cgroups = append(cgroups, taskCgs...)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
			killed = append(killed, pid)
		}
	}
	if len(killed) > 0 {
		t.Logf("e2e: killed %d leftover task/executor processes: %v", len(killed), killed)
	}
	// The exec tasks' cgroups go once the kernel has emptied them.
	for _, dir := range cgroups {
		_ = pollEvery(10*time.Second, 20*time.Millisecond, func() error {
			if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			return nil
		})
	}
}

// taskCgroups are the cgroup directories of an exec task's process, one
// per hierarchy it is in below /roam (the exec driver's parent), and the
// allocation the cgroup is named after ("<alloc ID>.<task>").
func taskCgroups(pid int) ([]string, string) {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return nil, ""
	}
	var out []string
	alloc := ""
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/roam/") {
			continue
		}
		alloc, _, _ = strings.Cut(strings.TrimPrefix(parts[2], "/roam/"), ".")
		switch controllers := parts[1]; {
		case controllers == "":
			out = append(out, filepath.Join("/sys/fs/cgroup", parts[2]))
			out = append(out, filepath.Join("/sys/fs/cgroup/unified", parts[2]))
		default:
			name := strings.TrimPrefix(controllers, "name=")
			out = append(out, filepath.Join("/sys/fs/cgroup", name, parts[2]))
		}
	}
	return out, alloc
}

// pidAlive reports whether a process with pid exists (and is not a zombie).
func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	// The state follows the command name in parentheses.
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// ReportServerEvents prints, if the test fails, the last n lines of each
// server's log other than HTTP request lines, which polling tests produce
// by the hundred and which would push everything else out of the tail.
func (c *Cluster) ReportServerEvents(n int) {
	t := c.t
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, s := range c.Servers {
			var keep []string
			for _, l := range strings.Split(s.Log(), "\n") {
				if !strings.Contains(l, "agent.http: request") {
					keep = append(keep, l)
				}
			}
			if len(keep) > n {
				keep = keep[len(keep)-n:]
			}
			t.Logf("==== e2e: %s log without HTTP request lines, last %d ====\n%s", s.Name, n, strings.Join(keep, "\n"))
		}
	})
}
