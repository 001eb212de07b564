// Package heartbeatlag decides, when a node's heartbeat timer runs out on
// the leader, whether the node is silent or the leader has fallen behind.
//
// A client heartbeats halfway through its TTL, so a heartbeat the leader
// answers after the TTL has run (inside the grace) came late: the client
// was slow, the network was, or the leader was too busy to read and answer
// in time. One late client says little; many late heartbeats at once say
// the leader is behind, and then a node whose timer runs out may be one
// whose heartbeat is waiting in the leader's own queue. Marking it down
// would release its claims under a healthy workload (the 10,000-node run
// marked at least 187 healthy nodes down while the servers were busy
// placing). So, while the leader is behind, an expired node gets its TTL
// extended, a bounded number of times, as a new leader extends every TTL
// after a failover; a node that stays silent is marked down after all.
//
// A zone outage is the case this must not hide: the silent nodes are
// silent, not late, and the others' heartbeats arrive on time, so the
// leader is not behind and the silent nodes are marked down at once.
package heartbeatlag

import "time"

const (
	// MinLate is how many late heartbeats in the window it takes to call
	// the leader behind, whatever the cluster's size: a handful of slow
	// clients in a small cluster must not delay its failure detection.
	MinLate = 10
	// LateShare is the share of the window's heartbeats that must be late
	// (one in LateShare) to call the leader behind.
	LateShare = 10
	// MaxExtensions bounds how many times one silent node's TTL is
	// extended while the leader is behind.
	MaxExtensions = 3
)

// Verdict is what to do with a node whose timer ran out.
type Verdict int

const (
	// MarkDown: the node missed its heartbeat.
	MarkDown Verdict = iota + 1
	// Extend: arm the node's timer again for the failover TTL.
	Extend
)

func (v Verdict) String() string {
	switch v {
	case MarkDown:
		return "mark-down"
	case Extend:
		return "extend"
	}
	return "unknown"
}

// Window counts the heartbeats the leader answered recently, and how many
// of them came after their TTL.
type Window struct {
	Answered, Late int
}

// Behind says whether w shows a leader that is falling behind.
func (w Window) Behind() bool {
	return w.Late >= MinLate && w.Late*LateShare >= w.Answered
}

// Decide is the verdict on a node whose timer ran out after it had been
// extended extensions times since its last heartbeat.
func Decide(w Window, extensions int) Verdict {
	if extensions < MaxExtensions && w.Behind() {
		return Extend
	}
	return MarkDown
}

// Counter keeps a Window over the last span, in one-second buckets. It is
// not safe for concurrent use.
type Counter struct {
	span    time.Duration
	buckets []bucket
}

type bucket struct {
	sec            int64
	answered, late int
}

// NewCounter counts over the last span (at least one second).
func NewCounter(span time.Duration) *Counter {
	n := max(int(span/time.Second), 1)
	return &Counter{span: time.Duration(n) * time.Second, buckets: make([]bucket, n)}
}

// Add records one heartbeat answered at now, late or not.
func (c *Counter) Add(now time.Time, late bool) {
	sec := now.Unix()
	b := &c.buckets[int(sec%int64(len(c.buckets)))]
	if b.sec != sec {
		*b = bucket{sec: sec}
	}
	b.answered++
	if late {
		b.late++
	}
}

// Window returns the counts of the span before now.
func (c *Counter) Window(now time.Time) Window {
	var w Window
	oldest := now.Unix() - int64(len(c.buckets)) + 1
	for _, b := range c.buckets {
		if b.sec >= oldest && b.sec <= now.Unix() {
			w.Answered += b.answered
			w.Late += b.late
		}
	}
	return w
}
