package nomad

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

const (
	// raftLinkInterval is how often keepRaftLinks looks at the links.
	raftLinkInterval = 250 * time.Millisecond
	// raftLinkRetry is how long it leaves a peer it could not reach.
	raftLinkRetry = 2 * time.Second
)

// keepRaftLinks keeps a live Raft connection to every other voter open,
// so that an election, the moment a change of leader is made of, does not
// begin with a dial.
//
// A follower sends Raft nothing, so it holds no connection to the other
// followers, and when it becomes a candidate it dials each peer before it
// can ask for its vote: a connection, the RPC listener's handshake and
// Raft's accept, on the critical path of every handoff. A server that
// holds no usable connection to a voter (none yet, or only ones the peer
// has closed since it restarted) sends that voter a probe (linkProbe)
// through Raft's own transport, which leaves the connection in the
// transport's pool.
func (s *Server) keepRaftLinks(ctx context.Context) {
	tick := time.NewTicker(raftLinkInterval)
	defer tick.Stop()
	var (
		mu sync.Mutex
		// probing holds the voters a probe is out to; failed, when each
		// voter's last probe failed. A probe to an unreachable voter can
		// take the transport's timeout, and must not hold up the others.
		probing = make(map[raft.ServerAddress]bool)
		failed  = make(map[raft.ServerAddress]time.Time)
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		fut := s.raft.GetConfiguration()
		if fut.Error() != nil {
			continue
		}
		for _, srv := range fut.Configuration().Servers {
			if srv.ID == raft.ServerID(s.config.NodeID) || srv.Suffrage != raft.Voter {
				continue
			}
			if s.raftLayer.linked(srv.Address) {
				continue
			}
			mu.Lock()
			at, hasFailed := failed[srv.Address]
			skip := probing[srv.Address] || hasFailed && time.Since(at) < raftLinkRetry
			if !skip {
				probing[srv.Address] = true
			}
			mu.Unlock()
			if skip {
				continue
			}
			s.goTracked(func() {
				err := s.probeRaftPeer(srv)
				mu.Lock()
				defer mu.Unlock()
				delete(probing, srv.Address)
				if err != nil {
					failed[srv.Address] = time.Now()
					s.logger.Debug("no raft connection to a voter", "id", srv.ID, "address", srv.Address, "error", err)
					return
				}
				delete(failed, srv.Address)
			})
		}
	}
}

// probeRaftPeer sends srv a probe, over a connection the transport then
// keeps.
func (s *Server) probeRaftPeer(srv raft.Server) error {
	local := raft.ServerID(s.config.NodeID)
	req := linkProbe(local, s.raftTransport.EncodePeer(local, s.raftTransport.LocalAddr()))
	var resp raft.AppendEntriesResponse
	return s.raftTransport.AppendEntries(srv.ID, srv.Address, req, &resp)
}

// linkProbe is the request keepRaftLinks sends: an AppendEntries of term
// 0, which Raft never sends (every leader's term is 1 or more). The
// receiving server's transport vets it like any Raft request, then
// answers it itself (raftTransport's relay) and never hands it to Raft: a
// Raft still at term 0 would take its sender for the leader.
func linkProbe(id raft.ServerID, addr []byte) *raft.AppendEntriesRequest {
	return &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(id), Addr: addr},
		Term:      0,
	}
}

// isLinkProbe reports whether rpc is a linkProbe.
func isLinkProbe(rpc raft.RPC) bool {
	req, ok := rpc.Command.(*raft.AppendEntriesRequest)
	return ok && req.Term == 0
}
