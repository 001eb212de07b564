// Package scheduler turns an evaluation into a plan. It is a deterministic
// core: Process reads a State snapshot, takes the time and new IDs from its
// Options, performs no I/O of its own, and returns the plan and a Result as
// values. Identical state, clock and ID sequence give identical plans; map
// iteration never decides an order (nodes are walked by ID, allocations by
// index, groups in job order).
//
// Service and batch jobs go through the generic reconciler (reconcile.go),
// system jobs through the system scheduler (system.go); both place with the
// same feasibility checks and ranking (feasible.go).
//
// # How a plan encodes changes
//
//   - Plan.NodeUpdate[node] holds copies of existing allocations to stop,
//     with DesiredStatus/DesiredDescription (and ClientStatus "lost" for
//     allocations on down nodes) already set.
//   - Plan.NodeAllocation[node] holds new allocations and updates of
//     existing ones. An entry whose ID already exists in the state store is
//     a field update of that allocation: the applier upserts it by ID. The
//     scheduler only updates failed allocations this way (NextAllocation
//     once replaced, FollowupEvalID once a delayed reschedule is queued);
//     such allocations are client-terminal and use no capacity, so the
//     applier must not count them against the node.
//   - Result.FollowupEval, when set, is an evaluation the caller must
//     create; it carries WaitUntil for delayed reschedules.
package scheduler
