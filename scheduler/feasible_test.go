package scheduler

import (
	"testing"

	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
)

// rejectVolumes is a VolumeChecker that refuses listed nodes.
type rejectVolumes map[string]bool

func (r rejectVolumes) FeasibleVolumes(n *structs.Node, _ *structs.TaskGroup, _ int, _ *structs.Allocation) (bool, string) {
	if r[n.ID] {
		return false, "volume claims exhausted"
	}
	return true, ""
}

func TestPlacement_SingleNodeFeasibility(t *testing.T) {
	cases := []struct {
		name      string
		node      *structs.Node
		jobDCs    []string
		volumes   VolumeChecker
		ask       structs.Resources
		place     bool
		filtered  string // ConstraintFiltered reason when not placed
		exhausted string // DimensionExhausted when not placed
	}{
		{name: "ready eligible", node: mkNode("n1"), place: true},
		{name: "ineligible", node: mkNode("n1", ineligible()), filtered: FilterIneligible},
		{name: "draining", node: mkNode("n1", func(n *structs.Node) {
			n.DrainStrategy = &structs.DrainStrategy{}
		}), filtered: FilterDraining},
		{name: "down", node: mkNode("n1", withStatus(structs.NodeStatusDown)), filtered: FilterNotReady},
		{name: "initializing", node: mkNode("n1", withStatus(structs.NodeStatusInit)), filtered: FilterNotReady},
		{name: "other datacenter", node: mkNode("n1", withDC("dc2")), filtered: FilterDatacenter},
		{name: "star datacenter", node: mkNode("n1", withDC("dc9")), jobDCs: []string{"*"}, place: true},
		{name: "prefix datacenter", node: mkNode("n1", withDC("dc9")), jobDCs: []string{"dc*"}, place: true},
		{name: "prefix datacenter miss", node: mkNode("n1", withDC("eu1")), jobDCs: []string{"dc*"}, filtered: FilterDatacenter},
		{name: "no driver", node: mkNode("n1", func(n *structs.Node) { n.Drivers = nil }), filtered: filterMissingDriver("raw_exec")},
		{name: "driver not detected", node: mkNode("n1", func(n *structs.Node) {
			n.Drivers["raw_exec"].Detected = false
		}), filtered: filterMissingDriver("raw_exec")},
		{name: "driver unhealthy", node: mkNode("n1", func(n *structs.Node) {
			n.Drivers["raw_exec"].Healthy = false
		}), filtered: filterUnhealthyDriver("raw_exec")},
		{name: "cpu too small", node: mkNode("n1"), ask: structs.Resources{CPU: 4001, MemoryMB: 10}, exhausted: DimensionCPU},
		{name: "cpu exactly fits", node: mkNode("n1"), ask: structs.Resources{CPU: 4000, MemoryMB: 8192}, place: true},
		{name: "memory too small", node: mkNode("n1"), ask: structs.Resources{CPU: 10, MemoryMB: 8193}, exhausted: DimensionMemory},
		{name: "totalcompute overrides cores", node: mkNode("n1", func(n *structs.Node) {
			n.Attributes["cpu.totalcompute"] = "9000"
		}), ask: structs.Resources{CPU: 8000, MemoryMB: 10}, place: true},
		{name: "no attributes", node: mkNode("n1", func(n *structs.Node) { n.Attributes = nil }), exhausted: DimensionCPU},
		{name: "volume checker rejects", node: mkNode("n1"), volumes: rejectVolumes{"n1": true}, filtered: "volume claims exhausted"},
		{name: "volume checker accepts", node: mkNode("n1"), volumes: rejectVolumes{"n2": true}, place: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job := mkJob("web", structs.JobTypeService, 1)
			if tc.jobDCs != nil {
				job.Datacenters = tc.jobDCs
			}
			if tc.ask != (structs.Resources{}) {
				job.TaskGroups[0].Tasks[0].Resources = &tc.ask
			}
			st := &fakeState{nodes: []*structs.Node{tc.node}, jobs: []*structs.Job{job}}
			opts := testOpts()
			opts.Volumes = tc.volumes
			plan, res, err := Process(st, mkEval(job), opts)
			must.NoError(t, err)
			placed := placements(st, plan)
			if tc.place {
				must.Len(t, 1, placed)
				must.Eq(t, "n1", placed[0].NodeID)
				must.False(t, res.Blocked)
				must.MapEmpty(t, res.FailedTGAllocs)
				must.Eq(t, 0, res.QueuedAllocations["web"])
				return
			}
			must.Len(t, 0, placed)
			must.True(t, res.Blocked)
			must.Eq(t, 1, res.QueuedAllocations["web"])
			m := res.FailedTGAllocs["web"]
			must.NotNil(t, m)
			must.Eq(t, m, plan.FailedTGAllocs["web"])
			must.Eq(t, 1, m.NodesEvaluated)
			if tc.filtered != "" {
				must.Eq(t, 1, m.NodesFiltered)
				must.Eq(t, map[string]int{tc.filtered: 1}, m.ConstraintFiltered)
			}
			if tc.exhausted != "" {
				must.Eq(t, 1, m.NodesExhausted)
				must.Eq(t, map[string]int{tc.exhausted: 1}, m.DimensionExhausted)
			}
		})
	}
}

func TestPlacement_SkipsUnfitNodesAmongMany(t *testing.T) {
	job := mkJob("web", structs.JobTypeService, 1)
	job.Datacenters = []string{"dc1", "dc2"}
	job.TaskGroups[0].Tasks[0].Resources = &structs.Resources{CPU: 3000, MemoryMB: 1024}
	st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{
		mkNode("a-small", withCores(2)),
		mkNode("b-ineligible", ineligible()),
		mkNode("c-down", withStatus(structs.NodeStatusDown)),
		mkNode("d-dc3", withDC("dc3")),
		mkNode("e-nodriver", func(n *structs.Node) { n.Drivers["raw_exec"].Healthy = false }),
		mkNode("f-good", withDC("dc2")),
	}}
	plan, res := run(t, st, job)
	placed := placements(st, plan)
	must.Eq(t, []string{"f-good"}, nodeIDs(placed))
	must.False(t, res.Blocked)
}

func TestPlacement_NothingFitsExplainsDimension(t *testing.T) {
	job := mkJob("web", structs.JobTypeService, 3)
	job.TaskGroups[0].Tasks[0].Resources = &structs.Resources{CPU: 100, MemoryMB: 6000}
	st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{
		mkNode("n1"), mkNode("n2", withMemMB(4096)), mkNode("n3", ineligible()),
	}}
	plan, res := run(t, st, job)
	placed := placements(st, plan)
	// n1 takes one (8 GiB holds one 6000 MiB ask); n2 is too small.
	must.Eq(t, []string{"n1"}, nodeIDs(placed))
	must.True(t, res.Blocked)
	must.Eq(t, 2, res.QueuedAllocations["web"])
	m := res.FailedTGAllocs["web"]
	must.Eq(t, 3, m.NodesEvaluated)
	must.Eq(t, map[string]int{FilterIneligible: 1}, m.ConstraintFiltered)
	must.Eq(t, map[string]int{DimensionMemory: 2}, m.DimensionExhausted)
	must.Eq(t, 1, m.CoalescedFailures)
}

func TestPlacement_CountsPlanAndExistingUsage(t *testing.T) {
	job := mkJob("web", structs.JobTypeService, 5)
	job.TaskGroups[0].Tasks[0].Resources = &structs.Resources{CPU: 2000, MemoryMB: 100}
	other := mkJob("other", structs.JobTypeService, 1)
	other.TaskGroups[0].Tasks[0].Resources = &structs.Resources{CPU: 2000, MemoryMB: 100}
	st := &fakeState{
		jobs:  []*structs.Job{job, other},
		nodes: []*structs.Node{mkNode("n1"), mkNode("n2")},
		allocs: []*structs.Allocation{
			mkAlloc("o1", other, 0, "n1", structs.AllocClientStatusRunning),
			// Terminal allocations use nothing.
			mkAlloc("o2", other, 1, "n2", structs.AllocClientStatusComplete),
		},
	}
	plan, res := run(t, st, job)
	placed := placements(st, plan)
	must.Len(t, 3, placed) // n1 has room for 1, n2 for 2
	perNode := map[string]int{}
	for _, a := range placed {
		perNode[a.NodeID]++
	}
	must.Eq(t, map[string]int{"n1": 1, "n2": 2}, perNode)
	must.True(t, res.Blocked)
	must.Eq(t, 2, res.QueuedAllocations["web"])
	must.Eq(t, map[string]int{DimensionCPU: 2}, res.FailedTGAllocs["web"].DimensionExhausted)
}

func TestPlacement_AllocationFields(t *testing.T) {
	job := mkJob("web", structs.JobTypeService, 1)
	job.TaskGroups[0].Tasks = append(job.TaskGroups[0].Tasks, &structs.Task{
		Name: "sidecar", Driver: "raw_exec", Resources: &structs.Resources{CPU: 50, MemoryMB: 64},
	})
	st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{mkNode("n1")}}
	plan, _ := run(t, st, job)
	placed := placements(st, plan)
	must.Len(t, 1, placed)
	must.Eq(t, &structs.Allocation{
		ID: "alloc-0001", Namespace: "default", EvalID: "eval-1", Name: "web.web[0]",
		NodeID: "n1", NodeName: "name-n1", JobID: "web", Job: job, TaskGroup: "web",
		Resources:     &structs.Resources{CPU: 550, MemoryMB: 320},
		DesiredStatus: structs.AllocDesiredStatusRun, ClientStatus: structs.AllocClientStatusPending,
		CreateTime: testNow.UnixNano(), ModifyTime: testNow.UnixNano(),
	}, placed[0])
	must.Eq(t, "eval-1", plan.EvalID)
	must.Eq(t, job, plan.Job)
}

func TestPlacement_BinPackAndSpread(t *testing.T) {
	// n2 is already fuller (another job's alloc): bin-packing prefers it
	// for the first replica; anti-affinity moves the second elsewhere.
	job := mkJob("web", structs.JobTypeService, 2)
	other := mkJob("other", structs.JobTypeService, 1)
	st := &fakeState{
		jobs:   []*structs.Job{job, other},
		nodes:  []*structs.Node{mkNode("n1"), mkNode("n2"), mkNode("n3")},
		allocs: []*structs.Allocation{mkAlloc("o1", other, 0, "n2", structs.AllocClientStatusRunning)},
	}
	plan, _ := run(t, st, job)
	placed := placements(st, plan)
	must.Eq(t, []string{"n2", "n1"}, nodeIDs(placed))
}

func TestMatchDatacenter(t *testing.T) {
	cases := []struct {
		pattern, dc string
		want        bool
	}{
		{"dc1", "dc1", true}, {"dc1", "dc10", false}, {"*", "anything", true}, {"*", "", true},
		{"dc*", "dc", true}, {"dc*", "dc2", true}, {"dc*", "eu-dc", false}, {"*-west", "us-west", true},
		{"us-*-1", "us-east-1", true}, {"us-*-1", "us-east-2", false}, {"a*a", "a", false}, {"a*a", "aa", true},
	}
	for _, tc := range cases {
		must.Eq(t, tc.want, matchDatacenter(tc.pattern, tc.dc), must.Sprintf("%q ~ %q", tc.pattern, tc.dc))
	}
}
