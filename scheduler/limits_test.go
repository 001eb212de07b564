package scheduler

import (
	"runtime"
	"testing"

	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
)

// A stored job over the limits is not placed: Process fails at once,
// allocating nothing in proportion to its count. A stopped one is still
// stopped.
func TestProcess_RefusesJobOverLimits(t *testing.T) {
	job := mkJob("huge", structs.JobTypeService, 1<<62)
	st := &fakeState{nodes: []*structs.Node{mkNode("n1")}, jobs: []*structs.Job{job}}

	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	plan, _, err := Process(st, mkEval(job), testOpts())
	runtime.ReadMemStats(&m1)
	must.Nil(t, plan)
	must.ErrorIs(t, err, structs.ErrJobTooLarge)
	must.StrContains(t, err.Error(), `job "huge" is not scheduled: job exceeds limits: group "web": count 4611686018427387904 is more than group_max_count = 10000`)
	must.Less(t, uint64(1<<20), m1.TotalAlloc-m0.TotalAlloc)

	// The limits are the caller's: raised, the same count of 20000 places.
	job.TaskGroups[0].Count = 20000
	opts := testOpts()
	_, _, err = Process(st, mkEval(job), opts)
	must.ErrorIs(t, err, structs.ErrJobTooLarge)
	l := structs.DefaultJobLimits()
	l.GroupMaxCount, l.MaxAllocs = 20000, 20000
	opts.Limits = &l
	plan, _, err = Process(st, mkEval(job), opts)
	must.NoError(t, err)
	must.NotNil(t, plan)

	job.TaskGroups[0].Count = 1 << 62
	running := mkAlloc("r0", job, 0, "n1", structs.AllocClientStatusRunning)
	st.allocs = []*structs.Allocation{running}
	job.Stop = true
	plan, _, err = Process(st, mkEval(job), testOpts())
	must.NoError(t, err)
	must.MapLen(t, 1, stops(plan))
}
