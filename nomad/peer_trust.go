package nomad

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net"
	"time"

	memdb "github.com/hashicorp/go-memdb"

	"github.com/hashicorp/raft"
	"github.com/roamhq/roam/structs"
)

// Who is a server? Every decision the server makes about whether a caller
// is another server of this cluster lives in this file. With TLS and
// verify_server_hostname, a certificate naming server.<region>.roam is the
// proof (see peer_tls.go); the checks below hold with or without it.
//
// Without TLS nothing on the wire proves who sent it, so the checks below
// rest on what a stranger does not know or cannot answer for:
//
//   - A Raft RPC must name, in its header, a server ID and address that
//     are both in this server's Raft configuration. Before this server
//     belongs to a configuration, the address must be one it probed and
//     that answered as a server of this region, or one named in
//     server_join.
//   - A server is learnt only from its own answer at its own address: a
//     Join announces an address to probe, never a member.
//   - A relayed call to a node (ClientRPC.Forward) must carry that node's
//     secret, which only the servers (from the state store) and the node
//     itself hold.
//
// The limit, stated plainly: the Raft header is what the sender says.
// Server IDs and addresses are not secret (the HTTP API lists them), so a
// sender that writes a real server's into its header is not told apart
// from it. These checks stop blind forgeries; only TLS stops deliberate
// ones.

// ErrNotAServer is returned to a caller that reached a server-only
// surface without showing it is a server of this cluster.
var ErrNotAServer = fmt.Errorf("%w: caller is not a server of this cluster", structs.ErrPermissionDenied)

// trustedPeer is what a caller showed about itself. Each surface fills in
// what it has.
type trustedPeer struct {
	// conn is the connection the caller is on, when the surface has it
	// (a Raft connection). A TLS certificate would be read from it.
	conn net.Conn
	// raftID and raftAddr are what a Raft RPC header claims.
	raftID, raftAddr string
	// relay is a ClientRPC.Forward request: its token must be its
	// target node's secret.
	relay *structs.ClientRPCForwardRequest
}

// callerIsServer reports whether p may act as a server of this cluster,
// and why not when it may not. It is the one place that decides.
func (s *Server) callerIsServer(p trustedPeer) error {
	// With verify_server_hostname, a certificate decides first: on a
	// connection, only a server certificate of this region is a server
	// (handleConn has already refused any other; this keeps the rule in
	// one place for every surface that has the connection).
	if p.conn != nil && s.config.TLS.VerifyServerHostname() {
		if role, isTLS := peerRoleFromTLS(p.conn); !isTLS || role != peerServer {
			return fmt.Errorf("%w: the peer's certificate is not a server certificate", ErrNotAServer)
		}
	}
	switch {
	case p.relay != nil:
		return s.relayFromServer(p.relay)
	case p.raftID != "" || p.raftAddr != "":
		return s.raftHeaderFromServer(p.raftID, p.raftAddr)
	case p.conn != nil:
		// Without TLS a connection shows nothing; every Raft RPC on it is
		// checked by its header.
		return nil
	}
	return fmt.Errorf("%w: caller showed nothing", ErrNotAServer)
}

// raftHeaderFromServer checks what a Raft RPC header claims: a server ID
// and address both in the Raft configuration, or, before this server
// belongs to one, an address it probed or that server_join names.
func (s *Server) raftHeaderFromServer(id, addr string) error {
	if id == "" || addr == "" {
		return fmt.Errorf("%w: raft rpc names no server id and address", ErrNotAServer)
	}
	if s.raft == nil {
		return fmt.Errorf("%w: raft is not running", ErrNotAServer)
	}
	cfg := s.raft.GetConfiguration()
	if err := cfg.Error(); err != nil {
		return fmt.Errorf("%w: read raft configuration: %w", ErrNotAServer, err)
	}
	servers := cfg.Configuration().Servers
	if len(servers) == 0 {
		// Not part of a cluster yet: a leader adding this server is a
		// server this one probed, or one its operator named.
		if s.members.answeredAt(addr) || s.isRetryJoinAddr(addr) {
			return nil
		}
		return fmt.Errorf("%w: raft rpc from %s (%s), which is neither a probed server nor in server_join",
			ErrNotAServer, id, addr)
	}
	for _, srv := range servers {
		if string(srv.ID) == id && string(srv.Address) == addr {
			return nil
		}
	}
	return fmt.Errorf("%w: raft rpc from %s (%s), which is not in the raft configuration",
		ErrNotAServer, id, addr)
}

// vetRaftConn is the check of a connection that asks for Raft.
func (s *Server) vetRaftConn(conn net.Conn) error {
	err := s.callerIsServer(trustedPeer{conn: conn})
	if err != nil {
		s.connRejected("raft_not_server", "raft connection refused: peer is not a server of this cluster",
			"remote", conn.RemoteAddr(), "error", err)
	}
	return err
}

// vetRaftRPC is the Raft transport's check of every incoming RPC.
func (s *Server) vetRaftRPC(rpc raft.RPC) error {
	h, ok := rpc.Command.(raft.WithRPCHeader)
	if !ok {
		return fmt.Errorf("%w: raft rpc without a header", ErrNotAServer)
	}
	hdr := h.GetRPCHeader()
	err := s.callerIsServer(trustedPeer{raftID: string(hdr.ID), raftAddr: string(hdr.Addr)})
	if err != nil {
		s.connRejected("raft_not_server", "raft rpc refused: sender is not a server of this cluster",
			"id", string(hdr.ID), "address", string(hdr.Addr), "rpc", fmt.Sprintf("%T", rpc.Command))
	}
	return err
}

// isRetryJoinAddr reports whether addr is named in server_join.
func (s *Server) isRetryJoinAddr(addr string) bool {
	for _, a := range s.config.RetryJoin {
		if a == addr {
			return true
		}
	}
	return false
}

// nodeRelayAllowed checks that a ClientRPC.Forward request comes from a
// server.
func (s *Server) nodeRelayAllowed(args *structs.ClientRPCForwardRequest) error {
	return s.callerIsServer(trustedPeer{relay: args})
}

// relayFromServer checks a ClientRPC.Forward request: it must carry the
// target node's secret, which a server reads from its state store. The
// node itself could show it too, and reach only itself that way.
func (s *Server) relayFromServer(args *structs.ClientRPCForwardRequest) error {
	if args.Session() != nil {
		// Only servers relay: a node must not reach other nodes through us.
		return fmt.Errorf("%w: ClientRPC.Forward is for servers, not client sessions", ErrNotAServer)
	}
	if args.AuthToken == "" {
		return fmt.Errorf("%w: ClientRPC.Forward without the node's secret", ErrNotAServer)
	}
	node, err := s.nodeAtIndex(args.NodeID, args.NodeIndex)
	if err != nil {
		return err
	}
	if node == nil {
		return fmt.Errorf("%w: %s", structs.ErrUnknownNode, args.NodeID)
	}
	if node.SecretID == "" || subtle.ConstantTimeCompare([]byte(node.SecretID), []byte(args.AuthToken)) != 1 {
		return fmt.Errorf("%w: ClientRPC.Forward with a token that is not node %s's secret", ErrNotAServer, args.NodeID)
	}
	return nil
}

// isOperator reports whether token carries an operator's authority: it
// is the operator_token configured on the servers. An empty token never
// is, and neither is anything while no operator token is configured.
func (s *Server) isOperator(token string) bool {
	op := s.config.OperatorToken
	return token != "" && op != "" && subtle.ConstantTimeCompare([]byte(token), []byte(op)) == 1
}

// introAllowed checks a new node's introduction credential. A cluster
// whose servers name no client intro tokens takes any new node; one that
// does takes only a node that shows one of them, or, with
// verify_server_hostname, its client certificate.
func (s *Server) introAllowed(token string) error {
	if len(s.config.ClientIntroTokens) == 0 {
		return nil
	}
	if s.config.TLS.VerifyServerHostname() {
		// Every caller that reaches Node.Register then holds a client or
		// server certificate this cluster's CA signed (handleConn refuses
		// the rest): the certificate is the introduction.
		return nil
	}
	if token == "" {
		return fmt.Errorf("%w: a new node must show an intro token (client intro_token) to register", structs.ErrPermissionDenied)
	}
	for _, t := range s.config.ClientIntroTokens {
		if t != "" && subtle.ConstantTimeCompare([]byte(token), []byte(t)) == 1 {
			return nil
		}
	}
	return fmt.Errorf("%w: intro token is not one the servers accept", structs.ErrPermissionDenied)
}

// relayCatchUp bounds how long a relaying server waits for its state to
// reach the node record the calling server read.
const relayCatchUp = 2 * time.Second

// nodeAtIndex returns the node as this server's state has it, once that
// state holds the node at index or later, waiting at most relayCatchUp: a
// node that registered through the leader a moment ago may not have
// reached this follower yet.
func (s *Server) nodeAtIndex(nodeID string, index uint64) (*structs.Node, error) {
	ctx, cancel := context.WithTimeout(s.shutdownCtx, relayCatchUp)
	defer cancel()
	for {
		store := s.State()
		ws := memdb.NewWatchSet()
		ws.Add(store.AbandonCh())
		node, err := store.NodeByID(ws, nodeID)
		if err != nil {
			return nil, err
		}
		if node != nil && node.ModifyIndex >= index {
			return node, nil
		}
		if err := ws.WatchCtx(ctx); err != nil {
			return node, nil // as far as this server knows
		}
	}
}
