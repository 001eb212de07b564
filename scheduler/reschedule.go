package scheduler

import (
	"time"

	"github.com/roamhq/roam/structs"
)

// rescheduleKind is what to do with a failed allocation.
type rescheduleKind int

const (
	// rescheduleNone: no policy, or attempts used up; leave it failed.
	rescheduleNone rescheduleKind = iota
	// rescheduleNow: place a replacement in this plan.
	rescheduleNow
	// rescheduleLater: the delay has not passed; a follow-up evaluation
	// places the replacement at the returned time.
	rescheduleLater
)

// decideReschedule applies a group's reschedule policy to a failed
// allocation at now. The rules:
//
//   - Attempts: the allocation's RescheduleTracker events whose
//     RescheduleTime lies within Interval before now are the attempts used
//     (Interval zero counts every event). Unless Unlimited, attempts >=
//     Attempts means no replacement.
//   - Delay: rescheduleDelay(policy, n) with n the number of earlier
//     reschedule events in the tracker, counted from the allocation's fail
//     time (failTime). Before that instant the reschedule waits.
//   - DesiredTransition.Reschedule skips the delay; ForceReschedule skips
//     the delay and the attempt limit.
func decideReschedule(a *structs.Allocation, policy *structs.ReschedulePolicy, now time.Time) (kind rescheduleKind, at time.Time, delay time.Duration) {
	force := a.DesiredTransition.ForceReschedule != nil && *a.DesiredTransition.ForceReschedule
	asked := a.DesiredTransition.Reschedule != nil && *a.DesiredTransition.Reschedule
	if policy == nil && !force {
		return rescheduleNone, time.Time{}, 0
	}
	var events []*structs.RescheduleEvent
	if a.RescheduleTracker != nil {
		events = a.RescheduleTracker.Events
	}
	if !force && !policy.Unlimited && attemptsWithin(events, policy.Interval, now) >= policy.Attempts {
		return rescheduleNone, time.Time{}, 0
	}
	if force || asked || policy == nil {
		return rescheduleNow, now, 0
	}
	delay = rescheduleDelay(policy, len(events))
	at = failTime(a).Add(delay)
	if now.Before(at) {
		return rescheduleLater, at, delay
	}
	return rescheduleNow, at, delay
}

// attemptsWithin counts events no older than interval before now; zero
// interval counts them all.
func attemptsWithin(events []*structs.RescheduleEvent, interval time.Duration, now time.Time) int {
	if interval <= 0 {
		return len(events)
	}
	since := now.Add(-interval).UnixNano()
	n := 0
	for _, e := range events {
		if e != nil && e.RescheduleTime >= since {
			n++
		}
	}
	return n
}

// rescheduleDelay is the wait before the (n+1)th reschedule, n being the
// number of reschedules so far:
//
//   - constant: Delay.
//   - exponential: Delay * 2^n (Delay, 2·Delay, 4·Delay, …).
//   - fibonacci: Delay * fib(n) with fib = 1, 1, 2, 3, 5, 8, …
//
// exponential and fibonacci are capped at MaxDelay when MaxDelay > 0. An
// unknown function behaves as constant.
func rescheduleDelay(p *structs.ReschedulePolicy, n int) time.Duration {
	if p == nil || p.Delay <= 0 {
		return 0
	}
	// ceiling stops growth: MaxDelay, or the largest Duration.
	ceiling := time.Duration(1<<63 - 1)
	if p.MaxDelay > 0 {
		ceiling = p.MaxDelay
	}
	switch p.DelayFunction {
	case structs.DelayFunctionExponential:
		d := p.Delay
		for i := 0; i < n; i++ {
			if d > ceiling/2 {
				return ceiling
			}
			d *= 2
		}
		return min(d, ceiling)
	case structs.DelayFunctionFibonacci:
		// d0, d1 are fib(i)·Delay and fib(i+1)·Delay; the sum saturates.
		d0, d1 := p.Delay, p.Delay
		for i := 0; i < n && d0 < ceiling; i++ {
			next := ceiling
			if d1 <= ceiling-d0 {
				next = d0 + d1
			}
			d0, d1 = d1, next
		}
		return min(d0, ceiling)
	}
	return p.Delay
}

// failTime is when the allocation failed: the latest FinishedAt of its
// tasks, else its ModifyTime.
func failTime(a *structs.Allocation) time.Time {
	var latest time.Time
	for _, ts := range a.TaskStates {
		if ts != nil && ts.FinishedAt.After(latest) {
			latest = ts.FinishedAt
		}
	}
	if !latest.IsZero() {
		return latest
	}
	return time.Unix(0, a.ModifyTime)
}

// penalisedNodes counts, per node, how often the failed allocation and
// its predecessors failed there (its own node plus every PrevNodeID in its
// reschedule history).
func penalisedNodes(a *structs.Allocation) map[string]int {
	m := map[string]int{a.NodeID: 1}
	if a.RescheduleTracker != nil {
		for _, e := range a.RescheduleTracker.Events {
			if e != nil && e.PrevNodeID != "" {
				m[e.PrevNodeID]++
			}
		}
	}
	return m
}

// scheduleFollowup makes sure a follow-up evaluation will reschedule a at
// time at. An allocation already pointing at a pending follow-up (other
// than the evaluation being processed) needs nothing. Otherwise the one
// follow-up of this plan is created (WaitUntil the earliest time asked)
// and the allocation is updated to name it.
func (p *planner) scheduleFollowup(a *structs.Allocation, at time.Time) {
	if a.FollowupEvalID != "" && a.FollowupEvalID != p.eval.ID {
		return
	}
	if p.followup == nil {
		p.followup = &structs.Evaluation{
			ID:           p.opts.NewID(),
			Namespace:    p.job.Namespace,
			Priority:     p.job.Priority,
			Type:         p.job.Type,
			TriggeredBy:  structs.EvalTriggerRetryFailedAlloc,
			JobID:        p.job.ID,
			Status:       structs.EvalStatusPending,
			WaitUntil:    at,
			PreviousEval: p.eval.ID,
			CreateTime:   p.now,
			ModifyTime:   p.now,
		}
	} else if at.Before(p.followup.WaitUntil) {
		p.followup.WaitUntil = at
	}
	c := a.Copy()
	c.FollowupEvalID = p.followup.ID
	// ModifyTime is left alone: without task states it is the failure
	// time (failTime), and moving it would push the reschedule back on
	// every evaluation.
	p.plan.AppendAlloc(c)
}
