package structs

import (
	"fmt"
	"time"
)

// Node statuses.
const (
	NodeStatusInit  = "initializing"
	NodeStatusReady = "ready"
	NodeStatusDown  = "down"
)

// Scheduling eligibility values.
const (
	NodeSchedulingEligible   = "eligible"
	NodeSchedulingIneligible = "ineligible"
)

// ValidNodeStatus reports whether s is a status a client may report.
func ValidNodeStatus(s string) bool {
	switch s {
	case NodeStatusInit, NodeStatusReady, NodeStatusDown:
		return true
	}
	return false
}

// DriverInfo is a task driver as fingerprinted by the client.
type DriverInfo struct {
	Attributes        map[string]string
	Detected          bool
	Healthy           bool
	HealthDescription string
	UpdateTime        time.Time
}

// CSIInfo is a CSI plugin instance as fingerprinted by the client.
type CSIInfo struct {
	PluginID          string
	AllocID           string
	Healthy           bool
	HealthDescription string
	UpdateTime        time.Time
	// Provider and ProviderVersion come from GetPluginInfo.
	Provider        string
	ProviderVersion string
	// RequiresControllerPlugin is set when the plugin advertises a
	// controller service (publish/unpublish go through a controller).
	RequiresControllerPlugin bool
	// ControllerConcurrency is, for a controller instance, how many
	// destructive controller calls it accepts at once (its
	// controller_concurrency); 0, from a client that predates it, means 1.
	ControllerConcurrency int                `json:",omitempty"`
	ControllerInfo        *CSIControllerInfo `json:",omitempty"`
	NodeInfo              *CSINodeInfo       `json:",omitempty"`
}

// CSIControllerInfo is what a controller instance can do.
type CSIControllerInfo struct {
	SupportsCreateDelete bool
	SupportsAttachDetach bool
	SupportsListVolumes  bool
	// SupportsListVolumesAttachedNodes: ListVolumes names the nodes each
	// volume is published to (LIST_VOLUMES_PUBLISHED_NODES).
	SupportsListVolumesAttachedNodes bool
	SupportsCreateSnapshot           bool
	SupportsListSnapshots            bool
	SupportsExpand                   bool
	SupportsReadOnlyAttach           bool
	SupportsClone                    bool
}

// CSINodeInfo is what a node instance reports of its node.
type CSINodeInfo struct {
	// ID is the node's identity in the storage provider (NodeGetInfo).
	ID                      string
	MaxVolumes              int64
	RequiresNodeStageVolume bool
	// AccessibleTopology is where this node is (NodeGetInfo); nil when
	// the plugin does not say.
	AccessibleTopology *CSITopology `json:",omitempty"`
}

// Node is a client agent as the servers know it.
type Node struct {
	ID string
	// SecretID authenticates the node's own RPCs. Never returned by reads.
	SecretID   string
	Name       string
	Datacenter string
	NodeClass  string
	HTTPAddr   string
	Attributes map[string]string
	Meta       map[string]string
	Drivers    map[string]*DriverInfo
	// NodeResources is the node's dynamic port range; nil means Nomad's
	// default, 20000-32000.
	NodeResources         *NodeResources `json:",omitempty"`
	CSIControllerPlugins  map[string]*CSIInfo
	CSINodePlugins        map[string]*CSIInfo
	Status                string
	StatusDescription     string
	SchedulingEligibility string
	// DrainStrategy is set while the node drains; Drain mirrors it for
	// Nomad-shaped clients.
	DrainStrategy *DrainStrategy
	Drain         bool
	// LastDrain describes the node's latest drain, running or ended; nil
	// if it never drained. Nomad's API client reads it.
	LastDrain *DrainMetadata
	// StatusUpdatedAt is a Unix time in seconds, as in Nomad's API.
	StatusUpdatedAt int64
	CreateIndex     uint64
	ModifyIndex     uint64
}

// Validate checks what a client must supply when it registers.
func (n *Node) Validate() error {
	switch {
	case n == nil:
		return fmt.Errorf("%w: missing node", ErrInvalidRequest)
	case n.ID == "":
		return fmt.Errorf("%w: missing node ID", ErrInvalidRequest)
	case n.SecretID == "":
		return fmt.Errorf("%w: missing node secret ID", ErrInvalidRequest)
	case n.Datacenter == "":
		return fmt.Errorf("%w: missing datacenter", ErrInvalidRequest)
	case n.Name == "":
		return fmt.Errorf("%w: missing node name", ErrInvalidRequest)
	case n.Status != "" && !ValidNodeStatus(n.Status):
		return fmt.Errorf("%w: invalid node status %q", ErrInvalidRequest, n.Status)
	}
	if err := ValidateID(IDKindNode, n.ID); err != nil {
		return err
	}
	if err := ValidateID(IDKindNodeName, n.Name); err != nil {
		return err
	}
	if r := n.NodeResources; r != nil && (r.MinDynamicPort < 1 || r.MaxDynamicPort > 65535 || r.MinDynamicPort > r.MaxDynamicPort) {
		return fmt.Errorf("%w: dynamic port range %d-%d is not within 1-65535, low to high", ErrInvalidRequest, r.MinDynamicPort, r.MaxDynamicPort)
	}
	// Plugin IDs a client reports become the servers' plugin IDs, which
	// volumes name and clients turn into directories.
	for _, plugins := range []map[string]*CSIInfo{n.CSIControllerPlugins, n.CSINodePlugins} {
		for id := range plugins {
			if err := ValidateID(IDKindPlugin, id); err != nil {
				return err
			}
		}
	}
	return nil
}

// Copy returns a deep copy; objects read from the state store are never
// mutated in place.
func (n *Node) Copy() *Node {
	if n == nil {
		return nil
	}
	c := *n
	c.Attributes = copyStringMap(n.Attributes)
	c.Meta = copyStringMap(n.Meta)
	if n.Drivers != nil {
		c.Drivers = make(map[string]*DriverInfo, len(n.Drivers))
		for k, v := range n.Drivers {
			d := *v
			d.Attributes = copyStringMap(v.Attributes)
			c.Drivers[k] = &d
		}
	}
	if n.DrainStrategy != nil {
		d := *n.DrainStrategy
		c.DrainStrategy = &d
	}
	if n.NodeResources != nil {
		r := *n.NodeResources
		c.NodeResources = &r
	}
	if n.LastDrain != nil {
		ld := *n.LastDrain
		ld.Meta = copyStringMap(n.LastDrain.Meta)
		c.LastDrain = &ld
	}
	c.CSIControllerPlugins = copyCSIInfo(n.CSIControllerPlugins)
	c.CSINodePlugins = copyCSIInfo(n.CSINodePlugins)
	return &c
}

// Sanitize returns a copy without the secret, for reads.
func (n *Node) Sanitize() *Node {
	if n == nil {
		return nil
	}
	c := n.Copy()
	c.SecretID = ""
	return c
}

// Ready reports whether the node can run work.
func (n *Node) Ready() bool { return n.Status == NodeStatusReady }

// Stub is the summary used in lists.
func (n *Node) Stub() *NodeListStub {
	return &NodeListStub{
		Address:               n.Attributes["unique.network.ip-address"],
		ID:                    n.ID,
		Attributes:            copyStringMap(n.Attributes),
		Datacenter:            n.Datacenter,
		Name:                  n.Name,
		NodeClass:             n.NodeClass,
		Version:               n.Attributes["roam.version"],
		SchedulingEligibility: n.SchedulingEligibility,
		Drain:                 n.DrainStrategy != nil,
		LastDrain:             n.Copy().LastDrain,
		Status:                n.Status,
		StatusDescription:     n.StatusDescription,
		Drivers:               n.Drivers,
		CreateIndex:           n.CreateIndex,
		ModifyIndex:           n.ModifyIndex,
	}
}

// NodeListStub is a node in a list, shaped like Nomad's.
type NodeListStub struct {
	Address               string
	ID                    string
	Attributes            map[string]string `json:",omitempty"`
	Datacenter            string
	Name                  string
	NodeClass             string
	Version               string
	Drain                 bool
	LastDrain             *DrainMetadata `json:",omitempty"`
	SchedulingEligibility string
	Status                string
	StatusDescription     string
	Drivers               map[string]*DriverInfo
	CreateIndex           uint64
	ModifyIndex           uint64
}

func copyStringMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func copyCSIInfo(m map[string]*CSIInfo) map[string]*CSIInfo {
	if m == nil {
		return nil
	}
	c := make(map[string]*CSIInfo, len(m))
	for k, v := range m {
		i := *v
		if v.ControllerInfo != nil {
			ci := *v.ControllerInfo
			i.ControllerInfo = &ci
		}
		if v.NodeInfo != nil {
			ni := *v.NodeInfo
			i.NodeInfo = &ni
		}
		c[k] = &i
	}
	return c
}

// DrainSpec is what an operator asks of a drain.
type DrainSpec struct {
	// Deadline bounds the drain; at it, remaining allocations are stopped.
	// Negative means force: stop everything at once.
	Deadline time.Duration
	// IgnoreSystemJobs leaves system job allocations in place.
	IgnoreSystemJobs bool
}

// Drain statuses of DrainMetadata, as Nomad names them.
const (
	DrainStatusDraining = "draining"
	DrainStatusComplete = "complete"
	DrainStatusCanceled = "canceled"
)

// DrainMetadata is a node's latest drain, in Nomad's shape.
type DrainMetadata struct {
	StartedAt time.Time
	UpdatedAt time.Time
	// Status is draining, complete (every allocation moved off) or
	// canceled (an operator stopped it).
	Status string
	// AccessorID is the ACL token that started it; empty without ACLs.
	AccessorID string
	Meta       map[string]string
}

// DrainStrategy is a drain in progress.
type DrainStrategy struct {
	DrainSpec
	// ForceDeadline is when the drain stops what is left; zero for none.
	ForceDeadline time.Time
	StartedAt     time.Time
}

// NodeRegisterRequest registers or re-registers a node.
type NodeRegisterRequest struct {
	Node *Node
	// Evals are created by the server (system jobs for a ready node).
	Evals []*Evaluation
	// IntroToken is the node introduction credential (the client's
	// intro_token) a new node shows when the servers require one. The
	// server never writes it to Raft.
	IntroToken string
	// CSILeaderTerm is the highest leader term the client has seen on
	// controller calls (see NodeUpdateResponse.LeaderTermResetFrom).
	CSILeaderTerm uint64
	WriteRequest
}

// NodeUpdateStatusRequest is a heartbeat or a status change.
type NodeUpdateStatusRequest struct {
	NodeID    string
	Status    string
	UpdatedAt int64
	// CSILeaderTerm is as in NodeRegisterRequest.
	CSILeaderTerm uint64
	// Evals are created by the server: a node going down or coming back
	// re-evaluates the jobs it affects.
	Evals []*Evaluation
	WriteRequest
}

// NodeDeregisterRequest removes nodes from the cluster.
type NodeDeregisterRequest struct {
	NodeIDs []string
	WriteRequest
}

// NodeServerInfo names a server a client may fail over to.
type NodeServerInfo struct {
	RPCAdvertiseAddr string
	Datacenter       string
}

// NodeUpdateResponse answers register and heartbeat calls.
type NodeUpdateResponse struct {
	// HeartbeatTTL is how soon the node must heartbeat again.
	HeartbeatTTL time.Duration
	// LeaderRPCAddr is the leader's RPC address, if known.
	LeaderRPCAddr string
	// Servers are the servers the client may use.
	Servers []*NodeServerInfo
	// ClusterID is the cluster the answering servers belong to, if known.
	ClusterID string
	// FreeClaimsAfter is the shortest time after this answer in which the
	// servers may declare the node down and free its volume claims, if
	// it does not heartbeat again (the smaller of the minimum and the
	// failover TTL, plus the grace). A client stops its claim-holding
	// allocations well inside it.
	FreeClaimsAfter time.Duration
	// LeaderTerm is the Raft term of the leader that answered, zero if it
	// had no lanes open yet. The client then refuses controller calls from
	// earlier terms (see CSIControllerQuery.LeaderTerm): a deposed leader's
	// call still on its way when the node comes back from an outage, during
	// which the new leader may have moved the plugin's calls elsewhere.
	LeaderTerm uint64
	// LeaderTermResetFrom, when set, is the CSILeaderTerm the client
	// reported, above LeaderTerm: the leader verified with a quorum that it
	// still leads, so that term is another Raft cluster's (servers rebuilt
	// and restored from a snapshot start their terms again). The client
	// replaces it with LeaderTerm if it still holds it.
	LeaderTermResetFrom uint64
	// MinServerVersion is the oldest build among the servers the answering
	// leader knows, alive or failed (internal/upgrade); empty from builds
	// before 0.2.0. The client gates what it enforces on it, as the
	// servers gate what they send.
	MinServerVersion string
	// QueryMeta.Index is the index of the write, or of the node as read.
	QueryMeta
}

// NodeListRequest lists nodes.
type NodeListRequest struct {
	QueryOptions
}

// NodeListResponse carries node stubs.
type NodeListResponse struct {
	Nodes []*NodeListStub
	QueryMeta
}

// NodeSpecificRequest names one node.
type NodeSpecificRequest struct {
	NodeID   string
	SecretID string
	QueryOptions
}

// SingleNodeResponse carries one node, or nil when there is none.
type SingleNodeResponse struct {
	Node *Node
	QueryMeta
}
