package scheduler

import (
	"testing"

	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
)

func mkSystemJob() *structs.Job {
	job := mkJob("agent", structs.JobTypeSystem, 1)
	job.Datacenters = []string{"dc1", "dc2"}
	return job
}

func TestSystem_OnePerEligibleNode(t *testing.T) {
	job := mkSystemJob()
	st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{
		mkNode("n1"),
		mkNode("n2", withDC("dc2")),
		mkNode("n3", ineligible()),
		mkNode("n4", draining(true)),
		mkNode("n5", withStatus(structs.NodeStatusDown)),
		mkNode("n6", withStatus(structs.NodeStatusInit)),
		mkNode("n7", withDC("dc3")),
		mkNode("n8", func(n *structs.Node) { n.Drivers["raw_exec"].Healthy = false }),
		mkNode("n9"),
	}}
	plan, res := run(t, st, job)
	placed := placements(st, plan)
	must.Eq(t, []string{"n1", "n2", "n9"}, nodeIDs(placed))
	for _, a := range placed {
		must.Eq(t, "agent.web[0]", a.Name)
	}
	must.False(t, res.Blocked)
	must.MapEmpty(t, res.FailedTGAllocs)

	// Applied, the job is satisfied.
	st.apply(plan)
	plan, _ = run(t, st, job)
	must.True(t, plan.IsNoOp())
}

func TestSystem_NodeTooSmallIsAFailure(t *testing.T) {
	job := mkSystemJob()
	st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{mkNode("n1"), mkNode("n2", withMemMB(100))}}
	plan, res := run(t, st, job)
	must.Eq(t, []string{"n1"}, nodeIDs(placements(st, plan)))
	must.True(t, res.Blocked)
	must.Eq(t, 1, res.QueuedAllocations["web"])
	must.Eq(t, map[string]int{DimensionMemory: 1}, res.FailedTGAllocs["web"].DimensionExhausted)
}

func TestSystem_ExistingAllocs(t *testing.T) {
	cases := []struct {
		name     string
		node     *structs.Node
		status   string
		wantStop string // DesiredDescription, "" for no stop
		lost     bool
		replaced bool // a new alloc is placed on the node
		migrate  bool // the drainer marked the alloc to migrate
	}{
		{name: "running on ready node stays", node: mkNode("n1"), status: structs.AllocClientStatusRunning},
		{name: "drain ignoring system jobs keeps it", node: mkNode("n1", draining(true)), status: structs.AllocClientStatusRunning},
		{name: "drain keeps it until the drainer marks it", node: mkNode("n1", draining(false)), status: structs.AllocClientStatusRunning},
		{name: "drain stops it once marked to migrate", node: mkNode("n1", draining(false)), status: structs.AllocClientStatusRunning, migrate: true, wantStop: AllocDescNodeDraining},
		{name: "ineligible keeps it", node: mkNode("n1", ineligible()), status: structs.AllocClientStatusRunning},
		{name: "down node: lost", node: mkNode("n1", withStatus(structs.NodeStatusDown)), status: structs.AllocClientStatusRunning, wantStop: AllocDescLost, lost: true},
		{name: "datacenter removed", node: mkNode("n1", withDC("dc3")), status: structs.AllocClientStatusRunning, wantStop: AllocDescNotInNodeSet},
		{name: "failed is not replaced", node: mkNode("n1"), status: structs.AllocClientStatusFailed},
		{name: "lost is replaced", node: mkNode("n1"), status: structs.AllocClientStatusLost, replaced: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job := mkSystemJob()
			a := mkAlloc("s1", job, 0, "n1", tc.status)
			if tc.migrate {
				a.DesiredTransition.Migrate = &tc.migrate
			}
			st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{tc.node}, allocs: []*structs.Allocation{a}}
			plan, _ := run(t, st, job)
			got := stops(plan)
			if tc.wantStop == "" {
				must.MapEmpty(t, got)
			} else {
				must.MapLen(t, 1, got)
				must.Eq(t, tc.wantStop, got["s1"].DesiredDescription)
				must.Eq(t, tc.lost, got["s1"].ClientStatus == structs.AllocClientStatusLost)
			}
			must.Eq(t, tc.replaced, len(placements(st, plan)) == 1)
		})
	}
}

func TestSystem_DuplicateOnNodeStopped(t *testing.T) {
	job := mkSystemJob()
	a := mkAlloc("a", job, 0, "n1", structs.AllocClientStatusRunning)
	b := mkAlloc("b", job, 0, "n1", structs.AllocClientStatusRunning)
	b.CreateTime++
	st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{mkNode("n1")}, allocs: []*structs.Allocation{b, a}}
	plan, _ := run(t, st, job)
	got := stops(plan)
	must.MapLen(t, 1, got)
	must.Eq(t, AllocDescDuplicate, got["b"].DesiredDescription)
}
