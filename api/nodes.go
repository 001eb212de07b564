package api

import "time"

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

// CSIInfo is a CSI plugin instance on a node.
type CSIInfo struct {
	PluginID          string
	AllocID           string
	Healthy           bool
	HealthDescription string
	UpdateTime        time.Time
}

// Node is a client node in full.
type Node struct {
	ID                    string
	Name                  string
	Datacenter            string
	NodeClass             string
	HTTPAddr              string
	Attributes            map[string]string
	Meta                  map[string]string
	Drivers               map[string]*DriverInfo
	CSIControllerPlugins  map[string]*CSIInfo
	CSINodePlugins        map[string]*CSIInfo
	Drain                 bool
	SchedulingEligibility string
	Status                string
	StatusDescription     string
	// StatusUpdatedAt is a Unix time in seconds.
	StatusUpdatedAt int64
	CreateIndex     uint64
	ModifyIndex     uint64
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
