package scheduler

import (
	"testing"
	"time"

	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
)

func TestRescheduleDelay(t *testing.T) {
	const s = time.Second
	cases := []struct {
		fn    string
		delay time.Duration
		max   time.Duration
		want  []time.Duration // by n = 0, 1, 2, …
	}{
		{structs.DelayFunctionConstant, 5 * s, 0, []time.Duration{5 * s, 5 * s, 5 * s, 5 * s}},
		{structs.DelayFunctionConstant, 5 * s, 2 * s, []time.Duration{5 * s, 5 * s}}, // max_delay applies to growth only
		{structs.DelayFunctionExponential, 5 * s, time.Minute, []time.Duration{5 * s, 10 * s, 20 * s, 40 * s, time.Minute, time.Minute}},
		{structs.DelayFunctionExponential, 30 * s, 0, []time.Duration{30 * s, 60 * s, 120 * s, 240 * s}},
		{structs.DelayFunctionFibonacci, 5 * s, time.Minute, []time.Duration{5 * s, 5 * s, 10 * s, 15 * s, 25 * s, 40 * s, time.Minute, time.Minute}},
		{structs.DelayFunctionFibonacci, 1 * s, 0, []time.Duration{s, s, 2 * s, 3 * s, 5 * s, 8 * s, 13 * s}},
		{"", 7 * s, 0, []time.Duration{7 * s, 7 * s}},
		{structs.DelayFunctionExponential, 0, time.Minute, []time.Duration{0, 0}},
	}
	for _, tc := range cases {
		p := &structs.ReschedulePolicy{Delay: tc.delay, DelayFunction: tc.fn, MaxDelay: tc.max}
		for n, want := range tc.want {
			must.Eq(t, want, rescheduleDelay(p, n), must.Sprintf("%s delay=%s max=%s n=%d", tc.fn, tc.delay, tc.max, n))
		}
	}
	// Growth saturates instead of overflowing.
	huge := &structs.ReschedulePolicy{Delay: time.Hour, DelayFunction: structs.DelayFunctionExponential}
	must.Positive(t, rescheduleDelay(huge, 200))
	fib := &structs.ReschedulePolicy{Delay: time.Hour, DelayFunction: structs.DelayFunctionFibonacci}
	must.Positive(t, rescheduleDelay(fib, 500))
}

// events builds n reschedule events, the i-th at testNow - ago[i].
func events(prevNode string, ago ...time.Duration) *structs.RescheduleTracker {
	tr := &structs.RescheduleTracker{}
	for i, d := range ago {
		tr.Events = append(tr.Events, &structs.RescheduleEvent{
			RescheduleTime: testNow.Add(-d).UnixNano(), PrevAllocID: "older", PrevNodeID: prevNode, Delay: time.Duration(i) * time.Second,
		})
	}
	return tr
}

// failedAt is a failed allocation whose task finished at testNow - ago.
func failedAt(id string, job *structs.Job, idx int, node string, ago time.Duration) *structs.Allocation {
	a := mkAlloc(id, job, idx, node, structs.AllocClientStatusFailed)
	a.TaskStates = map[string]*structs.TaskState{
		"server": {State: structs.TaskStateDead, Failed: true, FinishedAt: testNow.Add(-ago)},
	}
	return a
}

func TestReschedule_Decisions(t *testing.T) {
	const m = time.Minute
	cases := []struct {
		name       string
		policy     *structs.ReschedulePolicy
		tracker    *structs.RescheduleTracker
		failedAgo  time.Duration
		transition structs.DesiredTransition
		want       rescheduleKind
		wantAt     time.Time
	}{
		{name: "no policy", policy: nil, failedAgo: m, want: rescheduleNone},
		{name: "first attempt after delay",
			policy:    &structs.ReschedulePolicy{Attempts: 2, Interval: time.Hour, Delay: 30 * time.Second, DelayFunction: "constant"},
			failedAgo: m, want: rescheduleNow},
		{name: "first attempt before delay",
			policy:    &structs.ReschedulePolicy{Attempts: 2, Interval: time.Hour, Delay: 5 * m, DelayFunction: "constant"},
			failedAgo: m, want: rescheduleLater, wantAt: testNow.Add(4 * m)},
		{name: "attempts exhausted within interval",
			policy:  &structs.ReschedulePolicy{Attempts: 2, Interval: time.Hour, Delay: time.Second, DelayFunction: "constant"},
			tracker: events("n0", 50*m, 10*m), failedAgo: m, want: rescheduleNone},
		{name: "old attempts fall out of the interval",
			policy:  &structs.ReschedulePolicy{Attempts: 2, Interval: time.Hour, Delay: time.Second, DelayFunction: "constant"},
			tracker: events("n0", 3*time.Hour, 10*m), failedAgo: m, want: rescheduleNow},
		{name: "zero interval counts every attempt",
			policy:  &structs.ReschedulePolicy{Attempts: 2, Delay: time.Second, DelayFunction: "constant"},
			tracker: events("n0", 300*time.Hour, 200*time.Hour), failedAgo: m, want: rescheduleNone},
		{name: "zero attempts never reschedules",
			policy:    &structs.ReschedulePolicy{Attempts: 0, Interval: time.Hour, Delay: time.Second, DelayFunction: "constant"},
			failedAgo: m, want: rescheduleNone},
		{name: "unlimited ignores attempts",
			policy:  &structs.ReschedulePolicy{Unlimited: true, Delay: time.Second, DelayFunction: "exponential", MaxDelay: time.Hour},
			tracker: events("n0", 9*m, 8*m, 7*m, 6*m, 5*m), failedAgo: m, want: rescheduleNow},
		{name: "delay grows with history",
			policy:  &structs.ReschedulePolicy{Unlimited: true, Delay: time.Minute, DelayFunction: "exponential", MaxDelay: time.Hour},
			tracker: events("n0", 9*m, 8*m), failedAgo: m, want: rescheduleLater, wantAt: testNow.Add(3 * m)}, // 4m after failing
		{name: "reschedule transition skips the delay",
			policy:    &structs.ReschedulePolicy{Attempts: 1, Interval: time.Hour, Delay: time.Hour, DelayFunction: "constant"},
			failedAgo: m, transition: structs.DesiredTransition{Reschedule: boolPtr(true)}, want: rescheduleNow},
		{name: "reschedule transition respects attempts",
			policy:  &structs.ReschedulePolicy{Attempts: 1, Interval: time.Hour, Delay: time.Hour, DelayFunction: "constant"},
			tracker: events("n0", 5*m), failedAgo: m, transition: structs.DesiredTransition{Reschedule: boolPtr(true)}, want: rescheduleNone},
		{name: "force reschedule ignores attempts",
			policy:  &structs.ReschedulePolicy{Attempts: 1, Interval: time.Hour, Delay: time.Hour, DelayFunction: "constant"},
			tracker: events("n0", 5*m), failedAgo: m, transition: structs.DesiredTransition{ForceReschedule: boolPtr(true)}, want: rescheduleNow},
	}
	job := mkJob("web", structs.JobTypeService, 1)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := failedAt("f1", job, 0, "n1", tc.failedAgo)
			a.RescheduleTracker = tc.tracker
			a.DesiredTransition = tc.transition
			kind, at, _ := decideReschedule(a, tc.policy, testNow)
			must.Eq(t, tc.want, kind)
			if tc.want == rescheduleLater {
				must.Eq(t, tc.wantAt, at)
			}
		})
	}
}

func TestFailTime(t *testing.T) {
	job := mkJob("web", structs.JobTypeService, 1)
	a := mkAlloc("a", job, 0, "n1", structs.AllocClientStatusFailed)
	must.Eq(t, time.Unix(0, a.ModifyTime), failTime(a))
	a.TaskStates = map[string]*structs.TaskState{
		"x": {FinishedAt: testNow.Add(-3 * time.Minute)},
		"y": {FinishedAt: testNow.Add(-2 * time.Minute)},
		"z": {},
	}
	must.Eq(t, testNow.Add(-2*time.Minute), failTime(a))
}

func TestReschedule_ReplacesAndAvoidsFailedNode(t *testing.T) {
	cases := []struct {
		name  string
		nodes []*structs.Node
		want  string
	}{
		// n1 would win on node ID; the failed node is penalised.
		{name: "other node fits", nodes: []*structs.Node{mkNode("n1"), mkNode("n2")}, want: "n2"},
		// An earlier failure on n2 penalises it too.
		{name: "history penalises", nodes: []*structs.Node{mkNode("n1"), mkNode("n2"), mkNode("n3")}, want: "n3"},
		{name: "only the failed node", nodes: []*structs.Node{mkNode("n1"), mkNode("n2", withCores(0))}, want: "n1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job := mkJob("web", structs.JobTypeService, 1)
			job.TaskGroups[0].ReschedulePolicy = &structs.ReschedulePolicy{
				Attempts: 3, Interval: time.Hour, Delay: 10 * time.Second, DelayFunction: structs.DelayFunctionConstant,
			}
			f := failedAt("f1", job, 0, "n1", time.Minute)
			if tc.name == "history penalises" {
				f.RescheduleTracker = events("n2", 10*time.Minute)
			}
			st := &fakeState{jobs: []*structs.Job{job}, nodes: tc.nodes, allocs: []*structs.Allocation{f}}
			plan, res := run(t, st, job)
			placed := placements(st, plan)
			must.Len(t, 1, placed)
			r := placed[0]
			must.Eq(t, tc.want, r.NodeID)
			must.Eq(t, "web.web[0]", r.Name)
			must.Eq(t, "f1", r.PreviousAllocation)
			must.NotNil(t, r.RescheduleTracker)
			last := r.RescheduleTracker.Events[len(r.RescheduleTracker.Events)-1]
			must.Eq(t, &structs.RescheduleEvent{
				RescheduleTime: testNow.UnixNano(), PrevAllocID: "f1", PrevNodeID: "n1", Delay: 10 * time.Second,
			}, last)
			// The failed alloc is updated in place to name its successor.
			up := updates(st, plan)["f1"]
			must.NotNil(t, up)
			must.Eq(t, r.ID, up.NextAllocation)
			must.Eq(t, structs.AllocClientStatusFailed, up.ClientStatus)
			must.Eq(t, structs.AllocDesiredStatusRun, up.DesiredStatus)
			must.MapEmpty(t, plan.NodeUpdate)
			must.Nil(t, res.FollowupEval)

			// Once applied, the failed alloc is not rescheduled again.
			st.apply(plan)
			plan, _ = run(t, st, job)
			must.True(t, plan.IsNoOp())
		})
	}
}

func TestReschedule_ExhaustedLeavesFailed(t *testing.T) {
	job := mkJob("web", structs.JobTypeBatch, 2)
	job.TaskGroups[0].ReschedulePolicy = &structs.ReschedulePolicy{
		Attempts: 1, Interval: time.Hour, Delay: time.Second, DelayFunction: structs.DelayFunctionConstant,
	}
	f := failedAt("f1", job, 1, "n1", time.Minute)
	f.RescheduleTracker = events("n0", 30*time.Minute)
	st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{mkNode("n1")}, allocs: []*structs.Allocation{
		mkAlloc("r0", job, 0, "n1", structs.AllocClientStatusRunning), f,
	}}
	plan, res := run(t, st, job)
	must.True(t, plan.IsNoOp()) // index 1 stays with the failed alloc
	must.False(t, res.Blocked)
	must.Nil(t, res.FollowupEval)
}

func TestReschedule_UnlimitedKeepsReplacing(t *testing.T) {
	job := mkJob("web", structs.JobTypeService, 1)
	job.TaskGroups[0].ReschedulePolicy = &structs.ReschedulePolicy{
		Unlimited: true, Delay: time.Second, DelayFunction: structs.DelayFunctionConstant,
	}
	st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{mkNode("n1"), mkNode("n2")}}
	plan, _ := run(t, st, job)
	st.apply(plan)
	for round := 1; round <= 25; round++ {
		// Fail the live alloc, then reschedule it.
		var live *structs.Allocation
		for _, a := range st.allocs {
			if !a.TerminalStatus() {
				live = a
			}
		}
		must.NotNil(t, live)
		failed := live.Copy()
		failed.ClientStatus = structs.AllocClientStatusFailed
		failed.ModifyTime = testNow.Add(-time.Minute).UnixNano()
		st.apply(&structs.Plan{NodeAllocation: map[string][]*structs.Allocation{failed.NodeID: {failed}}})
		opts := testOpts()
		opts.NewID = idSeq("round" + string(rune('a'+round)))
		plan, res, err := Process(st, mkEval(job), opts)
		must.NoError(t, err)
		placed := placements(st, plan)
		must.Len(t, 1, placed, must.Sprintf("round %d", round))
		must.Len(t, round, placed[0].RescheduleTracker.Events)
		must.NotEq(t, failed.NodeID, placed[0].NodeID) // alternates between the nodes
		must.Nil(t, res.FollowupEval)
		st.apply(plan)
	}
}

func TestReschedule_DelayedCreatesFollowup(t *testing.T) {
	job := mkJob("web", structs.JobTypeService, 2)
	job.TaskGroups[0].ReschedulePolicy = &structs.ReschedulePolicy{
		Unlimited: true, Delay: 30 * time.Second, DelayFunction: structs.DelayFunctionExponential, MaxDelay: time.Hour,
	}
	f0 := failedAt("f0", job, 0, "n1", 10*time.Second) // due at +20s
	f1 := failedAt("f1", job, 1, "n1", 5*time.Second)
	f1.RescheduleTracker = events("n2", 10*time.Minute) // delay 60s: due at +55s
	st := &fakeState{jobs: []*structs.Job{job}, nodes: []*structs.Node{mkNode("n1"), mkNode("n2")},
		allocs: []*structs.Allocation{f0, f1}}
	plan, res := run(t, st, job)
	must.Len(t, 0, placements(st, plan))
	must.False(t, res.Blocked)
	fu := res.FollowupEval
	must.NotNil(t, fu)
	must.Eq(t, testNow.Add(20*time.Second), fu.WaitUntil)
	must.Eq(t, structs.EvalTriggerRetryFailedAlloc, fu.TriggeredBy)
	must.Eq(t, structs.EvalStatusPending, fu.Status)
	must.Eq(t, "eval-1", fu.PreviousEval)
	must.Eq(t, job.ID, fu.JobID)
	ups := updates(st, plan)
	must.Eq(t, fu.ID, ups["f0"].FollowupEvalID)
	must.Eq(t, fu.ID, ups["f1"].FollowupEvalID)
	must.Eq(t, "", ups["f0"].NextAllocation)

	// Another evaluation before the delay changes nothing and makes no
	// second follow-up.
	st.apply(plan)
	plan, res = run(t, st, job)
	must.True(t, plan.IsNoOp())
	must.Nil(t, res.FollowupEval)

	// The follow-up runs at WaitUntil: f0 is replaced, f1 gets a new
	// follow-up at its own time.
	opts := Options{Now: fu.WaitUntil, NewID: idSeq("later")}
	plan, res, err := Process(st, fu, opts)
	must.NoError(t, err)
	placed := placements(st, plan)
	must.Eq(t, []string{"web.web[0]"}, names(placed))
	must.Eq(t, "f0", placed[0].PreviousAllocation)
	must.NotNil(t, res.FollowupEval)
	must.Eq(t, testNow.Add(55*time.Second), res.FollowupEval.WaitUntil)
	must.Eq(t, res.FollowupEval.ID, updates(st, plan)["f1"].FollowupEvalID)
}
