package nomad

import (
	"time"

	metrics "github.com/hashicorp/go-metrics"
)

// Metrics of a change of leader. Each step of the latest takeover (on the
// new leader) and of the latest handoff (on the old one) is a gauge in
// milliseconds, so one handoff can be read whole from one server; a
// counter bumped after the gauges says a new set is complete. They are
// declared to the Prometheus sink (see TakeoverGauges), so they do not
// expire between two changes of leader.
var (
	// metricDutiesStarted counts the times this server opened its leader
	// duties (lanes, claims, workers), after an election or a failed
	// handoff.
	metricDutiesStarted = []string{"leader", "duties_started"}
	// metricTakeoverDone counts the times the work a new leader does once
	// its duties are open (heartbeat timers, evaluation restore) finished.
	metricTakeoverDone = []string{"leader", "takeover", "completed"}
	// metricHandoffDone counts the handoffs this server completed.
	metricHandoffDone = []string{"leader", "handoff", "completed"}
	// metricCatchUpWaited counts the takeovers whose FSM had not applied
	// the previous terms' last command when this server won, so that a
	// barrier ran alongside the wait (see catchUp).
	metricCatchUpWaited = []string{"leader", "takeover", "catch_up_waited"}
)

// Steps of a new leader's takeover, in order. Those before stepDutiesOpen
// are on the critical path: the cluster has no serving leader until they
// are done. The rest run after the duties are open.
const (
	stepCaughtUp   = "caught_up"   // the FSM has every entry of earlier terms (see catchUp)
	stepClusterID  = "cluster_id"  // cluster ID read (or written once, on a new cluster)
	stepLanes      = "lanes"       // controller lanes open: claims and controller calls accepted
	stepHeartbeats = "heartbeats"  // heartbeat loop running; client heartbeats accepted
	stepWatcher    = "watcher"     // volume watcher started
	stepBroker     = "eval_broker" // evaluation broker enabled
	stepDrainer    = "drainer"     // drainer and voter reconciliation started
	stepDutiesOpen = "acquired_to_duties"
	stepGap        = "leaderless_gap" // last contact with the old leader to duties open

	stepTimers   = "heartbeat_timers" // failover TTL armed for every known node (after duties)
	stepEvals    = "eval_restore"     // pending evaluations queued again (after duties)
	stepWorkers  = "workers"          // scheduler workers started (after duties)
	stepFinished = "duties_to_done"   // duties open to the last of the above
)

// Steps of an old leader's handoff.
const (
	stepRevoke   = "revoke"   // duties stopped, lanes closed to new callers
	stepBarrier  = "barrier"  // Raft barrier: followers hold and know committed every write
	stepDrain    = "drain"    // in-flight controller calls and claim transitions finished
	stepTransfer = "transfer" // Raft transfer until another leader is known
	stepTotal    = "total"
)

// TakeoverGauges lists the gauges (without the service prefix) a change of
// leader sets, for a metrics sink to declare up front.
func TakeoverGauges() [][]string {
	var out [][]string
	for _, s := range []string{stepCaughtUp, stepClusterID, stepLanes, stepHeartbeats, stepWatcher, stepBroker,
		stepDrainer, stepDutiesOpen, stepGap, stepTimers, stepEvals, stepWorkers, stepFinished} {
		out = append(out, takeoverGauge(s))
	}
	for _, s := range []string{stepRevoke, stepDrain, stepBarrier, stepTransfer, stepTotal} {
		out = append(out, handoffGauge(s))
	}
	return append(out, []string{"leader", "handoff", "drained_calls"}, []string{"leader", "handoff", "drained_claims"})
}

// TakeoverCounters lists the counters a change of leader bumps.
func TakeoverCounters() [][]string {
	return [][]string{metricDutiesStarted, metricTakeoverDone, metricHandoffDone, metricCatchUpWaited}
}

func takeoverGauge(step string) []string { return []string{"leader", "takeover", step + "_ms"} }
func handoffGauge(step string) []string  { return []string{"leader", "handoff", step + "_ms"} }

// stepClock times consecutive steps and publishes each as a gauge.
type stepClock struct {
	gauge func(step string) []string
	last  time.Time
}

func newStepClock(gauge func(string) []string, start time.Time) *stepClock {
	return &stepClock{gauge: gauge, last: start}
}

// step records the time since the previous step (or the start) as step's
// gauge and returns it.
func (c *stepClock) step(step string) time.Duration {
	now := time.Now()
	d := now.Sub(c.last)
	c.last = now
	setMillis(c.gauge(step), d)
	return d
}

func setMillis(key []string, d time.Duration) {
	metrics.SetGauge(key, float32(d.Seconds()*1000))
}
