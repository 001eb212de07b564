package agent

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/roamhq/roam/structs"
)

// notClientCert refuses h to an HTTPS caller whose certificate is a client
// certificate (client.<region>.roam, of any region). Every node holds
// one; a snapshot holds every node's secret and a restore replaces all
// state, so a client certificate is not an operator's for these, here as
// on the RPC port (nomad's serverOnlyMethods). The cli and server
// certificates, and callers without TLS, go on as before.
func notClientCert(h handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) (any, error) {
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			for _, name := range r.TLS.PeerCertificates[0].DNSNames {
				if strings.HasPrefix(name, "client.") && strings.HasSuffix(name, ".roam") {
					return nil, fmt.Errorf("%w: %s %s needs an operator's (cli) certificate, and the caller's is a client certificate",
						structs.ErrPermissionDenied, r.Method, r.URL.Path)
				}
			}
		}
		return h(w, r)
	}
}

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
