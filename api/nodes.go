package api

import (
	"net/http"
	"net/url"
	"time"
)

// Node statuses and scheduling eligibility values.
const (
	NodeStatusInit           = "initializing"
	NodeStatusReady          = "ready"
	NodeStatusDown           = "down"
	NodeSchedulingEligible   = "eligible"
	NodeSchedulingIneligible = "ineligible"
)

// Nodes reads client nodes.
type Nodes struct{ c *Client }

// Nodes returns a handle on the node endpoints.
func (c *Client) Nodes() *Nodes { return &Nodes{c} }

// DriverInfo is a task driver as fingerprinted on a node.
type DriverInfo struct {
	Attributes        map[string]string
	Detected          bool
	Healthy           bool
	HealthDescription string
	UpdateTime        time.Time
}

// CSINodeInfo is a node plugin's view of its node.
type CSINodeInfo struct {
	ID                 string
	MaxVolumes         int64
	AccessibleTopology *CSITopology `json:",omitempty"`
}

// CSIInfo is a CSI plugin instance on a node.
type CSIInfo struct {
	PluginID          string
	AllocID           string
	Healthy           bool
	HealthDescription string
	UpdateTime        time.Time
	// ControllerConcurrency is a controller instance's
	// controller_concurrency.
	ControllerConcurrency int `json:",omitempty"`
	// NodeInfo is what a node instance reports of its node.
	NodeInfo *CSINodeInfo `json:",omitempty"`
}

// Node is a client node in full.
type Node struct {
	ID         string
	Name       string
	Datacenter string
	NodeClass  string
	HTTPAddr   string
	Attributes map[string]string
	Meta       map[string]string
	Drivers    map[string]*DriverInfo
	// NodeResources is the node's dynamic port range.
	NodeResources        *NodeResources `json:",omitempty"`
	CSIControllerPlugins map[string]*CSIInfo
	CSINodePlugins       map[string]*CSIInfo
	Drain                bool
	// LastDrain is the node's latest drain, nil if it never drained.
	LastDrain *DrainMetadata
	// DrainStrategy is set while the node drains.
	DrainStrategy         *DrainStrategy
	SchedulingEligibility string
	Status                string
	StatusDescription     string
	// StatusUpdatedAt is a Unix time in seconds.
	StatusUpdatedAt int64
	CreateIndex     uint64
	ModifyIndex     uint64
}

// NodeResources is what a node offers beyond CPU and memory.
type NodeResources struct {
	MinDynamicPort int
	MaxDynamicPort int
}

// NodeListStub is a node in a list.
type NodeListStub struct {
	Address               string
	ID                    string
	Attributes            map[string]string `json:",omitempty"`
	Datacenter            string
	Name                  string
	NodeClass             string
	Version               string
	Drain                 bool
	SchedulingEligibility string
	Status                string
	StatusDescription     string
	Drivers               map[string]*DriverInfo
	CreateIndex           uint64
	ModifyIndex           uint64
}

// List returns the nodes, sorted by ID; q.Prefix filters by ID prefix.
func (n *Nodes) List(q *QueryOptions) ([]*NodeListStub, *QueryMeta, error) {
	var out []*NodeListStub
	qm, err := n.c.query("/v1/nodes", &out, q)
	if err != nil {
		return nil, nil, err
	}
	return out, qm, nil
}

// PrefixList returns the nodes whose ID starts with prefix.
func (n *Nodes) PrefixList(prefix string) ([]*NodeListStub, *QueryMeta, error) {
	return n.List(&QueryOptions{Prefix: prefix})
}

// Info returns one node by ID or unique ID prefix. An unknown ID is an
// *UnexpectedResponseError with status 404; an ambiguous prefix one with
// status 400.
func (n *Nodes) Info(nodeID string, q *QueryOptions) (*Node, *QueryMeta, error) {
	var out Node
	qm, err := n.c.query("/v1/node/"+nodeID, &out, q)
	if err != nil {
		return nil, nil, err
	}
	return &out, qm, nil
}

// DrainSpec is what an operator asks of a drain.
type DrainSpec struct {
	// Deadline bounds the drain: at it, what is left is stopped. Zero
	// means no deadline; negative means force (stop everything at once).
	Deadline time.Duration
	// IgnoreSystemJobs leaves system job allocations in place.
	IgnoreSystemJobs bool
}

// DrainStrategy is a drain in progress.
type DrainStrategy struct {
	DrainSpec
	// ForceDeadline is when what is left gets stopped; zero for none.
	ForceDeadline time.Time
	StartedAt     time.Time
}

// NodeUpdateDrainRequest is the body of a drain change; a nil DrainSpec
// stops the drain.
type NodeUpdateDrainRequest struct {
	NodeID       string
	DrainSpec    *DrainSpec
	MarkEligible bool
}

// NodeUpdateResponse answers drain and eligibility changes.
type NodeUpdateResponse struct {
	NodeModifyIndex uint64
	// EvalIDs are the evaluations the change created.
	EvalIDs         []string
	EvalCreateIndex uint64
}

// NodeUpdateEligibilityRequest is the body of an eligibility change.
type NodeUpdateEligibilityRequest struct {
	NodeID      string
	Eligibility string
}

// Allocations returns the node's allocations in full. An unknown node is
// an *UnexpectedResponseError with status 404.
func (n *Nodes) Allocations(nodeID string, q *QueryOptions) ([]*Allocation, *QueryMeta, error) {
	var out []*Allocation
	qm, err := n.c.query("/v1/node/"+url.PathEscape(nodeID)+"/allocations", &out, q)
	if err != nil {
		return nil, nil, err
	}
	return out, qm, nil
}

// UpdateDrain starts or changes a drain of the node (spec set) or stops
// it (spec nil). Stopping a drain leaves the node ineligible unless
// markEligible.
func (n *Nodes) UpdateDrain(nodeID string, spec *DrainSpec, markEligible bool, w *WriteOptions) (*NodeUpdateResponse, *WriteMeta, error) {
	req := &NodeUpdateDrainRequest{NodeID: nodeID, DrainSpec: spec, MarkEligible: markEligible}
	var out NodeUpdateResponse
	wm, err := n.c.write(http.MethodPut, "/v1/node/"+url.PathEscape(nodeID)+"/drain", nil, req, &out, w)
	if err != nil {
		return nil, nil, err
	}
	return &out, wm, nil
}

// UpdateEligibility marks the node eligible or ineligible for new
// placements.
func (n *Nodes) UpdateEligibility(nodeID string, eligible bool, w *WriteOptions) (*NodeUpdateResponse, *WriteMeta, error) {
	req := &NodeUpdateEligibilityRequest{NodeID: nodeID, Eligibility: NodeSchedulingIneligible}
	if eligible {
		req.Eligibility = NodeSchedulingEligible
	}
	var out NodeUpdateResponse
	wm, err := n.c.write(http.MethodPut, "/v1/node/"+url.PathEscape(nodeID)+"/eligibility", nil, req, &out, w)
	if err != nil {
		return nil, nil, err
	}
	return &out, wm, nil
}

// DrainMetadata is a node's latest drain: Status is draining, complete
// or canceled.
type DrainMetadata struct {
	StartedAt  time.Time
	UpdatedAt  time.Time
	Status     string
	AccessorID string
	Meta       map[string]string
}
