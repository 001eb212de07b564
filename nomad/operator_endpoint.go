package nomad

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"github.com/roamhq/roam/structs"
)

// Operator serves Raft administration.
type Operator struct {
	srv *Server
}

// RaftGetConfiguration returns the Raft configuration as the leader has it.
func (op *Operator) RaftGetConfiguration(args *structs.GenericRequest, reply *structs.RaftConfigurationResponse) error {
	if done, err := op.srv.forward("Operator.RaftGetConfiguration", args, args, reply); done {
		return err
	}
	cfg, index, err := op.srv.raftConfiguration()
	if err != nil {
		return err
	}
	names := make(map[string]string)
	for _, m := range op.srv.members.list() {
		names[m.ID] = m.Name
	}
	_, leaderID := op.srv.Leader()
	reply.Index = index
	reply.Servers = make([]*structs.RaftServer, 0, len(cfg.Servers))
	for _, s := range cfg.Servers {
		reply.Servers = append(reply.Servers, &structs.RaftServer{
			ID:           string(s.ID),
			Node:         names[string(s.ID)],
			Address:      string(s.Address),
			Leader:       string(s.ID) == leaderID,
			Voter:        s.Suffrage == raft.Voter,
			RaftProtocol: "3",
		})
	}
	return nil
}

// RaftRemovePeerByID removes a server from the Raft configuration, named by
// ID or, failing that, by address.
func (op *Operator) RaftRemovePeerByID(args *structs.RaftPeerRequest, reply *structs.GenericResponse) error {
	if done, err := op.srv.forward("Operator.RaftRemovePeerByID", args, args, reply); done {
		return err
	}
	cfg, _, err := op.srv.raftConfiguration()
	if err != nil {
		return err
	}
	var target *raft.Server
	for i := range cfg.Servers {
		s := &cfg.Servers[i]
		if (args.ID != "" && string(s.ID) == args.ID) || (args.ID == "" && args.Address != "" && string(s.Address) == args.Address) {
			target = s
		}
	}
	if target == nil {
		return fmt.Errorf("%w: no raft peer with id %q address %q", structs.ErrNotFound, args.ID, args.Address)
	}
	f := op.srv.raft.RemoveServer(target.ID, 0, 0)
	if err := f.Error(); err != nil {
		return fmt.Errorf("remove raft peer %s: %w", target.ID, err)
	}
	reply.Index = f.Index()
	op.srv.logger.Info("removed raft peer", "id", target.ID, "address", target.Address)
	return nil
}

// TransferLeadership hands leadership to the named voter, or to the most
// up-to-date one, and returns once a new leader is known.
func (op *Operator) TransferLeadership(args *structs.TransferLeadershipRequest, reply *structs.TransferLeadershipResponse) error {
	if done, err := op.srv.forward("Operator.TransferLeadership", args, args, reply); done {
		return err
	}
	ctx, cancel := context.WithTimeout(op.srv.shutdownCtx, op.srv.config.RPCHoldTimeout)
	defer cancel()
	id, addr, err := op.srv.transferLeadership(ctx, args.PeerID, args.PeerAddress)
	if err != nil {
		return err
	}
	reply.NewLeaderID, reply.NewLeaderAddr = id, addr
	return nil
}

// errNoTransferTarget means there is no other voter to hand leadership to.
var errNoTransferTarget = fmt.Errorf("%w: no other voter to transfer leadership to", structs.ErrInvalidRequest)

// transferLeadership asks Raft to hand over to the given peer (by ID or
// address), or to the best voter when none is named, and waits until this
// server sees another leader.
func (s *Server) transferLeadership(ctx context.Context, peerID, peerAddr string) (string, string, error) {
	if !s.IsLeader() {
		return "", "", structs.ErrNoLeader
	}
	cfg, _, err := s.raftConfiguration()
	if err != nil {
		return "", "", err
	}
	var target *raft.Server
	voters := 0
	for i := range cfg.Servers {
		srv := &cfg.Servers[i]
		if srv.ID == raft.ServerID(s.config.NodeID) || srv.Suffrage != raft.Voter {
			continue
		}
		voters++
		if (peerID != "" && string(srv.ID) == peerID) || (peerID == "" && peerAddr != "" && string(srv.Address) == peerAddr) {
			target = srv
		}
	}
	if voters == 0 {
		return "", "", errNoTransferTarget
	}
	if (peerID != "" || peerAddr != "") && target == nil {
		return "", "", fmt.Errorf("%w: no other voter with id %q address %q", structs.ErrNotFound, peerID, peerAddr)
	}

	start := time.Now()
	var f raft.Future
	if target != nil {
		f = s.raft.LeadershipTransferToServer(target.ID, target.Address)
	} else {
		f = s.raft.LeadershipTransfer()
	}
	if err := f.Error(); err != nil {
		return "", "", fmt.Errorf("leadership transfer: %w", err)
	}
	for {
		changed := s.leaderChanged()
		addr, id := s.Leader()
		if id != "" && id != s.config.NodeID {
			s.logger.Info("leadership transferred", "new_leader", id, "address", addr, "took", time.Since(start))
			return id, addr, nil
		}
		// Leader observations are not guaranteed (Raft drops them when no
		// one is reading), so look again now and then as well.
		select {
		case <-changed:
		case <-time.After(25 * time.Millisecond):
		case <-ctx.Done():
			return "", "", fmt.Errorf("waiting for the new leader: %w", ctx.Err())
		}
	}
}
