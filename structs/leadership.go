package structs

import "time"

// LeadershipChange is one change of leader as one server saw it.
type LeadershipChange struct {
	// At is when the server saw the new leader.
	At time.Time
	// LeaderID and LeaderAddr name the new leader.
	LeaderID   string
	LeaderAddr string
	// PreviousID is the leader before it ("" for the first one seen).
	PreviousID string
	// Gap is how long the cluster was without a leader able to serve. On
	// the server that became leader it is the leaderless gap it measured
	// (last contact with the old leader until its duties started, the
	// leader.leaderless_gap metric); elsewhere it is from when the server
	// lost its leader to when it saw the new one.
	Gap time.Duration
	// GapKnown is false when the server saw the leader change with no
	// leaderless moment of its own to measure from.
	GapKnown bool
	// MeasuredByLeader is set when Gap is the new leader's own measure.
	MeasuredByLeader bool
}

// LeadershipHistoryRecent is how many changes a server keeps.
const LeadershipHistoryRecent = 32

// LeadershipHistoryResponse carries a server's recent leadership
// changes, oldest first.
type LeadershipHistoryResponse struct {
	// ServerID is the server that answered.
	ServerID string
	Changes  []*LeadershipChange
	QueryMeta
}
