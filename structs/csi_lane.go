package structs

import "time"

// CSILaneRecentCalls is how many of a lane's latest calls CSILaneStats
// keeps.
const CSILaneRecentCalls = 32

// CSILaneCall is one destructive controller call that ran in a plugin's
// lane on the leader.
type CSILaneCall struct {
	Op       string
	Start    time.Time
	Duration time.Duration
	// TimedOut is set when the call passed the lane's call deadline, so
	// the lane went to the next caller before it returned.
	TimedOut bool
	// Failed is set when the call returned an error.
	Failed bool
}

// CSILaneKeysShown bounds how many queued calls CSILaneStats.Queued lists.
const CSILaneKeysShown = 32

// CSILaneKey is a call in a lane: what it does and what it holds.
type CSILaneKey struct {
	Op string
	// Volume is the volume the call acts on; Node, for publish and
	// unpublish, the node. No two calls of a lane holding one run at once.
	Volume string `json:",omitempty"`
	Node   string `json:",omitempty"`
}

// CSILaneStats is a plugin's controller lane as the leader sees it now.
// Counts start when the server became leader.
type CSILaneStats struct {
	PluginID string
	// Limit is how many calls the lane runs at once: the plugin's
	// controller_concurrency (see CSIPlugin.ControllerConcurrency), 1
	// until every server can take more.
	Limit int
	// Depth is how many callers wait for the lane, not counting the
	// running calls.
	Depth int
	// InFlight is how many calls are running: at most Limit, more only
	// while a call past its deadline has not yet returned.
	InFlight int
	// Running are the calls that hold a place in the lane now; Queued the
	// first CSILaneKeysShown of those waiting, oldest first.
	Running  []CSILaneKey `json:",omitempty"`
	Queued   []CSILaneKey `json:",omitempty"`
	Calls    uint64
	Timeouts uint64
	// Recent are the latest calls that finished, oldest first, at most
	// CSILaneRecentCalls.
	Recent []CSILaneCall
}

// CSILanesRequest asks the leader for its controller lanes.
type CSILanesRequest struct {
	QueryOptions
}

// CSILanesResponse carries every lane the leader has used, by plugin ID.
type CSILanesResponse struct {
	Lanes []*CSILaneStats
	QueryMeta
}
