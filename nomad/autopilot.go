package nomad

import (
	"sort"
	"time"

	metrics "github.com/hashicorp/go-metrics"
	"github.com/hashicorp/raft"
)

// DefaultDeadServerCleanupAfter is how long a voter may stay unreachable
// before the leader removes it from the Raft configuration.
const DefaultDeadServerCleanupAfter = 24 * time.Hour

// peerHealth is what the leader knows of one voter's reachability.
type peerHealth struct {
	ID      raft.ServerID
	Address raft.ServerAddress
	// Unreachable is how long the peer has gone unheard: since its last
	// answer, or since this server started leading if it never answered
	// this leader. Zero for a peer heard from within the fail time.
	Unreachable time.Duration
	// Healthy is set for this server and for peers heard from within the
	// fail time.
	Healthy bool
}

// deadServersToRemove decides which voter, if any, the leader removes:
// the one unreachable longest, once that exceeds after, and only while
//   - a majority of the current voters is healthy (a leader cut off from
//     the rest must not shrink the cluster it cannot reach), and
//   - the voters left number at least minVoters, a majority of the
//     cluster's expected size, so the cluster never shrinks below a size
//     that the servers that should be there could not outvote.
//
// One at a time: each removal is a configuration change that must commit
// before the next is judged.
func deadServersToRemove(peers []peerHealth, after time.Duration, minVoters int) (raft.ServerID, bool) {
	if after <= 0 || len(peers) == 0 {
		return "", false
	}
	healthy := 0
	for _, p := range peers {
		if p.Healthy {
			healthy++
		}
	}
	if healthy < len(peers)/2+1 || len(peers)-1 < max(minVoters, 1) {
		return "", false
	}
	dead := make([]peerHealth, 0, len(peers))
	for _, p := range peers {
		if !p.Healthy && p.Unreachable > after {
			dead = append(dead, p)
		}
	}
	if len(dead) == 0 {
		return "", false
	}
	sort.Slice(dead, func(i, j int) bool {
		if dead[i].Unreachable != dead[j].Unreachable {
			return dead[i].Unreachable > dead[j].Unreachable
		}
		return dead[i].ID < dead[j].ID
	})
	return dead[0].ID, true
}

// peersHealth reports every server of cfg as the member list knows it.
// leaderSince bounds how long a peer never heard by this leader counts as
// unreachable.
func (s *Server) peersHealth(cfg raft.Configuration, now, leaderSince time.Time) []peerHealth {
	out := make([]peerHealth, 0, len(cfg.Servers))
	for _, srv := range cfg.Servers {
		if srv.Suffrage != raft.Voter {
			continue
		}
		p := peerHealth{ID: srv.ID, Address: srv.Address}
		if string(srv.ID) == s.config.NodeID {
			p.Healthy = true
			out = append(out, p)
			continue
		}
		last, ok := s.members.lastSeen(string(srv.ID))
		if !ok || last.Before(leaderSince) {
			last = leaderSince
		}
		if gone := now.Sub(last); gone > s.config.MemberFailAfter {
			p.Unreachable = gone
		} else {
			p.Healthy = true
		}
		out = append(out, p)
	}
	return out
}

// pruneDeadServers removes, on the leader, a voter unreachable for longer
// than DeadServerCleanupAfter when deadServersToRemove allows it.
func (s *Server) pruneDeadServers(leaderSince time.Time) {
	after := s.config.DeadServerCleanupAfter
	if after <= 0 {
		return
	}
	future := s.raft.GetConfiguration()
	if err := future.Error(); err != nil {
		return
	}
	peers := s.peersHealth(future.Configuration(), time.Now(), leaderSince)
	healthy := 0
	for _, p := range peers {
		if p.Healthy {
			healthy++
		}
	}
	metrics.SetGauge([]string{"autopilot", "healthy_voters"}, float32(healthy))
	metrics.SetGauge([]string{"autopilot", "voters"}, float32(len(peers)))
	minVoters := s.config.BootstrapExpect/2 + 1
	id, ok := deadServersToRemove(peers, after, minVoters)
	if !ok {
		return
	}
	var victim peerHealth
	for _, p := range peers {
		if p.ID == id {
			victim = p
		}
	}
	s.logger.Warn("removing dead server from the raft configuration",
		"id", victim.ID, "address", victim.Address, "unreachable_for", victim.Unreachable.Round(time.Second),
		"dead_server_cleanup_after", after, "voters_left", len(peers)-1)
	// Forgotten first, as for an operator's remove-peer: the reconcile
	// loop must not add it straight back.
	s.members.markLeft(string(id))
	if err := s.raft.RemoveServer(id, 0, 0).Error(); err != nil {
		s.logger.Warn("could not remove dead server", "id", id, "error", err)
		return
	}
	metrics.IncrCounter([]string{"autopilot", "dead_server_removed"}, 1)
}
