package agent

import (
	"net/http"

	"github.com/roamhq/roam/structs"
)

// raftConfiguration answers GET /v1/operator/raft/configuration in the
// shape of Nomad's api.RaftConfiguration.
func (s *HTTPServer) raftConfiguration(w http.ResponseWriter, r *http.Request) (any, error) {
	var args structs.GenericRequest
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	var reply structs.RaftConfigurationResponse
	if err := s.rpc(r, "Operator.RaftGetConfiguration", &args, &reply); err != nil {
		return nil, err
	}
	if reply.Servers == nil {
		reply.Servers = []*structs.RaftServer{}
	}
	m := s.localMeta()
	m.Index = reply.Index
	m.KnownLeader = false
	for _, srv := range reply.Servers {
		m.KnownLeader = m.KnownLeader || srv.Leader
	}
	setMeta(w, m)
	return &reply, nil
}

// peerParams reads ?id= or ?address=, exactly one of which names a peer
// unless optional allows neither.
func peerParams(r *http.Request, optional bool) (id, address string, err error) {
	q := r.URL.Query()
	id, address = q.Get("id"), q.Get("address")
	switch {
	case id != "" && address != "":
		return "", "", badRequest("must specify either id or address, not both")
	case id == "" && address == "" && !optional:
		return "", "", badRequest("must specify a peer by id or address")
	}
	return id, address, nil
}

// raftRemovePeer answers DELETE /v1/operator/raft/peer?id= (or ?address=).
func (s *HTTPServer) raftRemovePeer(w http.ResponseWriter, r *http.Request) (any, error) {
	id, address, err := peerParams(r, false)
	if err != nil {
		return nil, err
	}
	args := structs.RaftPeerRequest{ID: id, Address: address}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.GenericResponse
	if err := s.rpc(r, "Operator.RaftRemovePeerByID", &args, &reply); err != nil {
		return nil, err
	}
	m := s.localMeta()
	m.Index = max(reply.Index, m.Index)
	setMeta(w, m)
	w.WriteHeader(http.StatusOK)
	return nil, nil
}

// raftTransferLeadership answers PUT or POST
// /v1/operator/raft/transfer-leadership[?id=|?address=]. Without a target
// the leader picks the most up-to-date voter.
func (s *HTTPServer) raftTransferLeadership(w http.ResponseWriter, r *http.Request) (any, error) {
	id, address, err := peerParams(r, true)
	if err != nil {
		return nil, err
	}
	args := structs.TransferLeadershipRequest{PeerID: id, PeerAddress: address}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.TransferLeadershipResponse
	if err := s.rpc(r, "Operator.TransferLeadership", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, s.localMeta())
	return &reply, nil
}
