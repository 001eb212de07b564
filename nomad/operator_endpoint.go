package nomad

import (
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
	now := time.Now()
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
		rs := reply.Servers[len(reply.Servers)-1]
		switch last, ok := op.srv.members.lastSeen(rs.ID); {
		case rs.ID == op.srv.ID():
			rs.Healthy = true
		case ok:
			rs.LastContact = now.Sub(last)
			rs.Healthy = rs.LastContact <= op.srv.config.MemberFailAfter
		default:
			rs.LastContact = -1
		}
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
	// Forgotten first: the leader's reconcile loop, reading the new
	// configuration, must not find it alive and add it straight back.
	op.srv.members.markLeft(string(target.ID))
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
	// The same drain-then-transfer as a leader that shuts down, except that
	// this server stays up and, should the transfer fail, keeps leading.
	h, err := op.srv.handoff(op.srv.shutdownCtx, args.PeerID, args.PeerAddress, true)
	if err != nil {
		return err
	}
	reply.NewLeaderID, reply.NewLeaderAddr = h.ID, h.Addr
	return nil
}
