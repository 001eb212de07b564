package nomad

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/roamhq/roam/structs"
)

// ErrClusterMismatch is sent on Fatal when this server's Raft state
// belongs to another cluster than the servers it was told to join.
var ErrClusterMismatch = errors.New("server data dir belongs to another cluster")

// ClusterID returns the ID of the cluster this server's Raft state belongs
// to, or "" before one is assigned or learned. Raft state (the FSM) is the
// authority, so a snapshot restore brings its cluster's ID back; the data
// dir's marker stands in while the FSM has not replayed it yet.
func (s *Server) ClusterID() string {
	if m, err := s.fsm.State().ClusterMetadata(nil); err == nil && m != nil {
		return m.ClusterID
	}
	return s.markerClusterID()
}

func (s *Server) markerClusterID() string {
	if s.dataDir != nil {
		return s.dataDir.clusterID()
	}
	id, _ := s.memClusterID.Load().(string)
	return id
}

// hasClusterID reports whether the Raft state holds the cluster's ID.
func (s *Server) hasClusterID() bool {
	m, err := s.fsm.State().ClusterMetadata(nil)
	return err == nil && m != nil
}

// syncClusterID records the FSM's cluster ID in the marker when they
// differ (first assignment, or a restore of another cluster's snapshot).

func (s *Server) syncClusterID() {
	m, err := s.fsm.State().ClusterMetadata(nil)
	if err != nil || m == nil || m.ClusterID == s.markerClusterID() {
		return
	}
	s.setClusterID(m.ClusterID, "recorded from raft state")
}

// setClusterID records id in the marker (or, in dev mode, in memory).
func (s *Server) setClusterID(id, how string) {
	if s.dataDir != nil {
		if err := s.dataDir.setClusterID(id); err != nil {
			s.logger.Warn("could not record the cluster id in the data dir", "error", err)
			return
		}
	} else {
		s.memClusterID.Store(id)
	}
	s.logger.Info("cluster id "+how, "cluster_id", id)
}

// ensureClusterID, on the leader, writes the cluster's ID into Raft state
// if it has none, retrying until it is written or ctx ends.
func (s *Server) ensureClusterID(ctx context.Context) {
	for {
		err := s.writeClusterID()
		if err == nil {
			return
		}
		s.logger.Warn("could not write the cluster id; retrying", "error", err)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return
		}
	}
}

// writeClusterID writes the cluster's ID into Raft state if it has none:
// the one this data dir already records (a cluster from before IDs lived
// in Raft), or a new one.
func (s *Server) writeClusterID() error {
	if m, err := s.fsm.State().ClusterMetadata(nil); err == nil && m != nil {
		s.syncClusterID()
		return nil
	}
	id := s.markerClusterID()
	if id == "" {
		id = uuid.NewString()
	}
	req := &structs.ClusterMetadataRequest{Metadata: structs.ClusterMetadata{ClusterID: id, CreateTime: time.Now().UnixNano()}}
	if _, _, err := s.raftApply(structs.ClusterMetadataRequestType, req); err != nil {
		return err
	}
	s.syncClusterID()
	return nil
}

// Fatal delivers the error that makes this server unfit to go on, such as
// a data dir of another cluster. The agent exits on it.
func (s *Server) Fatal() <-chan error { return s.fatalCh }

func (s *Server) fatal(err error) {
	select {
	case s.fatalCh <- err:
		s.logger.Error("server cannot go on", "error", err)
	default:
	}
}

// clusterProbe tallies, over one probe round, the answers of servers that
// have a cluster ID.
type clusterProbe struct {
	same, other int
	// otherLeader is an answer from the leader of another cluster.
	otherLeader *structs.ServerJoinResponse
}

// judgeClusterProbe decides, after a probe round, whether this server's
// data dir is another cluster's: no server of its own cluster answered,
// and the leader of another one did. A server in a working cluster always
// hears from one of its own (a single-server cluster never probes), so it
// is never the one to go.
func (s *Server) judgeClusterProbe(p *clusterProbe) {
	ours := s.ClusterID()
	if ours == "" || p.same > 0 || p.otherLeader == nil {
		return
	}
	r := p.otherLeader
	dir := s.config.DataDir
	s.fatal(fmt.Errorf("%w: this server's data dir %s holds the raft state of cluster %s, "+
		"but the servers at retry_join answer for cluster %s (led by %s, %d of them answered): "+
		"the data dir was copied from another cluster or another cluster's servers are at these addresses. "+
		"Move %s aside and start this server on an empty data dir to join cluster %s, or point retry_join at cluster %s",
		ErrClusterMismatch, dir, ours, r.ClusterID, r.Self.Addr, p.other, dir, r.ClusterID, ours))
}

// learnClusterID records the cluster ID of the leader answering a probe
// if this server has none yet (a new server, before Raft has replicated
// the ID to it).
func (s *Server) learnClusterID(resp *structs.ServerJoinResponse) {
	if s.ClusterID() != "" || resp.ClusterID == "" || !resp.HasState || resp.LeaderAddr != resp.Self.Addr {
		return
	}
	s.setClusterID(resp.ClusterID, "learned from the leader")
}
