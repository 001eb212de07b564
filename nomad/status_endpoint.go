package nomad

import (
	"fmt"

	"github.com/roamhq/roam/structs"
)

// Status answers liveness and membership questions. Its reads are answered
// by the server called, without forwarding.
type Status struct {
	srv *Server
}

// Ping answers if the server is up.
func (st *Status) Ping(args *structs.GenericRequest, reply *structs.StatusPingResponse) error {
	return nil
}

// Leader returns the leader's RPC address, or "" when none is known.
func (st *Status) Leader(args *structs.GenericRequest, reply *string) error {
	if r := args.Region; r != "" && r != st.srv.config.Region {
		return structs.ErrWrongRegion
	}
	*reply, _ = st.srv.Leader()
	return nil
}

// Peers returns the RPC addresses of the Raft voters.
func (st *Status) Peers(args *structs.GenericRequest, reply *[]string) error {
	if r := args.Region; r != "" && r != st.srv.config.Region {
		return structs.ErrWrongRegion
	}
	cfg, _, err := st.srv.raftConfiguration()
	if err != nil {
		return err
	}
	peers := make([]string, 0, len(cfg.Servers))
	for _, s := range cfg.Servers {
		peers = append(peers, string(s.Address))
	}
	*reply = peers
	return nil
}

// Members lists the servers this server knows, with their liveness.
func (st *Status) Members(args *structs.GenericRequest, reply *structs.ServerMembersResponse) error {
	srv := st.srv
	_, leaderID := srv.Leader()
	voters := make(map[string]bool)
	if cfg, _, err := srv.raftConfiguration(); err == nil {
		for _, s := range cfg.Servers {
			voters[string(s.ID)] = true
		}
	}
	members := srv.members.list()
	for _, m := range members {
		m.Leader = m.ID == leaderID
		m.Voter = voters[m.ID]
	}
	*reply = structs.ServerMembersResponse{
		ServerName:   srv.config.NodeName,
		ServerRegion: srv.config.Region,
		ServerDC:     srv.config.Datacenter,
		Members:      members,
	}
	return nil
}

// Join is called by another server to announce itself; the reply tells it
// what this server knows. The caller's claims are not taken at their word:
// its address is only added to those this server probes, and it becomes a
// member once it answers a probe there as a server of this region (see
// peer_trust.go). So a Join naming a made-up or someone else's address
// adds no voter and replaces none.
func (st *Status) Join(args *structs.ServerJoinRequest, reply *structs.ServerJoinResponse) error {
	srv := st.srv
	if args.Member.ID == "" || args.Member.Addr == "" {
		return fmt.Errorf("%w: join names no server id and address", structs.ErrInvalidRequest)
	}
	if args.Session() != nil {
		return fmt.Errorf("%w: Status.Join is for servers, not client sessions", ErrNotAServer)
	}
	ours := srv.ClusterID()
	foreign := ours != "" && args.ClusterID != "" && args.ClusterID != ours
	if foreign {
		// Answered, so it can tell it is in the wrong place, but never
		// counted as a member: the leader would add it as a voter.
		srv.logger.Warn("ignoring a server of another cluster", "id", args.Member.ID, "address", args.Member.Addr,
			"its_cluster_id", args.ClusterID, "cluster_id", ours)
	} else if args.Member.Region == srv.config.Region {
		// A Join only names an address to probe: the server becomes a
		// member by answering there (see probeMembers).
		if !srv.members.learn(args.Member.Addr) {
			srv.connRejected("join_probe_list_full", "join not recorded: too many server addresses to probe",
				"address", args.Member.Addr, "limit", maxProbeAddrs)
		}
	}
	leaderAddr, _ := srv.Leader()
	*reply = structs.ServerJoinResponse{
		Self:       *srv.selfMember(),
		HasState:   srv.hasRaftState.Load(),
		LeaderAddr: leaderAddr,
		ClusterID:  ours,
	}
	if !foreign {
		reply.Members = srv.members.list()
	}
	return nil
}

// CancelQuery ends a blocking query that this server is answering for
// another server, once that server's caller has left (see queryCancels).
// It is answered here, never forwarded: the query waits on this server.
func (st *Status) CancelQuery(args *structs.QueryCancelRequest, reply *structs.QueryCancelResponse) error {
	reply.Cancelled = st.srv.queryCancels.cancel(args.CancelID)
	return nil
}

// Leadership returns the leadership changes this server saw, oldest
// first. It is forwarded to the leader unless the read allows stale, as
// the leader holds the exact gap of the latest change.
func (st *Status) Leadership(args *structs.GenericRequest, reply *structs.LeadershipHistoryResponse) error {
	if done, err := st.srv.forward("Status.Leadership", args, args, reply); done {
		return err
	}
	reply.ServerID = st.srv.ID()
	reply.Changes = st.srv.leadership.list()
	reply.Index = max(st.srv.raft.AppliedIndex(), 1)
	_, leaderID := st.srv.Leader()
	reply.KnownLeader = leaderID != ""
	return nil
}
