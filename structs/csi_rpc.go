package structs

import "time"

// Requests and responses of the ClientCSI service, which servers call on a
// client over its session to reach the CSI plugins running there. Every
// controller call passes the client's per-plugin lane, so calls for one
// plugin reach it one at a time whoever sends them.

// CSIControllerQuery names the client whose controller plugin should serve
// a request, and the leader that sends it. The server routes on
// ControllerNodeID; the client ignores it.
type CSIControllerQuery struct {
	ControllerNodeID string
	// LeaderTerm is the Raft term of the leader whose controller lane sent
	// the call, zero for a call from outside a lane (a read). A client
	// refuses a call whose term is below one it has already seen, and so
	// does a server relaying it: that call comes from a deposed leader and
	// arrived late (held by a slow relay, or by a network that was cut),
	// after the new leader may have moved the plugin's calls elsewhere.
	LeaderTerm uint64
	// StartWithin bounds how long a lane call may wait in the client's
	// lane before it starts, counted from its arrival there; one whose
	// turn comes later is refused unrun (ErrCSIUnavailable). Timeout, when
	// set, bounds the call once started, as the client's own
	// csi_controller_call_timeout does (the smaller wins). With both the
	// sender knows when a call it lost track of has surely ended at the
	// client, which is how long its fence holds (see nomad's
	// unknownCallEnds). Zero: no bound (a sender older than these fields).
	StartWithin time.Duration `json:",omitempty"`
	Timeout     time.Duration `json:",omitempty"`
}

// CSIControllerReply is what every destructive controller call's answer
// says of the client's lane, beside the call's own result.
type CSIControllerReply struct {
	// LaneBusyBefore: when this call ended, a call that had reached the
	// client's lane for the plugin before it was still queued or running
	// there. A lane that runs one call at a time never sets it (and
	// clients before upgrade.ControllerConcurrency never do), so an answer
	// without it means every call sent there earlier has ended.
	LaneBusyBefore bool `json:",omitempty"`
}

// ClientCSIControllerAttachVolumeRequest asks a controller plugin to attach
// (ControllerPublishVolume) a volume to a node.
type ClientCSIControllerAttachVolumeRequest struct {
	PluginID string
	// VolumeID is the volume's ID in the storage provider (its external ID).
	VolumeID string
	// ClientCSINodeID is the node's ID in the storage provider, as the node
	// plugin reported it (CSINodeInfo.ID).
	ClientCSINodeID string
	AttachmentMode  string
	AccessMode      string
	ReadOnly        bool
	MountOptions    *CSIMountOptions
	Secrets         map[string]string
	VolumeContext   map[string]string
	CSIControllerQuery
}

// ClientCSIControllerAttachVolumeResponse carries what the node plugin needs
// to stage and publish the volume.
type ClientCSIControllerAttachVolumeResponse struct {
	PublishContext map[string]string
	CSIControllerReply
}

// ClientCSIControllerDetachVolumeRequest asks a controller plugin to detach
// (ControllerUnpublishVolume) a volume from a node.
type ClientCSIControllerDetachVolumeRequest struct {
	PluginID        string
	VolumeID        string // external ID
	ClientCSINodeID string
	Secrets         map[string]string
	CSIControllerQuery
}

// ClientCSIControllerDetachVolumeResponse is empty.
type ClientCSIControllerDetachVolumeResponse struct {
	CSIControllerReply
}

// ClientCSIControllerCreateVolumeRequest asks a controller plugin to create
// a volume.
type ClientCSIControllerCreateVolumeRequest struct {
	PluginID string
	// Name is the idempotency key the provider sees.
	Name         string
	CapacityMin  int64
	CapacityMax  int64
	Capabilities []*CSIVolumeCapability
	MountOptions *CSIMountOptions
	Parameters   map[string]string
	Secrets      map[string]string
	// SnapshotID or CloneID, at most one, name the content source.
	SnapshotID string
	CloneID    string
	// Topologies is the spec's topology request, nil for none.
	Topologies *CSITopologyRequest
	CSIControllerQuery
}

// ClientCSIControllerCreateVolumeResponse describes the created volume.
type ClientCSIControllerCreateVolumeResponse struct {
	ExternalVolumeID string
	CapacityBytes    int64
	VolumeContext    map[string]string
	// Topologies is where the provider made the volume accessible.
	Topologies []*CSITopology
	CSIControllerReply
}

// ClientCSIControllerDeleteVolumeRequest asks a controller plugin to delete
// a volume.
type ClientCSIControllerDeleteVolumeRequest struct {
	PluginID         string
	ExternalVolumeID string
	Secrets          map[string]string
	CSIControllerQuery
}

// ClientCSIControllerDeleteVolumeResponse is empty.
type ClientCSIControllerDeleteVolumeResponse struct {
	CSIControllerReply
}

// ClientCSIControllerValidateVolumeRequest asks a controller plugin whether
// a volume supports the given capabilities.
type ClientCSIControllerValidateVolumeRequest struct {
	PluginID     string
	VolumeID     string // external ID
	Capabilities []*CSIVolumeCapability
	MountOptions *CSIMountOptions
	Parameters   map[string]string
	Context      map[string]string
	Secrets      map[string]string
	CSIControllerQuery
}

// ClientCSIControllerValidateVolumeResponse is empty: a volume that does not
// support the capabilities is an error wrapping ErrCSIInvalidArgument.
type ClientCSIControllerValidateVolumeResponse struct{}

// ClientCSIControllerCreateSnapshotRequest asks a controller plugin to
// snapshot a volume.
type ClientCSIControllerCreateSnapshotRequest struct {
	PluginID         string
	ExternalVolumeID string
	Name             string
	Parameters       map[string]string
	Secrets          map[string]string
	CSIControllerQuery
}

// CSISnapshot is a snapshot as a plugin reports it.
type CSISnapshot struct {
	ID               string
	ExternalSourceID string
	SizeBytes        int64
	CreateTime       int64 // Unix seconds
	IsReady          bool
	PluginID         string
}

// ClientCSIControllerCreateSnapshotResponse carries the snapshot.
type ClientCSIControllerCreateSnapshotResponse struct {
	Snapshot *CSISnapshot
	CSIControllerReply
}

// ClientCSIControllerDeleteSnapshotRequest asks a controller plugin to
// delete a snapshot.
type ClientCSIControllerDeleteSnapshotRequest struct {
	PluginID string
	ID       string
	Secrets  map[string]string
	CSIControllerQuery
}

// ClientCSIControllerDeleteSnapshotResponse is empty.
type ClientCSIControllerDeleteSnapshotResponse struct {
	CSIControllerReply
}

// ClientCSIControllerListSnapshotsRequest lists a plugin's snapshots, one
// page at a time.
type ClientCSIControllerListSnapshotsRequest struct {
	PluginID      string
	MaxEntries    int32
	StartingToken string
	Secrets       map[string]string
	CSIControllerQuery
}

// ClientCSIControllerListSnapshotsResponse is one page of snapshots.
type ClientCSIControllerListSnapshotsResponse struct {
	Snapshots []*CSISnapshot
	NextToken string
}

// ClientCSINodeDetachVolumeRequest asks a client to unpublish a volume from
// an allocation and, if no other allocation there uses it, unstage it.
type ClientCSINodeDetachVolumeRequest struct {
	PluginID       string
	VolumeID       string // Roam's volume ID
	ExternalID     string
	AllocID        string
	NodeID         string
	AttachmentMode string
	AccessMode     string
	ReadOnly       bool
}

// ClientCSINodeDetachVolumeResponse is empty.
type ClientCSINodeDetachVolumeResponse struct{}

// ClientCSINodeVolumeUsersRequest asks a client which of its allocations
// use a volume on the node right now. The leader asks before it
// unpublishes a provider attachment that no claim explains (after a
// snapshot restore).
type ClientCSINodeVolumeUsersRequest struct {
	PluginID string
	VolumeID string // Roam's volume ID
}

// ClientCSINodeVolumeUsersResponse names the allocations that have the
// volume published on the node, and whether it is staged there. Either
// means the node still uses it.
type ClientCSINodeVolumeUsersResponse struct {
	AllocIDs []string
	Staged   bool
}

// InUse says whether the node still uses the volume.
func (r *ClientCSINodeVolumeUsersResponse) InUse() bool {
	return len(r.AllocIDs) > 0 || r.Staged
}
