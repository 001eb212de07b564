package scheduler

import (
	"fmt"
	"math/rand"
	"sort"
	"testing"
	"time"

	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
)

// testNow is the injected clock of every test.
var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeState is an in-memory State. shuffle, when set, permutes what every
// list read returns, to prove order does not matter.
type fakeState struct {
	nodes   []*structs.Node
	allocs  []*structs.Allocation
	jobs    []*structs.Job
	shuffle *rand.Rand
}

var _ State = (*fakeState)(nil)

func (s *fakeState) perm(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	if s.shuffle != nil {
		s.shuffle.Shuffle(n, func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	}
	return idx
}

func (s *fakeState) Nodes() ([]*structs.Node, error) {
	out := make([]*structs.Node, 0, len(s.nodes))
	for _, i := range s.perm(len(s.nodes)) {
		out = append(out, s.nodes[i])
	}
	return out, nil
}

func (s *fakeState) NodeByID(id string) (*structs.Node, error) {
	for _, n := range s.nodes {
		if n.ID == id {
			return n, nil
		}
	}
	return nil, nil
}

func (s *fakeState) filterAllocs(keep func(*structs.Allocation) bool) []*structs.Allocation {
	var out []*structs.Allocation
	for _, i := range s.perm(len(s.allocs)) {
		if keep(s.allocs[i]) {
			out = append(out, s.allocs[i])
		}
	}
	return out
}

func (s *fakeState) AllocsByJob(ns, jobID string) ([]*structs.Allocation, error) {
	return s.filterAllocs(func(a *structs.Allocation) bool { return a.Namespace == ns && a.JobID == jobID }), nil
}

func (s *fakeState) AllocsByNode(nodeID string) ([]*structs.Allocation, error) {
	return s.filterAllocs(func(a *structs.Allocation) bool { return a.NodeID == nodeID }), nil
}

func (s *fakeState) JobByID(ns, id string) (*structs.Job, error) {
	for _, j := range s.jobs {
		if j.Namespace == ns && j.ID == id {
			return j, nil
		}
	}
	return nil, nil
}

// apply upserts every allocation of the plan by ID, as the plan applier
// will.
func (s *fakeState) apply(plan *structs.Plan) {
	upsert := func(a *structs.Allocation) {
		for i, old := range s.allocs {
			if old.ID == a.ID {
				s.allocs[i] = a
				return
			}
		}
		s.allocs = append(s.allocs, a)
	}
	for _, node := range sortedKeys(plan.NodeUpdate) {
		for _, a := range plan.NodeUpdate[node] {
			upsert(a)
		}
	}
	for _, node := range sortedKeys(plan.NodeAllocation) {
		for _, a := range plan.NodeAllocation[node] {
			upsert(a)
		}
	}
}

func (s *fakeState) alloc(id string) *structs.Allocation {
	for _, a := range s.allocs {
		if a.ID == id {
			return a
		}
	}
	return nil
}

func sortedKeys(m map[string][]*structs.Allocation) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// idSeq returns a deterministic ID generator: prefix-0001, prefix-0002, …
func idSeq(prefix string) func() string {
	n := 0
	return func() string {
		n++
		return fmt.Sprintf("%s-%04d", prefix, n)
	}
}

type nodeOpt func(*structs.Node)

func withDC(dc string) nodeOpt { return func(n *structs.Node) { n.Datacenter = dc } }
func withStatus(s string) nodeOpt {
	return func(n *structs.Node) { n.Status = s }
}
func withCores(c int) nodeOpt {
	return func(n *structs.Node) { n.Attributes["cpu.numcores"] = fmt.Sprint(c) }
}
func withMemMB(mb int) nodeOpt {
	return func(n *structs.Node) { n.Attributes["memory.totalbytes"] = fmt.Sprint(int64(mb) << 20) }
}
func ineligible() nodeOpt {
	return func(n *structs.Node) { n.SchedulingEligibility = structs.NodeSchedulingIneligible }
}
func draining(ignoreSystem bool) nodeOpt {
	return func(n *structs.Node) {
		n.SchedulingEligibility = structs.NodeSchedulingIneligible
		n.DrainStrategy = &structs.DrainStrategy{DrainSpec: structs.DrainSpec{Deadline: time.Hour, IgnoreSystemJobs: ignoreSystem}}
		n.Drain = true
	}
}

// mkNode is a ready, eligible dc1 node with 4 cores, 8 GiB and a healthy
// raw_exec driver.
func mkNode(id string, opts ...nodeOpt) *structs.Node {
	n := &structs.Node{
		ID:                    id,
		Name:                  "name-" + id,
		Datacenter:            "dc1",
		Status:                structs.NodeStatusReady,
		SchedulingEligibility: structs.NodeSchedulingEligible,
		Attributes:            map[string]string{"cpu.numcores": "4", "memory.totalbytes": fmt.Sprint(int64(8192) << 20)},
		Drivers:               map[string]*structs.DriverInfo{"raw_exec": {Detected: true, Healthy: true}},
	}
	for _, o := range opts {
		o(n)
	}
	return n
}

// mkJob is a canonical job with one group "web" of count tasks asking for
// 500 MHz and 256 MiB each.
func mkJob(id, typ string, count int) *structs.Job {
	j := &structs.Job{
		ID:          id,
		Type:        typ,
		Datacenters: []string{"dc1"},
		TaskGroups: []*structs.TaskGroup{{
			Name:  "web",
			Count: count,
			Tasks: []*structs.Task{{
				Name: "server", Driver: "raw_exec",
				Resources: &structs.Resources{CPU: 500, MemoryMB: 256},
			}},
		}},
	}
	j.Canonicalize()
	return j
}

// mkAlloc is an existing allocation of the job's first group.
func mkAlloc(id string, job *structs.Job, idx int, nodeID, clientStatus string) *structs.Allocation {
	tg := job.TaskGroups[0]
	ask := groupAsk(tg)
	return &structs.Allocation{
		ID: id, Namespace: job.Namespace, EvalID: "old-eval",
		Name:   structs.AllocName(job.ID, tg.Name, idx),
		NodeID: nodeID, NodeName: "name-" + nodeID,
		JobID: job.ID, Job: job, TaskGroup: tg.Name, Resources: &ask,
		DesiredStatus: structs.AllocDesiredStatusRun,
		ClientStatus:  clientStatus,
		CreateTime:    testNow.Add(-time.Hour).UnixNano(),
		ModifyTime:    testNow.Add(-time.Hour).UnixNano(),
	}
}

func mkEval(job *structs.Job) *structs.Evaluation {
	return &structs.Evaluation{
		ID: "eval-1", Namespace: job.Namespace, Priority: job.Priority,
		Type: job.Type, TriggeredBy: structs.EvalTriggerJobRegister, JobID: job.ID,
		Status: structs.EvalStatusPending,
	}
}

func testOpts() Options { return Options{Now: testNow, NewID: idSeq("alloc")} }

// run processes job's evaluation against st with fresh test options.
func run(t testing.TB, st *fakeState, job *structs.Job) (*structs.Plan, *Result) {
	t.Helper()
	plan, res, err := Process(st, mkEval(job), testOpts())
	must.NoError(t, err)
	return plan, res
}

// placements are the plan's new allocations (not updates of existing
// ones), sorted by name then node.
func placements(st *fakeState, plan *structs.Plan) []*structs.Allocation {
	var out []*structs.Allocation
	for _, node := range sortedKeys(plan.NodeAllocation) {
		for _, a := range plan.NodeAllocation[node] {
			if st.alloc(a.ID) == nil {
				out = append(out, a)
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].NodeID < out[j].NodeID
	})
	return out
}

// updates are the plan's field updates of existing allocations, by ID.
func updates(st *fakeState, plan *structs.Plan) map[string]*structs.Allocation {
	out := make(map[string]*structs.Allocation)
	for _, list := range plan.NodeAllocation {
		for _, a := range list {
			if st.alloc(a.ID) != nil {
				out[a.ID] = a
			}
		}
	}
	return out
}

// stops are the plan's stopped allocations, by ID.
func stops(plan *structs.Plan) map[string]*structs.Allocation {
	out := make(map[string]*structs.Allocation)
	for _, list := range plan.NodeUpdate {
		for _, a := range list {
			out[a.ID] = a
		}
	}
	return out
}

func names(allocs []*structs.Allocation) []string {
	out := make([]string, len(allocs))
	for i, a := range allocs {
		out[i] = a.Name
	}
	return out
}

func nodeIDs(allocs []*structs.Allocation) []string {
	out := make([]string, len(allocs))
	for i, a := range allocs {
		out[i] = a.NodeID
	}
	return out
}

func boolPtr(b bool) *bool { return &b }
