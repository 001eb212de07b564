package nomad

import "github.com/hashicorp/raft"

// A server answers a stale read from its own copy of the state, which may
// lag the leader's: that is what a stale read asks for. It must not lag
// the server's own past. A server started again holds its Raft log on
// disk, but Raft applies none of it until a leader says how much is
// committed, so until then the copy is the last snapshot's, or empty: a
// stale read from it would say that a volume registered an hour ago is
// not there.
//
// Until it has caught up once since it started, a server that started
// with Raft state of its own answers stale
// reads as default ones (forward): from the leader, or, with no leader,
// with ErrNoLeader once the hold timeout passes. Once caught up it stays
// so; lagging after that is the ordinary kind, and never behind what the
// server had already shown.

// staleView is what staleCaughtUp decides on.
type staleView struct {
	// Applied is the Raft index the server's state has reached; Floor the
	// one the data dir marker said it had applied before it stopped (0
	// for a new data dir or dev mode).
	Applied, Floor uint64
	// State is the server's Raft state; Leading is true once it runs a
	// leader's duties (its barrier applied everything before its term).
	State   raft.RaftState
	Leading bool
	// Contacted is true once a leader's append succeeded on this server
	// since it started; Commit is then the commit index it learned.
	Contacted bool
	Commit    uint64
}

// staleCaughtUp says whether a server's own state may answer stale reads.
func staleCaughtUp(v staleView) bool {
	if v.Applied < v.Floor {
		return false
	}
	switch v.State {
	case raft.Leader:
		return v.Leading
	case raft.Follower:
		return v.Contacted && v.Applied >= v.Commit
	}
	return false
}

// staleReadable reports whether this server may answer a stale read from
// its own state, and latches once it may.
func (s *Server) staleReadable() bool {
	if s.staleReadsLocal.Load() {
		return true
	}
	r := s.raft
	// Applied first: if the commit index moves on between the two reads,
	// the view is behind and the answer no.
	v := staleView{Applied: r.AppliedIndex(), Floor: s.staleFloor, State: r.State(), Leading: s.heartbeats.running()}
	v.Contacted = !r.LastContact().IsZero()
	v.Commit = r.CommitIndex()
	if !staleCaughtUp(v) {
		return false
	}
	if s.staleReadsLocal.CompareAndSwap(false, true) {
		s.logger.Info("caught up since start; stale reads are answered from this server's state", "applied_index", v.Applied)
	}
	return true
}
