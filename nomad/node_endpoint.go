package nomad

import (
	"fmt"
	"time"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// Node serves client registration, heartbeats and node reads.
type Node struct {
	srv *Server
}

// Register adds a node or updates it. A node may re-register with its own
// secret only; registering a known ID with another secret is refused.
func (n *Node) Register(args *structs.NodeRegisterRequest, reply *structs.NodeUpdateResponse) error {
	if done, err := n.srv.forward("Node.Register", args, args, reply); done {
		if err == nil {
			// The leader accepted the node's secret.
			n.srv.recordNodeSession(args.Node.ID, args)
		}
		return err
	}
	if err := args.Node.Validate(); err != nil {
		return err
	}
	if !n.srv.heartbeats.running() {
		// Leadership is not established yet: refuse before writing, so the
		// client's retry does not write the node twice.
		return fmt.Errorf("%w: leader is still starting", structs.ErrNoLeader)
	}
	store := n.srv.State()
	existing, err := store.NodeByID(nil, args.Node.ID)
	if err != nil {
		return err
	}
	if existing != nil && existing.SecretID != args.Node.SecretID {
		return fmt.Errorf("%w: node %s is registered with another secret", structs.ErrPermissionDenied, args.Node.ID)
	}
	if existing == nil {
		if err := n.srv.introAllowed(args.IntroToken); err != nil {
			return err
		}
	}
	if holder, err := store.NodeBySecretID(nil, args.Node.SecretID); err != nil {
		return err
	} else if holder != nil && holder.ID != args.Node.ID {
		return fmt.Errorf("%w: secret belongs to another node", structs.ErrPermissionDenied)
	}

	node := args.Node.Copy()
	if node.Status == "" {
		node.Status = structs.NodeStatusInit
	}
	node.StatusUpdatedAt = time.Now().Unix()
	req := structs.NodeRegisterRequest{Node: node, WriteRequest: args.WriteRequest}
	if node.Status == structs.NodeStatusReady && (existing == nil || existing.Status != structs.NodeStatusReady) {
		// A node that comes up may take system jobs and blocked work, and
		// its own allocations need re-evaluating after it was down.
		if req.Evals, err = n.srv.evalsForNode(node.ID, structs.EvalTriggerNodeUpdate); err != nil {
			return err
		}
	}
	_, index, err := n.srv.raftApply(structs.NodeRegisterRequestType, &req)
	if err != nil {
		return err
	}
	reply.Index = index
	if err := n.heartbeatReply(node.ID, node.Status, args.CSILeaderTerm, reply); err != nil {
		return err
	}
	n.srv.recordNodeSession(node.ID, args)
	return nil
}

// UpdateStatus is a client's heartbeat, and how it reports a status
// change. Only the node itself (its secret as the token) may call it.
func (n *Node) UpdateStatus(args *structs.NodeUpdateStatusRequest, reply *structs.NodeUpdateResponse) error {
	if done, err := n.srv.forward("Node.UpdateStatus", args, args, reply); done {
		if err == nil {
			// The leader accepted the node's secret.
			n.srv.recordNodeSession(args.NodeID, args)
		}
		return err
	}
	if args.NodeID == "" {
		return fmt.Errorf("%w: missing node ID", structs.ErrInvalidRequest)
	}
	if !structs.ValidNodeStatus(args.Status) {
		return fmt.Errorf("%w: invalid node status %q", structs.ErrInvalidRequest, args.Status)
	}
	node, err := n.srv.State().NodeByID(nil, args.NodeID)
	if err != nil {
		return err
	}
	if node == nil {
		return fmt.Errorf("%w: %s", structs.ErrUnknownNode, args.NodeID)
	}
	if args.AuthToken != node.SecretID {
		return fmt.Errorf("%w: token does not belong to node %s", structs.ErrPermissionDenied, args.NodeID)
	}

	if args.Status != structs.NodeStatusDown && !n.srv.heartbeats.running() {
		// Refuse before writing: the reply needs a TTL, which only an
		// established leader can give, and a retried write must not land twice.
		return fmt.Errorf("%w: leader is still starting", structs.ErrNoLeader)
	}
	reply.Index = node.ModifyIndex
	if node.Status != args.Status {
		req := structs.NodeUpdateStatusRequest{
			NodeID:       args.NodeID,
			Status:       args.Status,
			UpdatedAt:    time.Now().Unix(),
			WriteRequest: args.WriteRequest,
		}
		if args.Status == structs.NodeStatusReady || args.Status == structs.NodeStatusDown {
			if req.Evals, err = n.srv.evalsForNode(args.NodeID, structs.EvalTriggerNodeUpdate); err != nil {
				return err
			}
		}
		_, index, err := n.srv.raftApply(structs.NodeUpdateStatusRequestType, &req)
		if err != nil {
			return err
		}
		reply.Index = index
		n.srv.logger.Info("node status changed", "node_id", args.NodeID, "from", node.Status, "to", args.Status)
	}
	if err := n.heartbeatReply(args.NodeID, args.Status, args.CSILeaderTerm, reply); err != nil {
		return err
	}
	n.srv.recordNodeSession(args.NodeID, args)
	return nil
}

// heartbeatReply arms the node's timer (or clears it for a node going
// down) and fills in the TTL, the servers the client may use, and this
// leader's term. clientTerm is the highest leader term the client has seen
// on controller calls: above this leader's, it can only be another Raft
// cluster's, once this leader has verified it still leads (a leader of a
// later term in this cluster would have deposed it), and the client is
// told to start from this leader's term.
func (n *Node) heartbeatReply(nodeID, status string, clientTerm uint64, reply *structs.NodeUpdateResponse) error {
	if status == structs.NodeStatusDown {
		n.srv.heartbeats.clear(nodeID)
	} else {
		ttl, err := n.srv.heartbeats.reset(nodeID)
		if err != nil {
			return err
		}
		reply.HeartbeatTTL = ttl
	}
	reply.LeaderRPCAddr, _ = n.srv.Leader()
	reply.ClusterID = n.srv.ClusterID()
	reply.FreeClaimsAfter = n.srv.config.FreeClaimsAfter()
	if lanes := n.srv.lanes.Load(); lanes != nil && lanes.term != 0 {
		reply.LeaderTerm = lanes.term
		if clientTerm > lanes.term {
			// VerifyLeader vouches for Raft's current term: the lanes must
			// be of that term, and still the ones open, for it to vouch for
			// the term they stamp.
			err := n.srv.raft.VerifyLeader().Error()
			if err == nil && (n.srv.raft.CurrentTerm() != lanes.term || n.srv.lanes.Load() != lanes) {
				err = fmt.Errorf("leadership moved on from term %d", lanes.term)
			}
			if err != nil {
				return fmt.Errorf("%w: verifying leadership for node %s, which remembers leader term %d above this leader's %d: %w",
					structs.ErrNoLeader, nodeID, clientTerm, lanes.term, err)
			}
			n.srv.logger.Warn("node remembers a leader term above this leader's, from servers since rebuilt; it starts from this one",
				"node_id", nodeID, "node_term", clientTerm, "leader_term", lanes.term)
			reply.LeaderTermResetFrom = clientTerm
		}
	}
	if min, ok := n.srv.minServerVersion(); ok {
		reply.MinServerVersion = min.String()
	}
	for _, m := range n.srv.members.alive() {
		reply.Servers = append(reply.Servers, &structs.NodeServerInfo{
			RPCAdvertiseAddr: m.Addr,
			Datacenter:       m.Datacenter,
		})
	}
	n.srv.setQueryMeta(&reply.QueryMeta)
	return nil
}

// Deregister removes nodes. Unknown IDs fail the whole request.
func (n *Node) Deregister(args *structs.NodeDeregisterRequest, reply *structs.GenericResponse) error {
	if done, err := n.srv.forward("Node.Deregister", args, args, reply); done {
		return err
	}
	if len(args.NodeIDs) == 0 {
		return fmt.Errorf("%w: no node IDs given", structs.ErrInvalidRequest)
	}
	store := n.srv.State()
	// A node may deregister only itself; an operator (the server's
	// operator_token) any node. Anyone else, and an empty token above all,
	// is nobody.
	if !n.srv.isOperator(args.AuthToken) {
		if args.AuthToken == "" {
			return fmt.Errorf("%w: deregistering a node needs the node's secret or the operator token", structs.ErrPermissionDenied)
		}
		caller, err := store.NodeBySecretID(nil, args.AuthToken)
		if err != nil {
			return err
		}
		if caller == nil {
			return fmt.Errorf("%w: token is neither a node's secret nor the operator token", structs.ErrPermissionDenied)
		}
		for _, id := range args.NodeIDs {
			if id != caller.ID {
				return fmt.Errorf("%w: node %s may not deregister node %s", structs.ErrPermissionDenied, caller.ID, id)
			}
		}
	}
	for _, id := range args.NodeIDs {
		node, err := store.NodeByID(nil, id)
		if err != nil {
			return err
		}
		if node == nil {
			return fmt.Errorf("%w: %s", structs.ErrUnknownNode, id)
		}
	}
	_, index, err := n.srv.raftApply(structs.NodeDeregisterRequestType, args)
	if err != nil {
		return err
	}
	for _, id := range args.NodeIDs {
		n.srv.heartbeats.clear(id)
	}
	reply.Index = index
	return nil
}

// List returns node stubs, filtered by ID prefix; a blocking query.
func (n *Node) List(args *structs.NodeListRequest, reply *structs.NodeListResponse) error {
	if done, err := n.srv.forward("Node.List", args, args, reply); done {
		return err
	}
	return n.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		nodes, err := store.NodesByIDPrefix(ws, args.Prefix)
		if err != nil {
			return err
		}
		reply.Nodes = make([]*structs.NodeListStub, 0, len(nodes))
		for _, node := range nodes {
			reply.Nodes = append(reply.Nodes, node.Stub())
		}
		reply.Index, err = store.Index(state.TableNodes)
		return err
	})
}

// GetNode returns one node, without its secret unless the caller is that
// node; Node is nil when there is no such node. A blocking query.
func (n *Node) GetNode(args *structs.NodeSpecificRequest, reply *structs.SingleNodeResponse) error {
	if done, err := n.srv.forward("Node.GetNode", args, args, reply); done {
		return err
	}
	return n.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		node, err := store.NodeByID(ws, args.NodeID)
		if err != nil {
			return err
		}
		if node == nil {
			reply.Node = nil
			reply.Index, err = store.Index(state.TableNodes)
			return err
		}
		if args.AuthToken != "" && args.AuthToken == node.SecretID {
			reply.Node = node.Copy()
		} else {
			reply.Node = node.Sanitize()
		}
		reply.Index = node.ModifyIndex
		return nil
	})
}
