package nomad

import "github.com/roamhq/roam/nomad/readgate"

// staleReadable reports whether this server may answer a stale read from
// its own state (see readgate), and latches once it may. Until then
// forward sends stale reads on as default ones.
func (s *Server) staleReadable() bool {
	if s.staleReadsLocal.Load() {
		return true
	}
	r := s.raft
	// The FSM's applied index first: if the commit index moves on between
	// the reads, the view is behind and the answer no.
	v := readgate.View{Applied: s.fsm.Applied(), Floor: s.staleFloor, State: r.State(), Leading: s.heartbeats.running(),
		Contacted: !r.LastContact().IsZero(), CommitAtStart: s.staleCommitAtStart}
	v.Commit = r.CommitIndex()
	v.Target = v.Commit
	if idx, ok := s.commands.lastCommandThrough(v.Commit); ok {
		v.Target = idx
	}
	if !readgate.CaughtUp(v) {
		return false
	}
	if s.staleReadsLocal.CompareAndSwap(false, true) {
		s.logger.Info("caught up since start; stale reads are answered from this server's state",
			"applied_index", v.Applied, "commit_index", v.Commit)
	}
	return true
}
