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

// CSILaneStats is a plugin's controller lane as the leader sees it now.
// Counts start when the server became leader.
type CSILaneStats struct {
	PluginID string
	// Depth is how many callers wait for the lane, not counting the
	// running call.
	Depth int
	// InFlight is how many calls are running: 0 or 1, more only while a
	// call past its deadline has not yet returned.
	InFlight int
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
