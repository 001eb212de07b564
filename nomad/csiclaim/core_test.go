package csiclaim

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

var t0 = time.Unix(1_700_000_000, 0)

const publishTimeout = 2 * time.Minute

// event names one situation the claim's world can be in when a walk
// starts, in the style of the external-attacher's controller tests.
type event string

const (
	evRunning       event = "task still running"
	evStopRequested event = "servers asked the task to stop; it still runs"
	evExited        event = "task exited"
	evAllocGone     event = "allocation gone"
	evNodeDown      event = "node down"
	evNodeGone      event = "node gone"
	evNodeReleased  event = "node released the volume itself"
	evPluginAbsent  event = "plugin absent"
	evNoController  event = "plugin needs no controller"
	evRetryable     event = "first call failed, retryable"
	evFinal         event = "first call failed, final"
	evUnknown       event = "first call's outcome unknown"
	evPublishStale  event = "claim left in publishing past its timeout"
	evSibling       event = "one task failed; a sibling task still runs"
	// evStampOld: the claim's stored stamp is an hour old, as after the
	// wall clock stepped forward or on a leader whose clock runs ahead;
	// this server has seen it in publishing for a second only.
	evStampOld event = "stored stamp an hour old, seen for a second"
)

var releaseEvents = []event{evRunning, evStopRequested, evExited, evAllocGone, evNodeDown, evNodeGone,
	evNodeReleased, evPluginAbsent, evNoController, evRetryable, evFinal, evUnknown, evPublishStale, evSibling, evStampOld}

var claimEvents = []event{evRunning, evStopRequested, evExited, evAllocGone, evNodeDown, evNodeGone,
	evPluginAbsent, evNoController, evRetryable, evFinal, evUnknown}

// world builds the Input for a claim in state st (Freed: no claim) under
// ev, and the result the first call gets.
func world(goal Goal, st structs.CSIClaimState, ev event) (Input, Result) {
	alloc := &structs.Allocation{ID: "alloc-1", NodeID: "node-1",
		DesiredStatus: structs.AllocDesiredStatusRun, ClientStatus: structs.AllocClientStatusRunning}
	node := &structs.Node{ID: "node-1", Status: structs.NodeStatusReady}
	plugin := &structs.CSIPlugin{ID: "hostpath", ControllerRequired: true}
	in := Input{Goal: goal, Alloc: alloc, Node: node, PluginID: "hostpath", Plugin: plugin,
		PublishingFor: time.Second, PublishTimeout: publishTimeout}
	if st != structs.CSIVolumeClaimStateFreed {
		in.Claim = &structs.CSIVolumeClaim{AllocationID: alloc.ID, NodeID: node.ID, State: st,
			Mode: structs.CSIVolumeClaimWrite, UpdatedAt: t0.Add(-time.Second).UnixNano()}
	}
	first := ResultOK
	switch ev {
	case evRunning:
	case evStopRequested:
		alloc.DesiredStatus = structs.AllocDesiredStatusStop
	case evExited:
		alloc.ClientStatus = structs.AllocClientStatusComplete
	case evAllocGone:
		in.Alloc = nil
	case evNodeDown:
		node.Status = structs.NodeStatusDown
	case evNodeGone:
		in.Node = nil
	case evNodeReleased:
		in.NodeReleased = true
	case evPluginAbsent:
		if goal == GoalRelease {
			alloc.ClientStatus = structs.AllocClientStatusComplete
		}
		in.Plugin = nil
	case evNoController:
		if goal == GoalRelease {
			alloc.ClientStatus = structs.AllocClientStatusComplete
		}
		plugin.ControllerRequired = false
	case evRetryable, evFinal, evUnknown:
		if goal == GoalRelease {
			alloc.ClientStatus = structs.AllocClientStatusComplete
		}
		first = map[event]Result{evRetryable: ResultRetryable, evFinal: ResultFinal, evUnknown: ResultUnknown}[ev]
	case evSibling:
		alloc.ClientStatus = structs.AllocClientStatusFailed
		alloc.TaskStates = map[string]*structs.TaskState{
			"sidecar": {State: structs.TaskStateDead, Failed: true},
			"writer":  {State: structs.TaskStateRunning},
		}
	case evPublishStale:
		in.PublishingFor = publishTimeout + time.Second
	case evStampOld:
		if in.Claim != nil {
			in.Claim.UpdatedAt = t0.Add(-time.Hour).UnixNano()
		}
	default:
		panic("unknown event " + ev)
	}
	return in, first
}

// drive carries out Next's steps the way the leader does: checkpoints
// change the stored claim, the first call gets first and later calls
// succeed, and a rollback releases as the node's own release would. It
// returns the steps taken, ending with how the walk ended.
func drive(in Input, first Result) []string {
	var trace []string
	calls := 0
	for range 40 {
		step := Next(in)
		in.Last = Outcome{}
		switch step.Action {
		case ActionCheckpoint:
			trace = append(trace, step.String())
			if step.State == structs.CSIVolumeClaimStateFreed {
				in.Claim = nil
				continue
			}
			c := structs.CSIVolumeClaim{AllocationID: "alloc-1", NodeID: "node-1"}
			if in.Claim != nil {
				c = *in.Claim
			}
			c.State, c.UpdatedAt = step.State, t0.UnixNano()
			in.Claim = &c
			in.PublishingFor = 0 // a claim just written is seen afresh
		case ActionCall:
			trace = append(trace, step.String())
			res := ResultOK
			if calls == 0 {
				res = first
			}
			calls++
			in.Last = Outcome{Call: step.Call, Result: res}
		case ActionRollback:
			trace = append(trace, "rollback")
			in.Goal, in.NodeReleased = GoalRelease, true
		case ActionWait, ActionFail:
			what := step.Action.String()
			if step.Err != nil {
				what += " (" + step.Err.Error() + ")"
			}
			return append(trace, what)
		case ActionDone:
			return append(trace, "done")
		default:
			panic(fmt.Sprintf("unknown action %v", step.Action))
		}
	}
	return append(trace, "did not settle")
}

const (
	inUse       = "wait (volume claim still in use by its allocation)"
	unavailable = "fail (csi controller unavailable)"
	refused     = "fail (invalid request)"
	gone        = "fail (not found)"
	unknown     = "fail (leadership lost with the write in flight; outcome unknown)"
)

func steps(s ...string) string { return strings.Join(s, ", ") }

// A release writes at most three checkpoints: unpublishing (only when the
// node has to be asked to let go), node-detached and freed.
var (
	fullRelease = steps("checkpoint unpublishing", "call node-detach", "checkpoint node-detached",
		"call controller-unpublish", "checkpoint freed", "done")
	fencedRelease    = steps("checkpoint node-detached", "call controller-unpublish", "checkpoint freed", "done")
	fromUnpublishing = steps("call node-detach", "checkpoint node-detached", "call controller-unpublish", "checkpoint freed", "done")
	fromNodeDetached = steps("call controller-unpublish", "checkpoint freed", "done")
	rollback         = steps("rollback", "checkpoint node-detached", "call controller-unpublish", "checkpoint freed", "done")
)

// releaseTable is every (state, event) pair of a release: what the
// watcher, volume detach, a new claim settling a stale one, or the node's
// own release (evNodeReleased) does.
var releaseTable = map[structs.CSIClaimState]map[event]string{
	structs.CSIVolumeClaimStateFreed: {
		evRunning: "done", evStopRequested: "done", evExited: "done", evAllocGone: "done",
		evNodeDown: "done", evNodeGone: "done", evNodeReleased: "done", evPluginAbsent: "done",
		evNoController: "done", evRetryable: "done", evFinal: "done", evUnknown: "done", evPublishStale: "done",
		evSibling: "done", evStampOld: "done",
	},
	structs.CSIVolumeClaimStatePublishing: {
		evRunning:       inUse,
		evStopRequested: inUse,
		evExited:        fullRelease,
		evAllocGone:     fullRelease,
		evNodeDown:      fencedRelease,
		evNodeGone:      fencedRelease,
		evNodeReleased:  fencedRelease,
		evPluginAbsent:  steps("checkpoint unpublishing", "call node-detach", "checkpoint node-detached", unavailable),
		evNoController: steps("checkpoint unpublishing", "call node-detach", "checkpoint node-detached",
			"checkpoint freed", "done"),
		evRetryable:    steps("checkpoint unpublishing", "call node-detach", "fail"),
		evFinal:        steps("checkpoint unpublishing", "call node-detach", "fail"),
		evUnknown:      steps("checkpoint unpublishing", "call node-detach", "fail"),
		evPublishStale: fullRelease,
		evSibling:      inUse,
		evStampOld:     inUse, // the stamp is another clock's; only this server's sighting counts
	},
	structs.CSIVolumeClaimStateTaken: {
		evRunning:       inUse,
		evStopRequested: inUse, // the bug this core exists for: the task is inside its kill timeout
		evExited:        fullRelease,
		evAllocGone:     fullRelease,
		evNodeDown:      fencedRelease,
		evNodeGone:      fencedRelease,
		evNodeReleased:  fencedRelease,
		evPluginAbsent:  steps("checkpoint unpublishing", "call node-detach", "checkpoint node-detached", unavailable),
		evNoController: steps("checkpoint unpublishing", "call node-detach", "checkpoint node-detached",
			"checkpoint freed", "done"),
		evRetryable:    steps("checkpoint unpublishing", "call node-detach", "fail"),
		evFinal:        steps("checkpoint unpublishing", "call node-detach", "fail"),
		evUnknown:      steps("checkpoint unpublishing", "call node-detach", "fail"),
		evPublishStale: inUse, // only publishing goes stale
		evSibling:      inUse, // the failed task's siblings may still be in their kill timeout
		evStampOld:     inUse,
	},
	// A release that stopped part way goes on: whoever began it saw the
	// tasks gone (or the node's own release said so).
	structs.CSIVolumeClaimStateUnpublishing: {
		evRunning:       fromUnpublishing,
		evStopRequested: fromUnpublishing,
		evExited:        fromUnpublishing,
		evAllocGone:     fromUnpublishing,
		evNodeDown:      steps("checkpoint node-detached", fromNodeDetached),
		evNodeGone:      steps("checkpoint node-detached", fromNodeDetached),
		evNodeReleased:  steps("checkpoint node-detached", fromNodeDetached),
		evPluginAbsent:  steps("call node-detach", "checkpoint node-detached", unavailable),
		evNoController:  steps("call node-detach", "checkpoint node-detached", "checkpoint freed", "done"),
		evRetryable:     steps("call node-detach", "fail"),
		evFinal:         steps("call node-detach", "fail"),
		evUnknown:       steps("call node-detach", "fail"),
		evPublishStale:  fromUnpublishing,
		evSibling:       fromUnpublishing,
		evStampOld:      fromUnpublishing,
	},
	structs.CSIVolumeClaimStateNodeDetached: {
		evRunning:       fromNodeDetached,
		evStopRequested: fromNodeDetached,
		evExited:        fromNodeDetached,
		evAllocGone:     fromNodeDetached,
		evNodeDown:      fromNodeDetached,
		evNodeGone:      fromNodeDetached,
		evNodeReleased:  fromNodeDetached,
		evPluginAbsent:  unavailable, // freeing now could leave it attached with no claim
		evNoController:  steps("checkpoint freed", "done"),
		evRetryable:     steps("call controller-unpublish", "fail"),
		evFinal:         steps("call controller-unpublish", "fail"),
		evUnknown:       steps("call controller-unpublish", "fail"),
		evPublishStale:  fromNodeDetached,
		evSibling:       fromNodeDetached,
		evStampOld:      fromNodeDetached,
	},
	// No longer written; stored by an older server.
	structs.CSIVolumeClaimStateControllerDetached: {
		evRunning: "checkpoint freed, done", evStopRequested: "checkpoint freed, done",
		evExited: "checkpoint freed, done", evAllocGone: "checkpoint freed, done",
		evNodeDown: "checkpoint freed, done", evNodeGone: "checkpoint freed, done",
		evNodeReleased: "checkpoint freed, done", evPluginAbsent: "checkpoint freed, done",
		evNoController: "checkpoint freed, done", evRetryable: "checkpoint freed, done",
		evFinal: "checkpoint freed, done", evUnknown: "checkpoint freed, done",
		evPublishStale: "checkpoint freed, done", evSibling: "checkpoint freed, done",
		evStampOld: "checkpoint freed, done",
	},
}

// claimTable is every (state, event) pair of a client's claim.
var claimTable = map[structs.CSIClaimState]map[event]string{
	structs.CSIVolumeClaimStateFreed: {
		evRunning:       steps("checkpoint publishing", "call controller-publish", "checkpoint taken", "done"),
		evStopRequested: refused,
		evExited:        refused,
		evAllocGone:     gone,
		evNodeDown:      refused,
		evNodeGone:      refused,
		evPluginAbsent:  steps("checkpoint publishing", unavailable),
		evNoController:  steps("checkpoint publishing", "checkpoint taken", "done"),
		evRetryable:     steps("checkpoint publishing", "call controller-publish", "fail"),
		evFinal:         steps("checkpoint publishing", "call controller-publish", rollback),
		evUnknown:       steps("checkpoint publishing", "call controller-publish", unknown),
	},
	structs.CSIVolumeClaimStatePublishing: {
		evRunning:       steps("call controller-publish", "checkpoint taken", "done"),
		evStopRequested: refused,
		evExited:        refused,
		evAllocGone:     gone,
		evNodeDown:      refused,
		evNodeGone:      refused,
		evPluginAbsent:  unavailable,
		evNoController:  steps("checkpoint taken", "done"),
		evRetryable:     steps("call controller-publish", "fail"),
		evFinal:         steps("call controller-publish", rollback),
		evUnknown:       steps("call controller-publish", unknown),
	},
	structs.CSIVolumeClaimStateTaken: {
		evRunning: "done", evStopRequested: "done", evExited: "done", evAllocGone: "done",
		evNodeDown: "done", evNodeGone: "done", evPluginAbsent: "done", evNoController: "done",
		evRetryable: "done", evFinal: "done", evUnknown: "done",
	},
	structs.CSIVolumeClaimStateUnpublishing: {
		evRunning: refused, evStopRequested: refused, evExited: refused, evAllocGone: refused,
		evNodeDown: refused, evNodeGone: refused, evPluginAbsent: refused, evNoController: refused,
		evRetryable: refused, evFinal: refused, evUnknown: refused,
	},
	structs.CSIVolumeClaimStateNodeDetached: {
		evRunning: refused, evStopRequested: refused, evExited: refused, evAllocGone: refused,
		evNodeDown: refused, evNodeGone: refused, evPluginAbsent: refused, evNoController: refused,
		evRetryable: refused, evFinal: refused, evUnknown: refused,
	},
	structs.CSIVolumeClaimStateControllerDetached: {
		evRunning: refused, evStopRequested: refused, evExited: refused, evAllocGone: refused,
		evNodeDown: refused, evNodeGone: refused, evPluginAbsent: refused, evNoController: refused,
		evRetryable: refused, evFinal: refused, evUnknown: refused,
	},
}

func allStates() []structs.CSIClaimState {
	return append([]structs.CSIClaimState{structs.CSIVolumeClaimStateFreed}, structs.CSIClaimStates...)
}

func TestNext_Release(t *testing.T) {
	runTable(t, GoalRelease, releaseTable, releaseEvents)
}

func TestNext_Claim(t *testing.T) {
	runTable(t, GoalClaim, claimTable, claimEvents)
}

func runTable(t *testing.T, goal Goal, table map[structs.CSIClaimState]map[event]string, events []event) {
	// The table covers every pair: a state or event added later without
	// rows fails here, not silently.
	for _, st := range allStates() {
		rows, ok := table[st]
		must.True(t, ok, must.Sprintf("no rows for state %q", st))
		must.SliceContainsAll(t, slices.Collect(maps.Keys(rows)), events,
			must.Sprintf("state %q must have a row for every event", st))
	}
	for _, st := range allStates() {
		for _, ev := range events {
			name := string(st)
			if name == "" {
				name = "no claim"
			}
			t.Run(name+"/"+string(ev), func(t *testing.T) {
				in, first := world(goal, st, ev)
				got := strings.Join(drive(in, first), ", ")
				must.EqOp(t, table[st][ev], got)
			})
		}
	}
}

// A leader that stops anywhere in a walk, losing the outcome of the call
// it was making, leaves a checkpoint from which the next leader reaches
// the same end, repeating at most that one call (the calls are
// idempotent).
func TestNext_ResumesAfterLeaderChange(t *testing.T) {
	for _, goal := range []Goal{GoalClaim, GoalRelease} {
		for _, st := range allStates() {
			in, _ := world(goal, st, evRunning)
			if goal == GoalRelease {
				in.Alloc.ClientStatus = structs.AllocClientStatusComplete
			}
			whole := drive(in, ResultOK)
			for cut := 1; cut < len(whole); cut++ {
				// Leader A makes cut steps; leader B starts from A's
				// last checkpoint with no memory of A's call.
				b := in
				var repeated string
				for i := 0; i < cut; i++ {
					step := Next(b)
					b.Last = Outcome{}
					switch step.Action {
					case ActionCheckpoint:
						repeated = ""
						if step.State == structs.CSIVolumeClaimStateFreed {
							b.Claim = nil
							continue
						}
						c := structs.CSIVolumeClaim{AllocationID: "alloc-1", NodeID: "node-1"}
						if b.Claim != nil {
							c = *b.Claim
						}
						c.State = step.State
						b.Claim = &c
					case ActionCall:
						b.Last = Outcome{Call: step.Call, Result: ResultOK}
						repeated = step.String()
					}
				}
				b.Last = Outcome{} // the outcome is lost with leader A
				rest := drive(b, ResultOK)
				must.EqOp(t, whole[len(whole)-1], rest[len(rest)-1],
					must.Sprintf("%v from %q cut after %d steps: %v then %v", goal, st, cut, whole[:cut], rest))
				if repeated != "" {
					must.EqOp(t, repeated, rest[0], must.Sprintf("B repeats A's call first"))
				}
			}
		}
	}
}

func TestReleasable(t *testing.T) {
	running := &structs.Allocation{ID: "a", DesiredStatus: structs.AllocDesiredStatusRun, ClientStatus: structs.AllocClientStatusRunning}
	stopping := &structs.Allocation{ID: "a", DesiredStatus: structs.AllocDesiredStatusStop, ClientStatus: structs.AllocClientStatusRunning}
	evicted := &structs.Allocation{ID: "a", DesiredStatus: structs.AllocDesiredStatusEvict, ClientStatus: structs.AllocClientStatusRunning}
	pending := &structs.Allocation{ID: "a", DesiredStatus: structs.AllocDesiredStatusStop, ClientStatus: structs.AllocClientStatusPending}
	complete := &structs.Allocation{ID: "a", DesiredStatus: structs.AllocDesiredStatusStop, ClientStatus: structs.AllocClientStatusComplete}
	failed := &structs.Allocation{ID: "a", DesiredStatus: structs.AllocDesiredStatusRun, ClientStatus: structs.AllocClientStatusFailed}
	lost := &structs.Allocation{ID: "a", DesiredStatus: structs.AllocDesiredStatusStop, ClientStatus: structs.AllocClientStatusLost}
	siblingRuns := &structs.Allocation{ID: "a", DesiredStatus: structs.AllocDesiredStatusRun, ClientStatus: structs.AllocClientStatusFailed,
		TaskStates: map[string]*structs.TaskState{
			"sidecar": {State: structs.TaskStateDead, Failed: true}, "writer": {State: structs.TaskStateRunning}}}
	neverStarted := &structs.Allocation{ID: "a", DesiredStatus: structs.AllocDesiredStatusRun, ClientStatus: structs.AllocClientStatusFailed,
		TaskStates: map[string]*structs.TaskState{"writer": {State: structs.TaskStatePending}}}
	allDead := &structs.Allocation{ID: "a", DesiredStatus: structs.AllocDesiredStatusRun, ClientStatus: structs.AllocClientStatusFailed,
		TaskStates: map[string]*structs.TaskState{
			"sidecar": {State: structs.TaskStateDead, Failed: true}, "writer": {State: structs.TaskStateDead}}}
	up := &structs.Node{ID: "n", Status: structs.NodeStatusReady}
	initializing := &structs.Node{ID: "n", Status: structs.NodeStatusInit}
	down := &structs.Node{ID: "n", Status: structs.NodeStatusDown}
	cases := []struct {
		name  string
		alloc *structs.Allocation
		node  *structs.Node
		want  bool
	}{
		{"running", running, up, false},
		{"asked to stop, still running", stopping, up, false},
		{"evicted, still running", evicted, up, false},
		{"asked to stop, still pending", pending, up, false},
		{"running on an initializing node", running, initializing, false},
		{"complete", complete, up, true},
		{"failed", failed, up, true},
		{"lost", lost, up, true},
		{"failed, a sibling task still running", siblingRuns, up, false},
		{"failed, a sibling task still running, node down", siblingRuns, down, true},
		{"failed, a task still pending (it may be starting)", neverStarted, up, false},
		{"failed, every task dead", allDead, up, true},
		{"allocation gone", nil, up, true},
		{"node down", stopping, down, true},
		{"node gone", running, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.EqOp(t, tc.want, Releasable(tc.alloc, tc.node))
		})
	}
}

func TestClassify(t *testing.T) {
	plugin := func(sentinel error) error { return fmt.Errorf("rpc to node-1: %w: the plugin said so", sentinel) }
	cases := []struct {
		call Call
		err  error
		want Result
	}{
		{CallControllerPublish, nil, ResultOK},
		{CallNodeDetach, plugin(structs.ErrCSINotFound), ResultOK},
		{CallControllerUnpublish, plugin(structs.ErrCSINotFound), ResultOK},
		{CallControllerPublish, plugin(structs.ErrCSINotFound), ResultFinal},
		{CallControllerPublish, plugin(structs.ErrCSIFailedPrecondition), ResultFinal},
		{CallControllerPublish, plugin(structs.ErrCSIInvalidArgument), ResultFinal},
		{CallNodeDetach, plugin(structs.ErrCSIInternal), ResultFinal},
		{CallControllerPublish, plugin(structs.ErrOutcomeUnknown), ResultUnknown},
		{CallControllerUnpublish, plugin(structs.ErrNoLeader), ResultRetryable},
		{CallControllerUnpublish, plugin(structs.ErrCSIControllerUnavailable), ResultRetryable},
		{CallNodeDetach, plugin(structs.ErrNodeNotConnected), ResultRetryable},
		{CallNodeDetach, plugin(structs.ErrCSIUnavailable), ResultRetryable},
		{CallNodeDetach, plugin(structs.ErrCSIPluginNotFound), ResultRetryable},
		{CallNodeDetach, fmt.Errorf("node detach: %w", context.DeadlineExceeded), ResultRetryable},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%v/%v", tc.call, tc.err), func(t *testing.T) {
			must.EqOp(t, tc.want, Classify(tc.call, tc.err))
		})
	}
}
