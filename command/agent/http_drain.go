package agent

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/roamhq/roam/structs"
)

// maxNodeBody bounds a drain or eligibility request body.
const maxNodeBody = 64 << 10

// nodeAllocations answers GET /v1/node/:id/allocations with the node's
// allocations in full; a blocking query.
func (s *HTTPServer) nodeAllocations(w http.ResponseWriter, r *http.Request) (any, error) {
	args := structs.NodeSpecificRequest{NodeID: pathID(r, nodePathPrefix)}
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	args.Prefix = ""
	var reply structs.NodeAllocsResponse
	if err := s.rpc(r, "Node.GetAllocs", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Allocs == nil {
		reply.Allocs = []*structs.Allocation{}
	}
	return reply.Allocs, nil
}

// drainSpecBody is Nomad's api.DrainSpec. Deadline is in nanoseconds: a
// positive one bounds the drain, 0 means no deadline, and a negative one
// (Nomad's -force sends -1) stops everything at once.
type drainSpecBody struct {
	Deadline         time.Duration
	IgnoreSystemJobs bool
}

// drainRequestBody is Nomad's api.NodeUpdateDrainRequest. A null
// DrainSpec stops the drain.
type drainRequestBody struct {
	NodeID       string
	DrainSpec    *drainSpecBody
	MarkEligible bool
	// Meta is refused when set: Roam keeps no record of past drains.
	Meta map[string]string
}

// nodeUpdateResponse answers drain and eligibility changes in the shape
// of Nomad's NodeDrainUpdateResponse and NodeEligibilityUpdateResponse.
type nodeUpdateResponse struct {
	NodeModifyIndex uint64
	EvalIDs         []string
	EvalCreateIndex uint64
	Index           uint64
}

// nodeDrain answers PUT/POST /v1/node/:id/drain: start, change or stop a
// node's drain.
func (s *HTTPServer) nodeDrain(w http.ResponseWriter, r *http.Request) (any, error) {
	id := pathID(r, nodePathPrefix)
	body, err := readBody(r, maxNodeBody)
	if err != nil {
		return nil, err
	}
	var in drainRequestBody
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, badRequest("Failed to decode drain request: %v", err)
	}
	if in.NodeID != "" && in.NodeID != id {
		return nil, badRequest("Node ID %q in the body does not match the node ID in the URL %q", in.NodeID, id)
	}
	if len(in.Meta) > 0 {
		return nil, badRequest("Drain Meta is not supported")
	}
	args := structs.NodeUpdateDrainRequest{NodeID: id, MarkEligible: in.MarkEligible}
	if in.DrainSpec != nil {
		args.DrainStrategy = drainStrategy(*in.DrainSpec, time.Now())
	}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.NodeDrainUpdateResponse
	if err := s.rpc(r, "Node.UpdateDrain", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	return nodeUpdateView(reply.NodeModifyIndex, reply.EvalIDs, reply.Index), nil
}

// drainStrategy turns an operator's drain spec into a drain starting at
// now. Only a positive deadline has a force deadline.
func drainStrategy(spec drainSpecBody, now time.Time) *structs.DrainStrategy {
	d := &structs.DrainStrategy{
		DrainSpec: structs.DrainSpec{Deadline: spec.Deadline, IgnoreSystemJobs: spec.IgnoreSystemJobs},
		StartedAt: now.UTC(),
	}
	if spec.Deadline > 0 {
		d.ForceDeadline = d.StartedAt.Add(spec.Deadline)
	}
	return d
}

// eligibilityRequestBody is Nomad's api.NodeUpdateEligibilityRequest.
type eligibilityRequestBody struct {
	NodeID      string
	Eligibility string
}

// nodeEligibility answers PUT/POST /v1/node/:id/eligibility.
func (s *HTTPServer) nodeEligibility(w http.ResponseWriter, r *http.Request) (any, error) {
	id := pathID(r, nodePathPrefix)
	body, err := readBody(r, maxNodeBody)
	if err != nil {
		return nil, err
	}
	var in eligibilityRequestBody
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, badRequest("Failed to decode eligibility request: %v", err)
	}
	if in.NodeID != "" && in.NodeID != id {
		return nil, badRequest("Node ID %q in the body does not match the node ID in the URL %q", in.NodeID, id)
	}
	switch in.Eligibility {
	case structs.NodeSchedulingEligible, structs.NodeSchedulingIneligible:
	default:
		return nil, badRequest("Invalid scheduling eligibility %q: must be %q or %q",
			in.Eligibility, structs.NodeSchedulingEligible, structs.NodeSchedulingIneligible)
	}
	args := structs.NodeUpdateEligibilityRequest{NodeID: id, Eligibility: in.Eligibility}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.NodeEligibilityUpdateResponse
	if err := s.rpc(r, "Node.UpdateEligibility", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	return nodeUpdateView(reply.NodeModifyIndex, reply.EvalIDs, reply.Index), nil
}

func nodeUpdateView(nodeIndex uint64, evalIDs []string, index uint64) *nodeUpdateResponse {
	out := &nodeUpdateResponse{NodeModifyIndex: nodeIndex, EvalIDs: evalIDs, Index: index}
	if out.EvalIDs == nil {
		out.EvalIDs = []string{}
	}
	if len(evalIDs) > 0 {
		// Evaluations are created in the same write as the node change.
		out.EvalCreateIndex = nodeIndex
	}
	return out
}
