package scheduler

import (
	"fmt"
	"testing"

	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
)

// running makes n running allocations r0..r{n-1} of job, round-robin on
// nodes.
func running(job *structs.Job, n int, nodes ...string) []*structs.Allocation {
	var out []*structs.Allocation
	for i := 0; i < n; i++ {
		out = append(out, mkAlloc(fmt.Sprintf("r%d", i), job, i, nodes[i%len(nodes)], structs.AllocClientStatusRunning))
	}
	return out
}

func TestReconcile_JobStopOrGone(t *testing.T) {
	for _, gone := range []bool{false, true} {
		t.Run(fmt.Sprintf("gone=%v", gone), func(t *testing.T) {
			job := mkJob("web", structs.JobTypeService, 3)
			allocs := running(job, 3, "n1", "n2")
			allocs[2].ClientStatus = structs.AllocClientStatusPending
			done := mkAlloc("done", job, 0, "n1", structs.AllocClientStatusComplete)
			stopped := mkAlloc("stopped", job, 1, "n1", structs.AllocClientStatusRunning)
			stopped.DesiredStatus = structs.AllocDesiredStatusStop
			allocs = append(allocs, done, stopped)
			st := &fakeState{nodes: []*structs.Node{mkNode("n1"), mkNode("n2")}, allocs: allocs}
			want := AllocDescJobGone
			if !gone {
				stoppedJob := *job
				stoppedJob.Stop = true
				st.jobs = []*structs.Job{&stoppedJob}
				want = AllocDescJobStopped
			}
			plan, res, err := Process(st, mkEval(job), testOpts())
			must.NoError(t, err)
			got := stops(plan)
			must.MapLen(t, 3, got)
			for _, id := range []string{"r0", "r1", "r2"} {
				must.Eq(t, structs.AllocDesiredStatusStop, got[id].DesiredStatus)
				must.Eq(t, want, got[id].DesiredDescription)
			}
			must.MapEmpty(t, plan.NodeAllocation)
			must.False(t, res.Blocked)
			// The stored allocations are not mutated.
			must.Eq(t, structs.AllocDesiredStatusRun, allocs[0].DesiredStatus)
		})
	}
}

func TestReconcile_ScaleKeepsIndexes(t *testing.T) {
	cases := []struct {
		name      string
		count     int
		existing  []int // indexes of running allocs
		wantPlace []string
		wantStop  []string // alloc IDs, by index: r<index>
	}{
		{name: "fresh", count: 3, wantPlace: []string{"web.web[0]", "web.web[1]", "web.web[2]"}},
		{name: "up", count: 4, existing: []int{0, 1}, wantPlace: []string{"web.web[2]", "web.web[3]"}},
		{name: "fill gaps first", count: 4, existing: []int{0, 2, 5}, wantPlace: []string{"web.web[1]"}},
		{name: "down", count: 2, existing: []int{0, 1, 2, 3}, wantStop: []string{"r2", "r3"}},
		{name: "down sparse keeps lowest", count: 2, existing: []int{0, 4, 7}, wantStop: []string{"r7"}},
		{name: "to zero", count: 0, existing: []int{0, 1}, wantStop: []string{"r0", "r1"}},
		{name: "steady", count: 2, existing: []int{0, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job := mkJob("web", structs.JobTypeService, tc.count)
			st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{mkNode("n1"), mkNode("n2")}}
			for _, i := range tc.existing {
				st.allocs = append(st.allocs, mkAlloc(fmt.Sprintf("r%d", i), job, i, "n1", structs.AllocClientStatusRunning))
			}
			plan, res := run(t, st, job)
			must.Eq(t, tc.wantPlace, nilIfEmpty(names(placements(st, plan))))
			var stopped []string
			for id, a := range stops(plan) {
				must.Eq(t, AllocDescNotNeeded, a.DesiredDescription)
				stopped = append(stopped, id)
			}
			must.SliceContainsAll(t, tc.wantStop, stopped)
			must.False(t, res.Blocked)
		})
	}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

func TestReconcile_DuplicateIndexStopped(t *testing.T) {
	job := mkJob("web", structs.JobTypeService, 2)
	a := mkAlloc("a", job, 0, "n1", structs.AllocClientStatusRunning)
	b := mkAlloc("b", job, 0, "n2", structs.AllocClientStatusPending)
	st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{mkNode("n1"), mkNode("n2")}, allocs: []*structs.Allocation{b, a}}
	plan, _ := run(t, st, job)
	got := stops(plan)
	must.MapLen(t, 1, got)
	must.Eq(t, AllocDescDuplicate, got["b"].DesiredDescription)
	must.Eq(t, []string{"web.web[1]"}, names(placements(st, plan)))
}

func TestReconcile_GroupRemovedFromJob(t *testing.T) {
	job := mkJob("web", structs.JobTypeService, 1)
	old := mkAlloc("old", job, 0, "n1", structs.AllocClientStatusRunning)
	old.TaskGroup = "gone"
	old.Name = "web.gone[0]"
	st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{mkNode("n1")}, allocs: []*structs.Allocation{old}}
	plan, _ := run(t, st, job)
	must.Eq(t, AllocDescNotNeeded, stops(plan)["old"].DesiredDescription)
	must.Eq(t, []string{"web.web[0]"}, names(placements(st, plan)))
}

func TestReconcile_CompleteAllocs(t *testing.T) {
	for _, typ := range []string{structs.JobTypeBatch, structs.JobTypeService} {
		t.Run(typ, func(t *testing.T) {
			job := mkJob("web", typ, 2)
			st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{mkNode("n1")}, allocs: []*structs.Allocation{
				mkAlloc("c0", job, 0, "n1", structs.AllocClientStatusComplete),
				mkAlloc("r1", job, 1, "n1", structs.AllocClientStatusRunning),
			}}
			plan, _ := run(t, st, job)
			if typ == structs.JobTypeBatch {
				must.True(t, plan.IsNoOp()) // done batch work is never redone
				return
			}
			must.Eq(t, []string{"web.web[0]"}, names(placements(st, plan)))
		})
	}
}

func TestReconcile_LostAllocsReplaced(t *testing.T) {
	job := mkJob("web", structs.JobTypeService, 3)
	st := &fakeState{
		jobs: []*structs.Job{job},
		nodes: []*structs.Node{
			mkNode("n1", withStatus(structs.NodeStatusDown)),
			mkNode("n2"),
			mkNode("n3", ineligible()), // ineligible nodes keep their allocs
		},
		allocs: []*structs.Allocation{
			mkAlloc("r0", job, 0, "n1", structs.AllocClientStatusRunning),
			mkAlloc("r1", job, 1, "n2", structs.AllocClientStatusRunning),
			mkAlloc("r2", job, 2, "gone-node", structs.AllocClientStatusPending),
			mkAlloc("r3", job, 3, "n3", structs.AllocClientStatusRunning),
		},
	}
	job.TaskGroups[0].Count = 4
	plan, res := run(t, st, job)
	got := stops(plan)
	must.MapLen(t, 2, got)
	for _, id := range []string{"r0", "r2"} {
		must.Eq(t, structs.AllocClientStatusLost, got[id].ClientStatus)
		must.Eq(t, structs.AllocDesiredStatusStop, got[id].DesiredStatus)
		must.Eq(t, AllocDescLost, got[id].DesiredDescription)
	}
	placed := placements(st, plan)
	must.Eq(t, []string{"web.web[0]", "web.web[2]"}, names(placed))
	must.Eq(t, []string{"n2", "n2"}, nodeIDs(placed))
	must.Eq(t, "r0", placed[0].PreviousAllocation)
	must.Eq(t, "r2", placed[1].PreviousAllocation)
	must.Eq(t, placed[0].ID, got["r0"].NextAllocation)
	must.False(t, res.Blocked)

	st.apply(plan)
	plan, _ = run(t, st, job)
	must.True(t, plan.IsNoOp())
}

func TestReconcile_LostReplacementWithoutRoomIsLinkedLater(t *testing.T) {
	job := mkJob("web", structs.JobTypeService, 1)
	st := &fakeState{jobs: []*structs.Job{job},
		nodes:  []*structs.Node{mkNode("n1", withStatus(structs.NodeStatusDown))},
		allocs: []*structs.Allocation{mkAlloc("r0", job, 0, "n1", structs.AllocClientStatusRunning)}}
	plan, res := run(t, st, job)
	must.MapLen(t, 1, stops(plan))
	must.True(t, res.Blocked)
	st.apply(plan)
	st.nodes = append(st.nodes, mkNode("n2"))
	opts := testOpts()
	opts.NewID = idSeq("second")
	plan, res, err := Process(st, mkEval(job), opts)
	must.NoError(t, err)
	placed := placements(st, plan)
	must.Len(t, 1, placed)
	must.Eq(t, "r0", placed[0].PreviousAllocation)
	must.False(t, res.Blocked)
}

func TestReconcile_DrainMigrationHonoursMaxParallel(t *testing.T) {
	for _, maxParallel := range []int{1, 2} {
		t.Run(fmt.Sprintf("max_parallel=%d", maxParallel), func(t *testing.T) {
			job := mkJob("web", structs.JobTypeService, 3)
			job.TaskGroups[0].Migrate.MaxParallel = maxParallel
			st := &fakeState{jobs: []*structs.Job{job},
				nodes: []*structs.Node{mkNode("n1", draining(false)), mkNode("n2"), mkNode("n3")}}
			for _, a := range running(job, 3, "n1") {
				a.DesiredTransition.Migrate = boolPtr(true)
				st.allocs = append(st.allocs, a)
			}
			pass := 0
			process := func() *structs.Plan {
				pass++
				opts := testOpts()
				opts.NewID = idSeq(fmt.Sprintf("pass%d", pass))
				plan, res, err := Process(st, mkEval(job), opts)
				must.NoError(t, err)
				must.False(t, res.Blocked)
				return plan
			}
			setRunning := func(placed []*structs.Allocation) {
				for _, a := range placed {
					c := st.alloc(a.ID).Copy()
					c.ClientStatus = structs.AllocClientStatusRunning
					st.apply(&structs.Plan{NodeAllocation: map[string][]*structs.Allocation{c.NodeID: {c}}})
				}
			}

			migrated := 0
			for migrated < 3 {
				plan := process()
				want := min(maxParallel, 3-migrated)
				got := stops(plan)
				placed := placements(st, plan)
				must.MapLen(t, want, got)
				must.Len(t, want, placed)
				for i, r := range placed {
					old := got[r.PreviousAllocation]
					must.NotNil(t, old)
					must.Eq(t, AllocDescMigrating, old.DesiredDescription)
					must.Eq(t, structs.AllocDesiredStatusStop, old.DesiredStatus)
					must.Eq(t, old.Name, r.Name)
					must.Eq(t, r.ID, old.NextAllocation)
					must.NotEq(t, "n1", r.NodeID)
					must.Eq(t, fmt.Sprintf("web.web[%d]", migrated+i), r.Name) // lowest index first
				}
				st.apply(plan)
				migrated += want

				// While the replacements are pending nothing more moves.
				must.True(t, process().IsNoOp())
				setRunning(placed)
			}
			must.True(t, process().IsNoOp())
		})
	}
}

func TestReconcile_MigrationPendingReplacementOnlyBlocksItsGroup(t *testing.T) {
	job := mkJob("web", structs.JobTypeService, 1)
	api := &structs.TaskGroup{Name: "api", Count: 1, Tasks: job.TaskGroups[0].Tasks,
		Migrate: &structs.MigrateStrategy{MaxParallel: 1}}
	job.TaskGroups = append(job.TaskGroups, api)
	old := mkAlloc("old", job, 0, "n1", structs.AllocClientStatusRunning)
	old.DesiredTransition.Migrate = boolPtr(true)
	old.DesiredStatus = structs.AllocDesiredStatusStop
	repl := mkAlloc("repl", job, 0, "n2", structs.AllocClientStatusPending)
	repl.PreviousAllocation = "old"
	a := mkAlloc("api0", job, 0, "n1", structs.AllocClientStatusRunning)
	a.TaskGroup, a.Name = "api", "web.api[0]"
	a.DesiredTransition.Migrate = boolPtr(true)
	st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{mkNode("n1", draining(false)), mkNode("n2")},
		allocs: []*structs.Allocation{old, repl, a}}
	plan, _ := run(t, st, job)
	must.Eq(t, []string{"web.api[0]"}, names(placements(st, plan)))
}
