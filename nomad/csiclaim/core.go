// Package csiclaim is the claim lifecycle as one deterministic core: given
// a claim, its allocation, its node, the plugin and how long the claim has
// sat in publishing, Next says what to do next — write a checkpoint, make
// a CSI call, wait, or stop. It does no I/O. The leader's claim endpoint,
// the volume watcher, volume detach and forced deregistration carry out
// what it returns, so they all follow the same rules, and the rules are
// tested as a table.
//
// The rule that matters most: a claim is released only once its task is
// gone. The client reporting the allocation terminal says so; so does the
// node being down or gone (then the controller detach fences the volume
// from the node). An allocation the servers have merely asked to stop may
// still be inside its kill timeout, writing to the volume.
package csiclaim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/roamhq/roam/structs"
)

// Goal is what the caller of the walk wants for the claim.
type Goal int

const (
	// GoalClaim reserves the volume for the allocation and publishes it at
	// the controller: a client's claim.
	GoalClaim Goal = iota + 1
	// GoalRelease walks the claim down to freed, once Releasable allows.
	GoalRelease
)

func (g Goal) String() string {
	switch g {
	case GoalClaim:
		return "claim"
	case GoalRelease:
		return "release"
	}
	return fmt.Sprintf("goal(%d)", int(g))
}

// Call is a CSI call the walk makes.
type Call int

const (
	CallNone Call = iota
	// CallControllerPublish attaches the volume to the claim's node.
	CallControllerPublish
	// CallNodeDetach asks the claim's node to unpublish and unstage.
	CallNodeDetach
	// CallControllerUnpublish detaches the volume from the claim's node.
	CallControllerUnpublish
)

func (c Call) String() string {
	switch c {
	case CallNone:
		return "none"
	case CallControllerPublish:
		return "controller-publish"
	case CallNodeDetach:
		return "node-detach"
	case CallControllerUnpublish:
		return "controller-unpublish"
	}
	return fmt.Sprintf("call(%d)", int(c))
}

// Result is how a call ended, as Classify reads its error.
type Result int

const (
	ResultNone Result = iota
	// ResultOK: the call did what it was asked (or it was already done).
	ResultOK
	// ResultRetryable: the call did not run or did not finish (no leader,
	// node not connected, plugin unavailable, deadline); it may be tried
	// again and it is safe to.
	ResultRetryable
	// ResultFinal: the plugin or the servers refused; the same call will
	// get the same answer.
	ResultFinal
	// ResultUnknown: the call may or may not have taken effect (the
	// connection or leadership was lost while it ran).
	ResultUnknown
)

func (r Result) String() string {
	switch r {
	case ResultNone:
		return "none"
	case ResultOK:
		return "ok"
	case ResultRetryable:
		return "retryable"
	case ResultFinal:
		return "final"
	case ResultUnknown:
		return "unknown"
	}
	return fmt.Sprintf("result(%d)", int(r))
}

// Outcome is the result of the call the previous step asked for.
type Outcome struct {
	Call   Call
	Result Result
}

// Action is the kind of a Step.
type Action int

const (
	// ActionWait: nothing may be done now, and nothing is wrong; ask again
	// when the allocation, node or plugin changes.
	ActionWait Action = iota + 1
	// ActionCheckpoint: write Step.State through Raft, then ask again.
	ActionCheckpoint
	// ActionCall: make Step.Call, then ask again with its Outcome.
	ActionCall
	// ActionDone: the goal is reached.
	ActionDone
	// ActionFail: stop here and report Step.Reason (with the last call's
	// error, if any); the claim stays at its checkpoint.
	ActionFail
	// ActionRollback: the publish was refused for good. Release the
	// reservation (the node never mounted the volume) and fail the claim.
	ActionRollback
)

func (a Action) String() string {
	switch a {
	case ActionWait:
		return "wait"
	case ActionCheckpoint:
		return "checkpoint"
	case ActionCall:
		return "call"
	case ActionDone:
		return "done"
	case ActionFail:
		return "fail"
	case ActionRollback:
		return "rollback"
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// Step is what Next decides.
type Step struct {
	Action Action
	// State is the checkpoint to write (ActionCheckpoint).
	State structs.CSIClaimState
	// Call is the call to make (ActionCall).
	Call Call
	// Reason says why, in words for logs and errors.
	Reason string
	// Err is the sentinel an ActionFail or ActionWait stands for, so callers
	// compare with errors.Is; the last call's own error, when there is one,
	// is reported beside it.
	Err error
}

func (s Step) String() string {
	switch s.Action {
	case ActionCheckpoint:
		if s.State == structs.CSIVolumeClaimStateFreed {
			return "checkpoint freed"
		}
		return "checkpoint " + string(s.State)
	case ActionCall:
		return "call " + s.Call.String()
	}
	return s.Action.String()
}

// Input is everything the next step of one claim depends on.
type Input struct {
	Goal Goal
	// Claim is the claim as stored; nil when there is none yet (a new
	// claim) or it was freed.
	Claim *structs.CSIVolumeClaim
	// Alloc is the claiming allocation; nil when it is gone from state.
	Alloc *structs.Allocation
	// Node is the claim's node; nil when it is gone from state.
	Node *structs.Node
	// PluginID is the volume's plugin; Plugin is that plugin as the
	// cluster sees it, nil when no node reports it.
	PluginID string
	Plugin   *structs.CSIPlugin
	// NodeReleased says the claim's own node asked for the release after
	// unpublishing and unstaging the volume itself: its tasks are gone.
	NodeReleased bool
	// Last is the outcome of the call the previous step asked for; zero
	// when the walk starts (on this leader, or on a new one).
	Last Outcome
	// PublishingFor and PublishTimeout decide when a claim left in
	// publishing (its leader gone mid-publish, its client gone quiet) may
	// be released although its allocation still runs: it never got the
	// volume. PublishingFor is how long this server has seen the claim
	// sit in publishing unchanged, on its own clock (see PublishAges),
	// never a stored timestamp: that came from some server's wall clock.
	PublishingFor  time.Duration
	PublishTimeout time.Duration
}

// Releasable says whether a claim of alloc on node may be released: the
// allocation's tasks are known to be gone. That is so when the client has
// reported the allocation terminal with every task dead, when the
// allocation is gone from state, or when the node is down or gone (its
// claims are then fenced by the controller detach). An allocation the
// servers asked to stop is not enough: its tasks may still be inside their
// kill timeout, writing. This is the one rule everything that decides a
// claim is free uses (structs.CSIClaimReleasable, which the state store
// also checks at apply time).
func Releasable(alloc *structs.Allocation, node *structs.Node) bool {
	return structs.CSIClaimReleasable(alloc, node)
}

// WhyHeld says, for an allocation whose claim is not Releasable, what
// holds it, in words for an error or a scheduler's reason.
func WhyHeld(alloc *structs.Allocation) string {
	if alloc.ClientTerminalStatus() {
		for _, name := range slices.Sorted(maps.Keys(alloc.TaskStates)) {
			if ts := alloc.TaskStates[name]; ts != nil && ts.State != structs.TaskStateDead {
				return fmt.Sprintf("allocation %s is %s but its task %q is still %s on node %s",
					alloc.ID, alloc.ClientStatus, name, ts.State, alloc.NodeID)
			}
		}
	}
	return fmt.Sprintf("allocation %s is still %s on node %s (desired %s)",
		alloc.ID, orPending(alloc.ClientStatus), alloc.NodeID, alloc.DesiredStatus)
}

func orPending(s string) string {
	if s == "" {
		return "pending"
	}
	return s
}

func nodeGoneOrDown(n *structs.Node) bool {
	return n == nil || n.Status == structs.NodeStatusDown
}

// Next decides the claim's next step.
func Next(in Input) Step {
	switch in.Goal {
	case GoalClaim:
		return nextClaim(in)
	case GoalRelease:
		return nextRelease(in)
	}
	return fail(structs.ErrInvalidRequest, fmt.Sprintf("unknown goal %v", in.Goal))
}

func nextClaim(in Input) Step {
	if in.Claim != nil {
		switch in.Claim.State {
		case structs.CSIVolumeClaimStateTaken:
			// The volume is the allocation's already: a retried claim, or
			// a restarted client mounting it again.
			return Step{Action: ActionDone, Reason: "the claim is taken"}
		case structs.CSIVolumeClaimStatePublishing:
		default:
			return fail(structs.ErrInvalidRequest, fmt.Sprintf("the claim is being released (%s)", in.Claim.State))
		}
	}
	switch {
	case in.Alloc == nil:
		return fail(structs.ErrNotFound, "the allocation is gone")
	case in.Alloc.TerminalStatus():
		return fail(structs.ErrInvalidRequest, fmt.Sprintf("allocation %s is terminal (desired %s, client %s) and may not claim volumes",
			in.Alloc.ID, in.Alloc.DesiredStatus, orPending(in.Alloc.ClientStatus)))
	case nodeGoneOrDown(in.Node):
		return fail(structs.ErrInvalidRequest, "the claiming node is down or gone")
	case in.Claim == nil:
		return checkpoint(structs.CSIVolumeClaimStatePublishing, "reserve the volume before publishing")
	}
	// Publishing: resumed after a retried claim or a leader change (the
	// publish is idempotent), or just reserved.
	if in.Last.Call == CallControllerPublish {
		switch in.Last.Result {
		case ResultOK:
			return checkpoint(structs.CSIVolumeClaimStateTaken, "the controller published the volume")
		case ResultFinal:
			return Step{Action: ActionRollback, Reason: "the controller refused the publish"}
		case ResultUnknown:
			// The publish may still be running: keep the reservation,
			// which a retried claim resumes.
			return fail(structs.ErrOutcomeUnknown, "the publish's outcome is unknown; the reservation is kept")
		default:
			return fail(nil, "the publish did not run; the reservation is kept for a retry")
		}
	}
	switch {
	case in.Plugin == nil:
		return fail(structs.ErrCSIControllerUnavailable, fmt.Sprintf("no node reports plugin %q", in.PluginID))
	case in.Plugin.ControllerRequired:
		return call(CallControllerPublish, "publish at the controller")
	}
	return checkpoint(structs.CSIVolumeClaimStateTaken, "the plugin needs no controller publish")
}

func nextRelease(in Input) Step {
	if in.Claim == nil {
		return Step{Action: ActionDone, Reason: "the claim is freed"}
	}
	switch in.Claim.State {
	case structs.CSIVolumeClaimStatePublishing, structs.CSIVolumeClaimStateTaken:
		if !in.NodeReleased && !Releasable(in.Alloc, in.Node) {
			if in.Claim.State == structs.CSIVolumeClaimStatePublishing && in.PublishTimeout > 0 &&
				in.PublishingFor > in.PublishTimeout {
				return checkpoint(structs.CSIVolumeClaimStateUnpublishing,
					"the claim was left in publishing; its allocation never got the volume")
			}
			return Step{Action: ActionWait, Reason: WhyHeld(in.Alloc), Err: structs.ErrCSIClaimInUse}
		}
		// With nothing to ask of the node, the walk starts at
		// node-detached: one Raft write fewer than by way of unpublishing,
		// which would say no more.
		if step, ok := nodeAlreadyDetached(in); ok {
			return step
		}
		return checkpoint(structs.CSIVolumeClaimStateUnpublishing, "the allocation's tasks are gone")
	case structs.CSIVolumeClaimStateUnpublishing:
		// Once the walk has begun it goes on: whoever began it saw the
		// allocation's tasks gone.
		if step, ok := nodeAlreadyDetached(in); ok {
			return step
		}
		switch {
		case in.Last.Call == CallNodeDetach && in.Last.Result == ResultOK:
			return checkpoint(structs.CSIVolumeClaimStateNodeDetached, "the node unpublished the volume")
		case in.Last.Call == CallNodeDetach:
			return fail(nil, fmt.Sprintf("node detach %s; retry later", in.Last.Result))
		}
		return call(CallNodeDetach, "unpublish and unstage on the node")
	case structs.CSIVolumeClaimStateNodeDetached:
		switch {
		// Nothing is left to do once the controller has let go, so the
		// claim is freed at once, not by way of controller-detached: a
		// leader that stops before the write leaves it node-detached, and
		// the next walk unpublishes again, which the spec makes idempotent.
		case in.Last.Call == CallControllerUnpublish && in.Last.Result == ResultOK:
			return checkpoint(structs.CSIVolumeClaimStateFreed, "the controller unpublished the volume")
		case in.Last.Call == CallControllerUnpublish:
			return fail(nil, fmt.Sprintf("controller unpublish %s; retry later", in.Last.Result))
		case in.Plugin == nil:
			// Freeing now could leave the volume attached to the node at
			// the provider with no claim to say so.
			return fail(structs.ErrCSIControllerUnavailable,
				fmt.Sprintf("no node reports plugin %q; the controller detach waits for it", in.PluginID))
		case !in.Plugin.ControllerRequired:
			return checkpoint(structs.CSIVolumeClaimStateFreed, "the plugin needs no controller unpublish")
		}
		return call(CallControllerUnpublish, "unpublish at the controller")
	case structs.CSIVolumeClaimStateControllerDetached:
		// No longer written, but a claim stored by an older server, or
		// restored from its snapshot, may still be here.
		return checkpoint(structs.CSIVolumeClaimStateFreed, "the volume is detached")
	}
	return fail(structs.ErrInvalidRequest, fmt.Sprintf("unknown claim state %q", in.Claim.State))
}

// nodeAlreadyDetached is the checkpoint of a release that has nothing to
// ask of the claim's node: the node unpublished the volume itself, or it
// is down or gone and its mounts went with it.
func nodeAlreadyDetached(in Input) (Step, bool) {
	switch {
	case in.NodeReleased:
		return checkpoint(structs.CSIVolumeClaimStateNodeDetached, "the node unpublished the volume itself"), true
	case nodeGoneOrDown(in.Node):
		return checkpoint(structs.CSIVolumeClaimStateNodeDetached, "the node is down or gone; its mounts went with it"), true
	}
	return Step{}, false
}

func fail(sentinel error, why string) Step {
	return Step{Action: ActionFail, Reason: why, Err: sentinel}
}

func checkpoint(s structs.CSIClaimState, why string) Step {
	return Step{Action: ActionCheckpoint, State: s, Reason: why}
}

func call(c Call, why string) Step { return Step{Action: ActionCall, Call: c, Reason: why} }

// Classify reads a call's error as a Result. Unpublishing what is not
// there (the plugin's NOT_FOUND) counts as done: the calls are idempotent
// and the object being gone is what they are for.
func Classify(c Call, err error) Result {
	if err == nil {
		return ResultOK
	}
	err = structs.FromRPCError(err)
	switch {
	case errors.Is(err, structs.ErrCSINotFound) && (c == CallNodeDetach || c == CallControllerUnpublish):
		return ResultOK
	case errors.Is(err, structs.ErrOutcomeUnknown):
		return ResultUnknown
	case structs.IsRetryable(err),
		errors.Is(err, structs.ErrNodeNotConnected),
		errors.Is(err, structs.ErrCSIControllerUnavailable),
		errors.Is(err, structs.ErrCSIPluginNotFound),
		errors.Is(err, structs.ErrCSIUnavailable),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled):
		return ResultRetryable
	}
	return ResultFinal
}
