package client

import (
	"fmt"
	"time"

	"github.com/roamhq/roam/structs"
)

// restartTracker counts a task's restarts within its restart policy's
// interval. It is plain data, persisted with the task's state, and its
// decisions depend only on the policy and the time passed in.
type restartTracker struct {
	// Count is the number of restarts in the current interval.
	Count int
	// IntervalStart is when the current interval began; zero before the
	// first restart.
	IntervalStart time.Time
}

// restartDecision is what to do after a task exited.
type restartDecision struct {
	Restart bool
	Delay   time.Duration
	// Reason explains the decision, for the task's event.
	Reason string
}

// next decides whether a task that exited at now restarts, and after how
// long. A policy with a non-positive Interval never resets its count.
//
// Mode fail: Attempts restarts per interval, then no more. Mode delay: once
// the attempts are used up, wait until the interval is over (at least
// Delay), then start counting afresh.
func (r *restartTracker) next(p *structs.RestartPolicy, now time.Time) restartDecision {
	if p == nil {
		return restartDecision{Reason: "no restart policy"}
	}
	if r.IntervalStart.IsZero() || (p.Interval > 0 && now.Sub(r.IntervalStart) >= p.Interval) {
		r.Count = 0
		r.IntervalStart = now
	}
	if r.Count < p.Attempts {
		r.Count++
		return restartDecision{
			Restart: true,
			Delay:   p.Delay,
			Reason:  fmt.Sprintf("restart %d of %d within %s", r.Count, p.Attempts, p.Interval),
		}
	}
	if p.Mode != structs.RestartPolicyModeDelay || p.Interval <= 0 {
		return restartDecision{
			Reason: fmt.Sprintf("exceeded allowed attempts %d in interval %s and the restart mode is %q", p.Attempts, p.Interval, p.Mode),
		}
	}
	delay := max(r.IntervalStart.Add(p.Interval).Sub(now), p.Delay)
	// The restart after the wait begins a new interval.
	r.Count = 0
	r.IntervalStart = time.Time{}
	return restartDecision{
		Restart: true,
		Delay:   delay,
		Reason:  fmt.Sprintf("exceeded allowed attempts %d in interval %s; waiting %s (restart mode %q)", p.Attempts, p.Interval, delay, p.Mode),
	}
}
