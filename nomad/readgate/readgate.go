// Package readgate decides when a server that started again may answer
// stale reads from its own state.
//
// A server answers a stale read from its own copy of the state, which may
// lag the leader's: that is what a stale read asks for. It must not lag
// the server's own past. A server started again holds its Raft log on
// disk, but Raft applies none of it until a leader says how much is
// committed, so until then the copy is the last snapshot's, or empty: a
// stale read from it would say that a volume registered an hour ago is
// not there.
//
// Until it has caught up once since it started (CaughtUp), a server that
// started with Raft state of its own answers stale reads as default ones:
// from the leader, or, with no leader, with ErrNoLeader once the hold
// timeout passes. Once caught up it stays so; lagging after that is the
// ordinary kind, and never behind what the server had already shown.
package readgate

import "github.com/hashicorp/raft"

// View is what CaughtUp decides on: one server's Raft and FSM, read at
// one moment.
type View struct {
	// Applied is the index the FSM itself has applied (Raft's
	// AppliedIndex counts entries only queued to it); Target the newest
	// command at or below Commit, which the FSM must have applied (Commit
	// itself when the command index cannot tell).
	Applied, Target uint64
	// Floor is the Raft index the data dir marker said this server had
	// applied before it stopped (0 for a new data dir or dev mode).
	Floor uint64
	// State is the server's Raft state; Leading is true once it runs a
	// leader's duties (its catch-up applied every earlier command).
	State   raft.RaftState
	Leading bool
	// Contacted is true once a leader has been heard from since start;
	// Commit is the commit index now, CommitAtStart the one Raft started
	// with. A heartbeat carries no commit index, so only a Commit past
	// CommitAtStart shows that a leader's append brought one.
	Contacted             bool
	Commit, CommitAtStart uint64
}

// CaughtUp says whether a server's own state may answer stale reads.
func CaughtUp(v View) bool {
	switch v.State {
	case raft.Leader:
		return v.Leading && v.Commit >= v.Floor
	case raft.Follower:
		return v.Contacted && v.Commit > v.CommitAtStart && v.Commit >= v.Floor && v.Applied >= v.Target
	}
	return false
}
