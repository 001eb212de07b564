package nomad

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// The drain's decisions, one pass at a time, as a function of what the
// store holds and of the clock.

var (
	planT0    = time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	planGrace = time.Minute

	webJob    = &structs.Job{Namespace: structs.DefaultNamespace, ID: "web", Type: structs.JobTypeService}
	batchJob  = &structs.Job{Namespace: structs.DefaultNamespace, ID: "batch", Type: structs.JobTypeBatch}
	pluginJob = &structs.Job{Namespace: structs.DefaultNamespace, ID: "plugin", Type: structs.JobTypeSystem}
)

// planAlloc is a running allocation of job on the draining node.
func planAlloc(id string, job *structs.Job, opts ...func(*structs.Allocation)) *structs.Allocation {
	a := &structs.Allocation{
		ID: id, Namespace: job.Namespace, JobID: job.ID, Job: job, NodeID: "n1",
		DesiredStatus: structs.AllocDesiredStatusRun,
		ClientStatus:  structs.AllocClientStatusRunning,
		ModifyTime:    planT0.Add(-time.Hour).UnixNano(),
	}
	for _, o := range opts {
		o(a)
	}
	return a
}

func clientStatus(s string) func(*structs.Allocation) {
	return func(a *structs.Allocation) { a.ClientStatus = s }
}

func desiredStop(a *structs.Allocation) {
	a.DesiredStatus = structs.AllocDesiredStatusStop
	a.DesiredDescription = "alloc not needed"
}

func markedMigrate(a *structs.Allocation) {
	t := true
	a.DesiredTransition.Migrate = &t
}

// stoppedAt is a as a forced drain stopping it at now writes it.
func stoppedAt(a *structs.Allocation, now time.Time) *structs.Allocation {
	c := a.Copy()
	c.DesiredStatus = structs.AllocDesiredStatusStop
	c.DesiredDescription = "alloc stopped: node drain reached its deadline"
	c.ModifyTime = now.UnixNano()
	t := true
	c.DesiredTransition.Migrate = &t
	return c
}

// drainWithin is a drain started at planT0 with a deadline of d.
func drainWithin(d time.Duration) *structs.DrainStrategy {
	return &structs.DrainStrategy{DrainSpec: structs.DrainSpec{Deadline: d}, StartedAt: planT0, ForceDeadline: planT0.Add(d)}
}

// drainForcedNow is a drain forced from its start at planT0.
func drainForcedNow() *structs.DrainStrategy {
	return &structs.DrainStrategy{DrainSpec: structs.DrainSpec{Deadline: -1}, StartedAt: planT0}
}

func TestPlanDrain(t *testing.T) {
	var (
		web1     = planAlloc("web-1", webJob)
		web2     = planAlloc("web-2", webJob)
		webMoved = planAlloc("web-3", webJob, markedMigrate)
		webGoing = planAlloc("web-4", webJob, desiredStop)
		webDone  = planAlloc("web-5", webJob, desiredStop, clientStatus(structs.AllocClientStatusComplete))
		batch1   = planAlloc("batch-1", batchJob)
		sys      = planAlloc("sys-1", pluginJob)
		sysGoing = planAlloc("sys-2", pluginJob, desiredStop)
		sysDone  = planAlloc("sys-3", pluginJob, clientStatus(structs.AllocClientStatusComplete))

		// webV2 is web as the store has it now, registered again since
		// its allocations were placed.
		webV2 = &structs.Job{Namespace: structs.DefaultNamespace, ID: "web", Type: structs.JobTypeService, Priority: 70}

		webClaim = drainClaim{VolumeID: "data", AllocID: webDone.ID}
		sysClaim = drainClaim{VolumeID: "own", AllocID: sys.ID}

		forcedAfterGrace = planT0.Add(planGrace + time.Nanosecond)
	)

	cases := []struct {
		name     string
		strategy *structs.DrainStrategy
		allocs   []*structs.Allocation
		jobs     map[jobKey]*structs.Job
		claims   []drainClaim
		now      time.Time
		want     drainPlan
	}{
		{
			name:     "plain drain marks every live allocation for migration",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{web1, web2},
			now:      planT0,
			want:     drainPlan{Migrate: []string{"web-1", "web-2"}, Evaluate: []*structs.Job{webJob}},
		},
		{
			name:     "allocations already marked are left to the scheduler",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{web1, webMoved},
			now:      planT0,
			want:     drainPlan{Migrate: []string{"web-1"}, Evaluate: []*structs.Job{webJob}},
		},
		{
			name:     "nothing to write while marked allocations move",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{webMoved},
			now:      planT0,
			want:     drainPlan{},
		},
		{
			name:     "just before the deadline allocations still migrate",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{web1, webMoved},
			now:      planT0.Add(time.Hour - time.Nanosecond),
			want:     drainPlan{Migrate: []string{"web-1"}, Evaluate: []*structs.Job{webJob}},
		},
		{
			name:     "at the deadline every non-system allocation is stopped, marked or not",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{web1, webMoved, webGoing, sys},
			now:      planT0.Add(time.Hour),
			want: drainPlan{
				Stop:     []*structs.Allocation{stoppedAt(web1, planT0.Add(time.Hour)), stoppedAt(webMoved, planT0.Add(time.Hour))},
				Evaluate: []*structs.Job{webJob},
				System:   systemWaitAllocs,
			},
		},
		{
			name:     "a negative deadline stops everything from the start",
			strategy: drainForcedNow(),
			allocs:   []*structs.Allocation{web1, batch1},
			now:      planT0,
			want: drainPlan{
				Stop:     []*structs.Allocation{stoppedAt(web1, planT0), stoppedAt(batch1, planT0)},
				Evaluate: []*structs.Job{batchJob, webJob},
			},
		},
		{
			name:     "system allocations wait while a service allocation still runs",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{webMoved, sys},
			now:      planT0,
			want:     drainPlan{System: systemWaitAllocs},
		},
		{
			// The servers asked web-4 to stop, but its task may still be
			// inside its kill timeout with its volume mounted: the node's
			// plugin must stay for it.
			name:     "system allocations wait while a stopped service allocation's client still runs it",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{webGoing, sys},
			now:      planT0,
			want:     drainPlan{System: systemWaitAllocs},
		},
		{
			name:     "a forced drain past its claim grace still waits for a running allocation",
			strategy: drainForcedNow(),
			allocs:   []*structs.Allocation{webGoing, sys},
			claims:   []drainClaim{{VolumeID: "data", AllocID: webGoing.ID}},
			now:      forcedAfterGrace,
			want:     drainPlan{System: systemWaitAllocs},
		},
		{
			name:     "system allocations wait while another allocation's claim names the node",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{webDone, sys},
			claims:   []drainClaim{webClaim, sysClaim},
			now:      planT0,
			want:     drainPlan{System: systemWaitClaims, ClaimVolumes: []string{"data"}},
		},
		{
			name:     "a claim of a client-terminal system allocation holds the live ones",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{sysDone, sys},
			claims:   []drainClaim{{VolumeID: "old", AllocID: sysDone.ID}},
			now:      planT0,
			want:     drainPlan{System: systemWaitClaims, ClaimVolumes: []string{"old"}},
		},
		{
			name:     "each held volume is named once, sorted",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{sys},
			claims: []drainClaim{
				{VolumeID: "b", AllocID: "x"}, {VolumeID: "a", AllocID: "x"}, {VolumeID: "b", AllocID: "y"},
			},
			now:  planT0,
			want: drainPlan{System: systemWaitClaims, ClaimVolumes: []string{"a", "b"}},
		},
		{
			name:     "system allocations go once the claims are gone",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{webDone, sys},
			now:      planT0,
			want:     drainPlan{Migrate: []string{"sys-1"}, Evaluate: []*structs.Job{pluginJob}, System: systemDrain},
		},
		{
			name:     "system allocations' own claims do not hold them",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{webDone, sys},
			claims:   []drainClaim{sysClaim},
			now:      planT0,
			want:     drainPlan{Migrate: []string{"sys-1"}, Evaluate: []*structs.Job{pluginJob}, System: systemDrain},
		},
		{
			name:     "past the deadline system allocations are stopped once claims are gone",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{webDone, sys},
			now:      planT0.Add(time.Hour),
			want: drainPlan{
				Stop:     []*structs.Allocation{stoppedAt(sys, planT0.Add(time.Hour))},
				Evaluate: []*structs.Job{pluginJob},
				System:   systemDrain,
			},
		},
		{
			name:     "a forced drain holds system allocations for claims until its grace is over",
			strategy: drainForcedNow(),
			allocs:   []*structs.Allocation{webDone, sys},
			claims:   []drainClaim{webClaim},
			now:      planT0.Add(planGrace),
			want:     drainPlan{System: systemWaitClaims, ClaimVolumes: []string{"data"}},
		},
		{
			name:     "a forced drain past its grace stops system allocations despite claims",
			strategy: drainForcedNow(),
			allocs:   []*structs.Allocation{webDone, sys},
			claims:   []drainClaim{webClaim},
			now:      forcedAfterGrace,
			want: drainPlan{
				Stop:         []*structs.Allocation{stoppedAt(sys, forcedAfterGrace)},
				Evaluate:     []*structs.Job{pluginJob},
				System:       systemForced,
				ClaimVolumes: []string{"data"},
			},
		},
		{
			// The grace runs from when the drain began forcing, its
			// deadline, not from its start.
			name:     "a drain forced by its deadline counts the grace from the deadline",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{webDone, sys},
			claims:   []drainClaim{webClaim},
			now:      planT0.Add(time.Hour + planGrace),
			want:     drainPlan{System: systemWaitClaims, ClaimVolumes: []string{"data"}},
		},
		{
			name:     "a drain forced by its deadline stops system allocations past deadline plus grace",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{webDone, sys},
			claims:   []drainClaim{webClaim},
			now:      planT0.Add(time.Hour + planGrace + time.Nanosecond),
			want: drainPlan{
				Stop:         []*structs.Allocation{stoppedAt(sys, planT0.Add(time.Hour+planGrace+time.Nanosecond))},
				Evaluate:     []*structs.Job{pluginJob},
				System:       systemForced,
				ClaimVolumes: []string{"data"},
			},
		},
		{
			name:     "an unforced drain never stops system allocations despite claims",
			strategy: &structs.DrainStrategy{StartedAt: planT0},
			allocs:   []*structs.Allocation{webDone, sys},
			claims:   []drainClaim{webClaim},
			now:      planT0.Add(24 * time.Hour),
			want:     drainPlan{System: systemWaitClaims, ClaimVolumes: []string{"data"}},
		},
		{
			name:     "a stopping system allocation is waited for, not stopped again",
			strategy: drainForcedNow(),
			allocs:   []*structs.Allocation{webDone, sysGoing},
			now:      planT0,
			want:     drainPlan{System: systemDrain},
		},
		{
			name: "ignored system allocations stay and the drain completes",
			strategy: &structs.DrainStrategy{DrainSpec: structs.DrainSpec{Deadline: time.Hour, IgnoreSystemJobs: true},
				StartedAt: planT0, ForceDeadline: planT0.Add(time.Hour)},
			allocs: []*structs.Allocation{webDone, sys},
			claims: []drainClaim{webClaim},
			now:    planT0,
			want:   drainPlan{Complete: true},
		},
		{
			name:     "ignored system allocations stay through a forced drain",
			strategy: &structs.DrainStrategy{DrainSpec: structs.DrainSpec{Deadline: -1, IgnoreSystemJobs: true}, StartedAt: planT0},
			allocs:   []*structs.Allocation{web1, sys},
			now:      forcedAfterGrace,
			want:     drainPlan{Stop: []*structs.Allocation{stoppedAt(web1, forcedAfterGrace)}, Evaluate: []*structs.Job{webJob}},
		},
		{
			name:     "the drain completes when nothing is left",
			strategy: drainWithin(time.Hour),
			now:      planT0,
			want:     drainPlan{Complete: true},
		},
		{
			name:     "client-terminal allocations are ignored, whatever the servers want",
			strategy: drainForcedNow(),
			allocs: []*structs.Allocation{
				webDone,
				planAlloc("web-6", webJob, clientStatus(structs.AllocClientStatusFailed)),
				planAlloc("web-7", webJob, clientStatus(structs.AllocClientStatusLost)),
				sysDone,
			},
			now:  planT0,
			want: drainPlan{Complete: true},
		},
		{
			name:     "one evaluation per job, of the job as the store has it now",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{web1, batch1, web2, planAlloc("batch-2", batchJob)},
			jobs:     map[jobKey]*structs.Job{{structs.DefaultNamespace, "web"}: webV2},
			now:      planT0,
			want: drainPlan{
				Migrate:  []string{"web-1", "batch-1", "web-2", "batch-2"},
				Evaluate: []*structs.Job{batchJob, webV2},
			},
		},
		{
			name:     "no evaluation for an allocation left alone",
			strategy: drainWithin(time.Hour),
			allocs:   []*structs.Allocation{web1, planAlloc("batch-2", batchJob, markedMigrate)},
			now:      planT0,
			want:     drainPlan{Migrate: []string{"web-1"}, Evaluate: []*structs.Job{webJob}},
		},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := drainInput{
				Strategy:   tc.strategy,
				Allocs:     tc.allocs,
				Jobs:       tc.jobs,
				Claims:     tc.claims,
				ClaimGrace: planGrace,
				Now:        tc.now,
			}
			before := copyAllocs(tc.allocs)

			got := planDrain(in)

			must.Eq(t, tc.want, got)
			must.Eq(t, before, copyAllocs(tc.allocs), must.Sprint("planDrain changed its input"))
		})
	}
}

func copyAllocs(allocs []*structs.Allocation) []*structs.Allocation {
	out := make([]*structs.Allocation, 0, len(allocs))
	for _, a := range allocs {
		c := a.Copy()
		if m := a.DesiredTransition.Migrate; m != nil {
			v := *m
			c.DesiredTransition.Migrate = &v
		}
		out = append(out, c)
	}
	return out
}
