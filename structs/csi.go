package structs

import (
	"errors"
	"fmt"
)

// CSI access modes, with Nomad's spellings.
const (
	CSIAccessModeSingleNodeReader      = "single-node-reader-only"
	CSIAccessModeSingleNodeWriter      = "single-node-writer"
	CSIAccessModeMultiNodeReader       = "multi-node-reader-only"
	CSIAccessModeMultiNodeSingleWriter = "multi-node-single-writer"
	CSIAccessModeMultiNodeMultiWriter  = "multi-node-multi-writer"
)

// CSI attachment modes.
const (
	CSIAttachmentModeFilesystem  = "file-system"
	CSIAttachmentModeBlockDevice = "block-device"
)

// Claim modes.
const (
	CSIVolumeClaimRead  = "read"
	CSIVolumeClaimWrite = "write"
)

// Claim states. Each is checkpointed in Raft, so a new leader continues a
// claim where the old one stopped:
//
//	publishing → taken → [unpublishing →] node-detached → freed
//
// A release asks the node to let go (unpublishing) only when the node has
// not done so itself and is up. controller-detached is no longer written;
// a claim stored in it by an earlier build is freed next.
//
// A claim in publishing holds capacity but has no confirmed controller
// publish; a failed publish removes it. The next step from each state is
// decided in one place, nomad/csiclaim.
type CSIClaimState string

// The claim states, in order. CSIVolumeClaimStateFreed is the empty state
// a checkpoint writes to remove the claim.
const (
	CSIVolumeClaimStateFreed              CSIClaimState = ""
	CSIVolumeClaimStatePublishing         CSIClaimState = "publishing"
	CSIVolumeClaimStateTaken              CSIClaimState = "taken"
	CSIVolumeClaimStateUnpublishing       CSIClaimState = "unpublishing"
	CSIVolumeClaimStateNodeDetached       CSIClaimState = "node-detached"
	CSIVolumeClaimStateControllerDetached CSIClaimState = "controller-detached"
)

// CSIClaimStates lists every state a stored claim can be in.
var CSIClaimStates = []CSIClaimState{
	CSIVolumeClaimStatePublishing, CSIVolumeClaimStateTaken, CSIVolumeClaimStateUnpublishing,
	CSIVolumeClaimStateNodeDetached, CSIVolumeClaimStateControllerDetached,
}

// CSIClaimReleasable says whether a claim of alloc on node may be
// released: the allocation's tasks are known to be gone. That is so when
// the client reported the allocation terminal with every task dead, when
// the allocation is gone from state, or when the node is down or gone
// (its claims are then fenced by the controller detach). An allocation the
// servers asked to stop is not enough: its tasks may still be inside their
// kill timeout, writing. Every decision that a claim is free uses this
// rule (nomad/csiclaim.Releasable is the same, for the claim core).
func CSIClaimReleasable(alloc *Allocation, node *Node) bool {
	return alloc == nil || alloc.TasksGone() || node == nil || node.Status == NodeStatusDown
}

// ErrCSIMaxClaims means a volume has no room for another claim in the
// requested mode.
var ErrCSIMaxClaims = errors.New("volume max claims reached")

// CSIVolumeCapability is one access/attachment pair a volume supports.
type CSIVolumeCapability struct {
	AccessMode     string
	AttachmentMode string
}

// CSIVolume is a storage volume managed through a CSI plugin.
type CSIVolume struct {
	ID         string
	Name       string
	Namespace  string
	ExternalID string
	PluginID   string
	Provider   string

	RequestedCapabilities []*CSIVolumeCapability
	MountOptions          *CSIMountOptions
	// Secrets are passed to the plugin and never returned by reads.
	Secrets    map[string]string
	Parameters map[string]string
	Context    map[string]string

	CapacityMin int64
	CapacityMax int64
	Capacity    int64

	// SnapshotID or CloneID, at most one, is what a created volume was
	// made from: a snapshot of the plugin's, or the external ID of a
	// volume of the plugin's to copy. Only a create uses them; they are
	// kept as a record and never change.
	SnapshotID string
	CloneID    string

	// RequestedTopologies is the spec's topology_request, passed to the
	// provider on create. Topologies is where the volume is accessible:
	// what the provider answered on create, or the required topologies of
	// a registration. Empty means everywhere. Claims are placed only on
	// nodes inside one of them.
	RequestedTopologies *CSITopologyRequest
	Topologies          []*CSITopology

	// Claims are keyed by allocation ID.
	Claims map[string]*CSIVolumeClaim

	CreateIndex uint64
	ModifyIndex uint64
}

// CSIVolumeClaim ties a volume to an allocation on a node.
type CSIVolumeClaim struct {
	AllocationID   string
	NodeID         string
	ExternalNodeID string
	Mode           string // read or write
	AccessMode     string
	AttachmentMode string
	State          CSIClaimState
	// PublishContext is what the controller publish returned; the node
	// plugin needs it to stage and publish.
	PublishContext map[string]string
	UpdatedAt      int64
}

// singleNode reports whether mode lets the volume attach to one node only.
func singleNode(mode string) bool {
	return mode == CSIAccessModeSingleNodeReader || mode == CSIAccessModeSingleNodeWriter
}

// maxWriters is how many write claims mode admits.
func maxWriters(mode string) int {
	switch mode {
	case CSIAccessModeSingleNodeWriter, CSIAccessModeMultiNodeSingleWriter:
		return 1
	case CSIAccessModeMultiNodeMultiWriter:
		return -1 // no limit
	}
	return 0 // reader-only modes
}

// HasCapability reports whether the volume was registered with the pair.
func (v *CSIVolume) HasCapability(access, attachment string) bool {
	for _, c := range v.RequestedCapabilities {
		if c.AccessMode == access && c.AttachmentMode == attachment {
			return true
		}
	}
	return false
}

// CanClaim checks whether claim fits the volume beside its other claims.
// Every claim counts until it is freed, in whatever state: a claim still
// unpublishing holds its attachment. A claim's own earlier record (same
// allocation) does not count against it.
func (v *CSIVolume) CanClaim(c *CSIVolumeClaim) error {
	if !v.HasCapability(c.AccessMode, c.AttachmentMode) {
		return fmt.Errorf("%w: volume %s does not support access mode %q with attachment mode %q",
			ErrInvalidRequest, v.ID, c.AccessMode, c.AttachmentMode)
	}
	if c.Mode == CSIVolumeClaimWrite && maxWriters(c.AccessMode) == 0 {
		return fmt.Errorf("%w: volume %s: access mode %q is read-only", ErrInvalidRequest, v.ID, c.AccessMode)
	}
	if c.Mode != CSIVolumeClaimRead && c.Mode != CSIVolumeClaimWrite {
		return fmt.Errorf("%w: claim mode %q is not read or write", ErrInvalidRequest, c.Mode)
	}
	writers := 0
	for id, other := range v.Claims {
		if id == c.AllocationID {
			continue
		}
		// Claims in other access modes conflict unless both allow many nodes.
		if singleNode(c.AccessMode) || singleNode(other.AccessMode) {
			if other.NodeID != c.NodeID {
				return fmt.Errorf("%w: volume %s is claimed on node %s in mode %q", ErrCSIMaxClaims, v.ID, other.NodeID, other.AccessMode)
			}
		}
		if other.Mode == CSIVolumeClaimWrite {
			writers++
		}
	}
	if c.Mode == CSIVolumeClaimWrite {
		if limit := maxWriters(c.AccessMode); limit >= 0 && writers >= limit {
			return fmt.Errorf("%w: volume %s already has %d writer(s) in mode %q", ErrCSIMaxClaims, v.ID, writers, c.AccessMode)
		}
	}
	return nil
}

// Copy returns a deep copy.
func (v *CSIVolume) Copy() *CSIVolume {
	if v == nil {
		return nil
	}
	c := *v
	c.RequestedCapabilities = make([]*CSIVolumeCapability, 0, len(v.RequestedCapabilities))
	for _, rc := range v.RequestedCapabilities {
		x := *rc
		c.RequestedCapabilities = append(c.RequestedCapabilities, &x)
	}
	if v.MountOptions != nil {
		m := *v.MountOptions
		m.MountFlags = append([]string(nil), v.MountOptions.MountFlags...)
		c.MountOptions = &m
	}
	c.Secrets = copyStringMap(v.Secrets)
	c.Parameters = copyStringMap(v.Parameters)
	c.Context = copyStringMap(v.Context)
	c.RequestedTopologies = v.RequestedTopologies.Copy()
	c.Topologies = CopyTopologies(v.Topologies)
	c.Claims = make(map[string]*CSIVolumeClaim, len(v.Claims))
	for id, cl := range v.Claims {
		x := *cl
		x.PublishContext = copyStringMap(cl.PublishContext)
		c.Claims[id] = &x
	}
	return &c
}

// Sanitize returns a copy without secrets, for reads.
func (v *CSIVolume) Sanitize() *CSIVolume {
	c := v.Copy()
	if c != nil {
		c.Secrets = nil
	}
	return c
}

// CSIPlugin is a plugin as the cluster sees it, derived from node
// fingerprints: its controller and node instances and their health.
type CSIPlugin struct {
	ID                  string
	Provider            string
	Version             string
	ControllerRequired  bool
	Controllers         map[string]*CSIInfo // by node ID
	Nodes               map[string]*CSIInfo // by node ID
	ControllersHealthy  int
	ControllersExpected int
	NodesHealthy        int
	NodesExpected       int
	// ControllerConcurrency is how many destructive controller calls the
	// leader sends the plugin at once: the smallest controller_concurrency
	// of its healthy controllers, 1 when none is healthy.
	ControllerConcurrency int
	// ControllerConcurrencyWarning says why, when the healthy controllers
	// disagree on controller_concurrency; empty when they agree.
	ControllerConcurrencyWarning string `json:",omitempty"`
	CreateIndex                  uint64
	ModifyIndex                  uint64
}

// MaxVolumeCapacity bounds a volume's capacity_min (1 EiB): a request
// above it is refused before any plugin or Raft write sees it. (A
// capacity_max of any size is no bound, and allowed.)
const MaxVolumeCapacity = 1 << 60
