package nomad

import (
	"context"
	"errors"
	"fmt"
	"net/rpc"
	"sync"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/yamux"
	"github.com/roamhq/roam/structs"
)

// Server-to-client calls. A client opens one yamux session to one server;
// once the node authenticates on it (Node.Register or Node.UpdateStatus
// succeeds), that server records the session under the node's ID. A call to
// the node opens a stream on the session, or, when another server holds it,
// is relayed there with ClientRPC.Forward.

// defaultClientRPCTimeout bounds a relayed call whose caller set no deadline.
const defaultClientRPCTimeout = 30 * time.Second

// nodeConn is one recorded client session.
type nodeConn struct {
	session *yamux.Session
	// established is when this session was first recorded for the node.
	established time.Time
}

// nodeConns maps node IDs to the client sessions this server holds. An
// entry lives from the node's first authenticated call on a session until
// that session closes (serveSession removes it) or a newer session of the
// same node replaces it.
type nodeConns struct {
	mu    sync.Mutex
	conns map[string]nodeConn
}

func newNodeConns() *nodeConns {
	return &nodeConns{conns: make(map[string]nodeConn)}
}

// add records session for nodeID, replacing another session, and keeps the
// established time of one already recorded.
func (n *nodeConns) add(nodeID string, session *yamux.Session) {
	n.mu.Lock()
	if cur, ok := n.conns[nodeID]; !ok || cur.session != session {
		n.conns[nodeID] = nodeConn{session: session, established: time.Now()}
	}
	n.mu.Unlock()
	// serveSession removes a session after it is closed. If it closed before
	// the entry went in, that removal may have come first: undo the add.
	if session.IsClosed() {
		n.remove(nodeID, session)
	}
}

// remove forgets nodeID's session if it is still session.
func (n *nodeConns) remove(nodeID string, session *yamux.Session) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if cur, ok := n.conns[nodeID]; ok && cur.session == session {
		delete(n.conns, nodeID)
	}
}

// removeSession forgets every node recorded on session.
func (n *nodeConns) removeSession(session *yamux.Session) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for id, c := range n.conns {
		if c.session == session {
			delete(n.conns, id)
		}
	}
}

// get returns nodeID's live session.
func (n *nodeConns) get(nodeID string) (nodeConn, bool) {
	n.mu.Lock()
	c, ok := n.conns[nodeID]
	n.mu.Unlock()
	if !ok || c.session.IsClosed() {
		return nodeConn{}, false
	}
	return c, true
}

// nodeSession returns the session this server holds for nodeID.
func (s *Server) nodeSession(nodeID string) (*yamux.Session, bool) {
	c, ok := s.nodeConns.get(nodeID)
	return c.session, ok
}

// recordNodeSession remembers the session a node's request arrived on. Call
// it only once the request has authenticated as nodeID (the handler, or the
// leader it was forwarded to, accepted the node's secret).
func (s *Server) recordNodeSession(nodeID string, args interface{ Session() any }) {
	if nodeID == "" {
		return
	}
	if session, ok := args.Session().(*yamux.Session); ok && session != nil {
		s.nodeConns.add(nodeID, session)
	}
}

// clientRPC calls method on the client agent of nodeID, over the session
// this server holds or through the server that holds it. It returns when
// the reply arrives or ctx ends. A node no server holds a session for, or
// one whose session cannot take a new call, is an error wrapping
// structs.ErrNodeNotConnected: the call never reached it. A call cut short
// once sent (the session or the relaying server lost mid-call, or ctx
// ending) wraps structs.ErrOutcomeUnknown. The client handler's own error
// comes back mapped to its sentinel.
func (s *Server) clientRPC(ctx context.Context, nodeID, method string, args, reply any) error {
	if session, ok := s.nodeSession(nodeID); ok {
		return callNodeSession(ctx, session, nodeID, method, args, reply)
	}
	addr, err := s.findNodeServer(ctx, nodeID)
	if err != nil {
		return err
	}
	return s.forwardClientRPC(ctx, addr, nodeID, method, args, reply)
}

// callNodeSession makes one call on a new stream of session.
func callNodeSession(ctx context.Context, session *yamux.Session, nodeID, method string, args, reply any) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("client rpc %s to node %s: %w", method, nodeID, err)
	}
	stream, err := session.OpenStream()
	if err != nil {
		return fmt.Errorf("%w: node %s: open stream: %w", structs.ErrNodeNotConnected, nodeID, err)
	}
	if _, err := stream.Write([]byte{structs.RPCNomad}); err != nil {
		stream.Close()
		return fmt.Errorf("%w: node %s: %w", structs.ErrNodeNotConnected, nodeID, err)
	}
	client := rpc.NewClientWithCodec(structs.NewClientCodec(stream))
	defer client.Close()

	// From here on the request may have reached the client: a call cut
	// short has an unknown outcome, not a client that was never reached.
	call := client.Go(method, args, reply, make(chan *rpc.Call, 1))
	select {
	case <-call.Done:
	case <-ctx.Done():
		// Unblock net/rpc's reader and wait for it, so it is not still
		// decoding into reply once the caller has it back.
		_ = stream.SetReadDeadline(time.Now())
		client.Close()
		<-call.Done
		return fmt.Errorf("client rpc %s to node %s: %w: %w", method, nodeID, structs.ErrOutcomeUnknown, ctx.Err())
	}
	if err := call.Error; err != nil {
		var serverErr rpc.ServerError
		if errors.As(err, &serverErr) {
			return structs.FromRPCError(err)
		}
		return fmt.Errorf("client rpc %s to node %s: %w: connection lost mid-call: %w", method, nodeID, structs.ErrOutcomeUnknown, err)
	}
	return nil
}

// otherServers returns the addresses of every other server this one knows:
// alive members and Raft peers.
func (s *Server) otherServers() []string {
	seen := map[string]bool{s.advertise: true}
	var out []string
	for _, m := range s.members.alive() {
		if !seen[m.Addr] {
			seen[m.Addr] = true
			out = append(out, m.Addr)
		}
	}
	if cfg, _, err := s.raftConfiguration(); err == nil {
		for _, srv := range cfg.Servers {
			if addr := string(srv.Address); !seen[addr] {
				seen[addr] = true
				out = append(out, addr)
			}
		}
	}
	return out
}

// findNodeServer asks every other server whether it holds nodeID's session
// and returns the address of the one whose session is newest: a client that
// moved may leave a dying session behind on its old server.
func (s *Server) findNodeServer(ctx context.Context, nodeID string) (string, error) {
	return s.pickNodeServer(ctx, nodeID, s.otherServers(), nodeServerGrace,
		func(ctx context.Context, addr string) (structs.NodeConnQueryResponse, error) {
			qctx, cancel := context.WithTimeout(ctx, s.config.RPCHoldTimeout)
			defer cancel()
			req := structs.NodeSpecificRequest{
				NodeID:       nodeID,
				QueryOptions: structs.QueryOptions{Region: s.config.Region, AllowStale: true},
			}
			var resp structs.NodeConnQueryResponse
			err := s.connPool.RPC(qctx, addr, "Status.HasNodeConn", &req, &resp)
			return resp, err
		})
}

// nodeServerGrace is how long findNodeServer still waits for the other
// servers once one has said it holds the node's session: ample for any
// server it can reach to answer too, so that the newest session wins. A
// server silent after that is cut off or stuck, and a session it holds
// could not carry the call anyway; waiting for it (up to the hold
// timeout) would stall every call relayed while one server is
// partitioned, and with it the plugin's lane.
const nodeServerGrace = 250 * time.Millisecond

// pickNodeServer runs query against every server in servers at once and
// returns the one holding the newest session for nodeID: once all have
// answered, or grace after the first that holds one.
func (s *Server) pickNodeServer(ctx context.Context, nodeID string, servers []string, grace time.Duration,
	query func(context.Context, string) (structs.NodeConnQueryResponse, error)) (string, error) {
	type answer struct {
		addr string
		resp structs.NodeConnQueryResponse
		err  error
	}
	qctx, cancel := context.WithCancel(ctx)
	defer cancel() // the queries still out are not waited for
	answers := make(chan answer, len(servers))
	for _, addr := range servers {
		go func() {
			resp, err := query(qctx, addr)
			answers <- answer{addr: addr, resp: resp, err: err}
		}()
	}

	var (
		best    string
		newest  time.Time
		lastErr error
		graceC  <-chan time.Time
	)
	for pending := len(servers); pending > 0; {
		var a answer
		select {
		case a = <-answers:
			pending--
		case <-graceC:
			s.logger.Debug("node's session found; not waiting for servers that have not answered",
				"node_id", nodeID, "server", best, "unanswered", pending)
			return best, nil
		case <-ctx.Done():
			return "", fmt.Errorf("find server of node %s: %w", nodeID, ctx.Err())
		}
		if a.err != nil {
			lastErr = a.err
			s.logger.Debug("node connection query failed", "server", a.addr, "node_id", nodeID, "error", a.err)
			continue
		}
		if a.resp.Connected && (best == "" || a.resp.Established.After(newest)) {
			best, newest = a.addr, a.resp.Established
			if graceC == nil {
				t := time.NewTimer(grace)
				defer t.Stop()
				graceC = t.C
			}
		}
	}
	if best != "" {
		return best, nil
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up: say so, not that the node has no session.
		return "", fmt.Errorf("find server of node %s: %w", nodeID, err)
	}
	if lastErr != nil {
		return "", fmt.Errorf("%w: node %s (some servers did not answer: %v)", structs.ErrNodeNotConnected, nodeID, lastErr)
	}
	return "", fmt.Errorf("%w: node %s", structs.ErrNodeNotConnected, nodeID)
}

// forwardClientRPC relays a call to the server at addr, which holds the
// node's session. Arguments and reply travel msgpack-encoded, so the relay
// needs no knowledge of their types.
func (s *Server) forwardClientRPC(ctx context.Context, addr, nodeID, method string, args, reply any) error {
	var body []byte
	if err := codec.NewEncoderBytes(&body, structs.MsgpackHandle).Encode(args); err != nil {
		return fmt.Errorf("client rpc %s: encode args: %w", method, err)
	}
	// The relaying server takes the node's secret as proof that the call
	// comes from a server (see nodeRelayAllowed).
	node, err := s.State().NodeByID(nil, nodeID)
	if err != nil {
		return fmt.Errorf("client rpc %s: read node %s: %w", method, nodeID, err)
	}
	if node == nil {
		return fmt.Errorf("%w: %s", structs.ErrUnknownNode, nodeID)
	}
	req := structs.ClientRPCForwardRequest{
		NodeID:       nodeID,
		Method:       method,
		Args:         body,
		NodeIndex:    node.ModifyIndex,
		LeaderTerm:   laneTerm(ctx),
		WriteRequest: structs.WriteRequest{Region: s.config.Region, AuthToken: node.SecretID},
	}
	if dl, ok := ctx.Deadline(); ok {
		req.Timeout = time.Until(dl)
	}
	var resp structs.ClientRPCForwardResponse
	err = s.connPool.RPC(ctx, addr, "ClientRPC.Forward", &req, &resp)
	switch {
	case err == nil:
	case errors.Is(err, errDial):
		return fmt.Errorf("%w: node %s via server %s: %w", structs.ErrNodeNotConnected, nodeID, addr, err)
	case errors.Is(err, errConnLost), ctx.Err() != nil:
		// The relay may have passed the call on before it went.
		return fmt.Errorf("client rpc %s to node %s via %s: %w: %w", method, nodeID, addr, structs.ErrOutcomeUnknown, err)
	default:
		return err
	}
	if reply == nil {
		return nil
	}
	if err := structs.Decode(resp.Reply, reply); err != nil {
		return fmt.Errorf("client rpc %s: decode reply: %w", method, err)
	}
	return nil
}

// ClientRPC relays server-to-client calls for other servers.
type ClientRPC struct {
	srv *Server
}

// Forward makes a call to a node whose session this server holds, on
// behalf of another server. It never relays further, and refuses requests
// that arrive on a client session.
func (c *ClientRPC) Forward(args *structs.ClientRPCForwardRequest, reply *structs.ClientRPCForwardResponse) error {
	srv := c.srv
	if r := args.Region; r != "" && r != srv.config.Region {
		return fmt.Errorf("%w: %q", structs.ErrWrongRegion, r)
	}
	if args.NodeID == "" || args.Method == "" {
		return fmt.Errorf("%w: node ID and method are required", structs.ErrInvalidRequest)
	}
	session, ok := srv.nodeSession(args.NodeID)
	if !ok {
		return fmt.Errorf("%w: node %s has no session on server %s", structs.ErrNodeNotConnected, args.NodeID, srv.advertise)
	}
	if err := srv.nodeRelayAllowed(args); err != nil {
		return err
	}
	// A controller call whose leader's term is behind this server's comes
	// from a deposed leader, late (this server, just back from a
	// partition, may be passing on what waited in its buffers): the
	// current leader may already have sent the plugin's next call to
	// another node.
	if term := srv.raft.CurrentTerm(); args.LeaderTerm != 0 && args.LeaderTerm < term {
		return fmt.Errorf("%w: %s to node %s was sent in term %d; server %s is in term %d; not relayed",
			structs.ErrStaleLeaderTerm, args.Method, args.NodeID, args.LeaderTerm, srv.advertise, term)
	}
	timeout := args.Timeout
	if timeout <= 0 {
		timeout = defaultClientRPCTimeout
	}
	ctx, cancel := context.WithTimeout(srv.shutdownCtx, timeout)
	defer cancel()
	srv.logger.Debug("relaying a call to a client", "node_id", args.NodeID, "method", args.Method)
	var out codec.Raw
	if err := callNodeSession(ctx, session, args.NodeID, args.Method, codec.Raw(args.Args), &out); err != nil {
		return err
	}
	reply.Reply = out
	return nil
}

// HasNodeConn says whether this server holds a session for the node. It is
// answered locally, never forwarded.
func (st *Status) HasNodeConn(args *structs.NodeSpecificRequest, reply *structs.NodeConnQueryResponse) error {
	if r := args.Region; r != "" && r != st.srv.config.Region {
		return structs.ErrWrongRegion
	}
	if args.NodeID == "" {
		return fmt.Errorf("%w: missing node ID", structs.ErrInvalidRequest)
	}
	if c, ok := st.srv.nodeConns.get(args.NodeID); ok {
		reply.Connected = true
		reply.Established = c.established
	}
	st.srv.setQueryMeta(&reply.QueryMeta)
	return nil
}
