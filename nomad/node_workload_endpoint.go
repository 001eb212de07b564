package nomad

import (
	"fmt"
	"time"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// The Node service's workload methods: what a client runs, what it reports,
// and the operator's drain and eligibility controls.

// nodeByToken returns the node whose secret is token, or permission denied.
func (n *Node) nodeByToken(token, nodeID string) (*structs.Node, error) {
	node, err := n.srv.State().NodeBySecretID(nil, token)
	if err != nil {
		return nil, err
	}
	if node == nil || (nodeID != "" && node.ID != nodeID) {
		return nil, fmt.Errorf("%w: token does not belong to node %s", structs.ErrPermissionDenied, nodeID)
	}
	return node, nil
}

// GetClientAllocs returns every allocation on the calling node, with jobs;
// a blocking query on that node's allocations. Only the node itself may ask.
func (n *Node) GetClientAllocs(args *structs.NodeSpecificRequest, reply *structs.NodeClientAllocsResponse) error {
	if done, err := n.srv.forward("Node.GetClientAllocs", args, args, reply); done {
		return err
	}
	if _, err := n.nodeByToken(args.AuthToken, args.NodeID); err != nil {
		return err
	}
	return n.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		allocs, err := store.AllocsByNode(ws, args.NodeID)
		if err != nil {
			return err
		}
		meta, err := store.ClusterMetadata(ws)
		if err != nil {
			return err
		}
		reply.Allocs = allocs
		reply.ClusterID = ""
		if meta != nil {
			reply.ClusterID = meta.ClusterID
		}
		reply.Index = maxModifyIndex(allocs)
		return nil
	})
}

// GetAllocs returns a node's allocations (for operators).
func (n *Node) GetAllocs(args *structs.NodeSpecificRequest, reply *structs.NodeAllocsResponse) error {
	if done, err := n.srv.forward("Node.GetAllocs", args, args, reply); done {
		return err
	}
	return n.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		allocs, err := store.AllocsByNode(ws, args.NodeID)
		if err != nil {
			return err
		}
		reply.Allocs = allocs
		if reply.Allocs == nil {
			reply.Allocs = []*structs.Allocation{}
		}
		reply.Index = maxModifyIndex(allocs)
		return nil
	})
}

func maxModifyIndex(allocs []*structs.Allocation) uint64 {
	var max uint64
	for _, a := range allocs {
		if a.ModifyIndex > max {
			max = a.ModifyIndex
		}
	}
	return max
}

// UpdateAlloc records a client's allocation updates. A node may update only
// its own allocations; an allocation that ended, or a replacement that
// started running, triggers an evaluation of its job (to replace or
// reschedule it, or to continue a drain's migrations).
func (n *Node) UpdateAlloc(args *structs.AllocUpdateRequest, reply *structs.GenericResponse) error {
	if done, err := n.srv.forward("Node.UpdateAlloc", args, args, reply); done {
		return err
	}
	node, err := n.nodeByToken(args.AuthToken, "")
	if err != nil {
		return err
	}
	if len(args.Alloc) == 0 {
		return fmt.Errorf("%w: no allocation updates", structs.ErrInvalidRequest)
	}
	store := n.srv.State()
	seen := make(map[jobKey]bool)
	var evals []*structs.Evaluation
	updates := make([]*structs.Allocation, 0, len(args.Alloc))
	for _, u := range args.Alloc {
		switch u.ClientStatus {
		case structs.AllocClientStatusPending, structs.AllocClientStatusRunning,
			structs.AllocClientStatusComplete, structs.AllocClientStatusFailed:
		default:
			return fmt.Errorf("%w: allocation %s: client status %q is not one a client may report", structs.ErrInvalidRequest, u.ID, u.ClientStatus)
		}
		existing, err := store.AllocByID(nil, u.ID)
		if err != nil {
			return err
		}
		if existing == nil {
			return fmt.Errorf("%w: allocation %s", structs.ErrNotFound, u.ID)
		}
		if existing.NodeID != node.ID {
			return fmt.Errorf("%w: allocation %s is not on node %s", structs.ErrPermissionDenied, u.ID, node.ID)
		}
		updates = append(updates, &structs.Allocation{
			ID: u.ID, ClientStatus: u.ClientStatus, ClientDescription: u.ClientDescription,
			TaskStates: u.TaskStates, ModifyTime: time.Now().UnixNano(),
		})
		ended := u.ClientStatus == structs.AllocClientStatusFailed || u.ClientStatus == structs.AllocClientStatusComplete
		// A replacement that starts running ends a migration in flight:
		// the scheduler may now move the next allocation of a draining
		// node (max_parallel counts pending replacements).
		replacementUp := u.ClientStatus == structs.AllocClientStatusRunning &&
			existing.ClientStatus == structs.AllocClientStatusPending && existing.PreviousAllocation != ""
		k := jobKey{existing.Namespace, existing.JobID}
		if (ended && !existing.ClientTerminalStatus() || replacementUp) && !seen[k] {
			seen[k] = true
			job, _ := store.JobByID(nil, existing.Namespace, existing.JobID)
			if job == nil {
				job = existing.Job
			}
			if job != nil {
				evals = append(evals, n.srv.evalForJob(job, structs.EvalTriggerRetryFailedAlloc, node.ID))
			}
		}
	}
	req := structs.AllocUpdateRequest{Alloc: updates, Evals: evals, WriteRequest: args.WriteRequest}
	_, index, err := n.srv.raftApply(structs.AllocClientUpdateRequestType, &req)
	if err != nil {
		return err
	}
	reply.Index = index
	return nil
}

// UpdateDrain starts or stops a drain. A deadline becomes a force deadline
// from now; a negative one drains by force at once.
func (n *Node) UpdateDrain(args *structs.NodeUpdateDrainRequest, reply *structs.NodeDrainUpdateResponse) error {
	if done, err := n.srv.forward("Node.UpdateDrain", args, args, reply); done {
		return err
	}
	node, err := n.srv.State().NodeByID(nil, args.NodeID)
	if err != nil {
		return err
	}
	if node == nil {
		return fmt.Errorf("%w: %s", structs.ErrUnknownNode, args.NodeID)
	}
	now := time.Now()
	req := structs.NodeUpdateDrainRequest{NodeID: node.ID, MarkEligible: args.MarkEligible, UpdatedAt: now.Unix(), WriteRequest: args.WriteRequest}
	if d := args.DrainStrategy; d != nil {
		strategy := &structs.DrainStrategy{DrainSpec: d.DrainSpec, StartedAt: now}
		if d.Deadline > 0 {
			strategy.ForceDeadline = now.Add(d.Deadline)
		}
		req.DrainStrategy = strategy
	} else if args.MarkEligible {
		// Ending a drain with eligibility restored frees capacity.
		evals, err := n.srv.evalsForNode(node.ID, structs.EvalTriggerNodeUpdate)
		if err != nil {
			return err
		}
		req.Evals = evals
	}
	_, index, err := n.srv.raftApply(structs.NodeUpdateDrainRequestType, &req)
	if err != nil {
		return err
	}
	reply.NodeModifyIndex = index
	reply.Index = index
	for _, e := range req.Evals {
		reply.EvalIDs = append(reply.EvalIDs, e.ID)
	}
	return nil
}

// UpdateEligibility sets a node's scheduling eligibility. Marking a
// draining node eligible is refused: stop the drain instead.
func (n *Node) UpdateEligibility(args *structs.NodeUpdateEligibilityRequest, reply *structs.NodeEligibilityUpdateResponse) error {
	if done, err := n.srv.forward("Node.UpdateEligibility", args, args, reply); done {
		return err
	}
	if args.Eligibility != structs.NodeSchedulingEligible && args.Eligibility != structs.NodeSchedulingIneligible {
		return fmt.Errorf("%w: eligibility %q is not one of eligible, ineligible", structs.ErrInvalidRequest, args.Eligibility)
	}
	node, err := n.srv.State().NodeByID(nil, args.NodeID)
	if err != nil {
		return err
	}
	if node == nil {
		return fmt.Errorf("%w: %s", structs.ErrUnknownNode, args.NodeID)
	}
	if node.DrainStrategy != nil && args.Eligibility == structs.NodeSchedulingEligible {
		return fmt.Errorf("%w: node %s is draining; disable the drain to make it eligible", structs.ErrInvalidRequest, node.ID)
	}
	req := structs.NodeUpdateEligibilityRequest{NodeID: node.ID, Eligibility: args.Eligibility, UpdatedAt: time.Now().Unix(), WriteRequest: args.WriteRequest}
	if args.Eligibility == structs.NodeSchedulingEligible && node.SchedulingEligibility != structs.NodeSchedulingEligible {
		if req.Evals, err = n.srv.evalsForNode(node.ID, structs.EvalTriggerNodeUpdate); err != nil {
			return err
		}
	}
	_, index, err := n.srv.raftApply(structs.NodeUpdateEligibilityRequestType, &req)
	if err != nil {
		return err
	}
	reply.NodeModifyIndex = index
	reply.Index = index
	for _, e := range req.Evals {
		reply.EvalIDs = append(reply.EvalIDs, e.ID)
	}
	return nil
}
