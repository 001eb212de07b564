package scheduler

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
)

// busyCluster is a state exercising every path at once: placements,
// scale-down, lost, migration, reschedule now and later.
func busyCluster() (*fakeState, *structs.Job) {
	job := mkJob("web", structs.JobTypeService, 12)
	job.TaskGroups[0].Migrate.MaxParallel = 2
	job.TaskGroups = append(job.TaskGroups, &structs.TaskGroup{
		Name: "cache", Count: 5,
		Tasks: []*structs.Task{{Name: "redis", Driver: "raw_exec", Resources: &structs.Resources{CPU: 250, MemoryMB: 512}}},
		ReschedulePolicy: &structs.ReschedulePolicy{Attempts: 3, Interval: time.Hour, Delay: time.Minute,
			DelayFunction: structs.DelayFunctionFibonacci, MaxDelay: time.Hour},
		Migrate: &structs.MigrateStrategy{MaxParallel: 1},
	})
	st := &fakeState{jobs: []*structs.Job{job}}
	for i := 0; i < 20; i++ {
		var opts []nodeOpt
		switch i % 7 {
		case 3:
			opts = append(opts, withCores(2), withMemMB(2048))
		case 5:
			opts = append(opts, ineligible())
		}
		st.nodes = append(st.nodes, mkNode(fmt.Sprintf("node-%02d", i), opts...))
	}
	st.nodes = append(st.nodes, mkNode("node-down", withStatus(structs.NodeStatusDown)), mkNode("node-drain", draining(false)))
	for i := 0; i < 8; i++ {
		node := []string{"node-down", "node-drain", "node-04", "node-11"}[i%4]
		a := mkAlloc(fmt.Sprintf("w%d", i), job, i, node, structs.AllocClientStatusRunning)
		if node == "node-drain" {
			a.DesiredTransition.Migrate = boolPtr(true)
		}
		st.allocs = append(st.allocs, a)
	}
	for i := 0; i < 3; i++ {
		f := failedAt(fmt.Sprintf("c%d", i), job, i, "node-0"+fmt.Sprint(i), time.Duration(i)*time.Minute)
		f.TaskGroup, f.Name = "cache", structs.AllocName("web", "cache", i)
		f.Resources = &structs.Resources{CPU: 250, MemoryMB: 512}
		st.allocs = append(st.allocs, f)
	}
	extra := mkAlloc("c9", job, 9, "node-06", structs.AllocClientStatusRunning)
	extra.TaskGroup, extra.Name = "cache", structs.AllocName("web", "cache", 9)
	st.allocs = append(st.allocs, extra)
	return st, job
}

func TestProcess_IdenticalInputGivesIdenticalPlans(t *testing.T) {
	st, job := busyCluster()
	process := func(st *fakeState) (*structs.Plan, *Result) {
		plan, res, err := Process(st, mkEval(job), Options{Now: testNow, NewID: idSeq("id")})
		must.NoError(t, err)
		return plan, res
	}
	plan1, res1 := process(st)
	// The scenario covers every kind of change.
	must.MapNotEmpty(t, plan1.NodeUpdate)
	must.MapNotEmpty(t, plan1.NodeAllocation)
	must.NotNil(t, res1.FollowupEval)

	plan2, res2 := process(st)
	must.Eq(t, plan1, plan2)
	must.Eq(t, res1, res2)

	for seed := int64(1); seed <= 20; seed++ {
		shuffled, _ := busyCluster()
		shuffled.shuffle = rand.New(rand.NewSource(seed))
		plan3, res3 := process(shuffled)
		must.Eq(t, plan1, plan3, must.Sprintf("seed %d", seed))
		must.Eq(t, res1, res3, must.Sprintf("seed %d", seed))
	}
}

func TestProcess_InvalidOptions(t *testing.T) {
	st, job := busyCluster()
	_, _, err := Process(st, mkEval(job), Options{NewID: idSeq("x")})
	must.ErrorIs(t, err, ErrInvalidOptions)
	_, _, err = Process(st, mkEval(job), Options{Now: testNow})
	must.ErrorIs(t, err, ErrInvalidOptions)
	job.Type = "sysbatch"
	_, _, err = Process(st, mkEval(job), testOpts())
	must.ErrorIs(t, err, ErrUnknownJobType)
}

func BenchmarkPlace1000On100(b *testing.B) {
	job := mkJob("web", structs.JobTypeService, 1000)
	job.TaskGroups[0].Tasks[0].Resources = &structs.Resources{CPU: 100, MemoryMB: 64}
	st := &fakeState{jobs: []*structs.Job{job}}
	for i := 0; i < 100; i++ {
		st.nodes = append(st.nodes, mkNode(fmt.Sprintf("node-%03d", i), withCores(16), withMemMB(65536)))
	}
	eval := mkEval(job)
	b.ResetTimer()
	placed := 0
	for i := 0; i < b.N; i++ {
		plan, res, err := Process(st, eval, Options{Now: testNow, NewID: idSeq("id")})
		if err != nil || res.Blocked {
			b.Fatalf("err=%v blocked=%v", err, res.Blocked)
		}
		for _, l := range plan.NodeAllocation {
			placed += len(l)
		}
	}
	b.ReportMetric(float64(placed)/b.Elapsed().Seconds(), "placements/s")
}
