package structs

// Requests and responses of volume expansion. An expansion is a
// destructive controller call: it runs in the plugin's lane on the leader
// (ControllerExpandVolume), then, when the plugin asks for it, on every
// node where the volume is mounted, while it stays mounted
// (NodeExpandVolume).

// CSIVolumeExpandRequest grows a registered volume to at least
// CapacityMin bytes (and at most CapacityMax, when that is set). A size
// below the volume's capacity is refused: volumes never shrink.
type CSIVolumeExpandRequest struct {
	VolumeID    string
	CapacityMin int64
	CapacityMax int64
	WriteRequest
}

// CSIVolumeExpandResponse carries the volume as registered after the
// expansion, without secrets.
type CSIVolumeExpandResponse struct {
	Volume *CSIVolume
	QueryMeta
}

// ClientCSIControllerExpandVolumeRequest asks a controller plugin to grow
// a volume.
type ClientCSIControllerExpandVolumeRequest struct {
	PluginID         string
	ExternalVolumeID string
	CapacityMin      int64
	CapacityMax      int64
	// Capability is one the volume is registered with; optional in CSI.
	Capability   *CSIVolumeCapability
	MountOptions *CSIMountOptions
	Secrets      map[string]string
	CSIControllerQuery
}

// ClientCSIControllerExpandVolumeResponse is the provider's answer.
type ClientCSIControllerExpandVolumeResponse struct {
	CapacityBytes int64
	// NodeExpansionRequired says the node holding the volume must grow
	// what it mounted (a file system) before a task sees the new size.
	NodeExpansionRequired bool
	CSIControllerReply
}

// ClientCSINodeExpandVolumeRequest asks a client to grow a volume it has
// mounted for an allocation. A client that has the volume neither staged
// nor published succeeds without calling the plugin: a later stage sees
// the new size.
type ClientCSINodeExpandVolumeRequest struct {
	PluginID       string
	VolumeID       string // Roam's volume ID
	ExternalID     string
	AllocID        string
	CapacityMin    int64
	CapacityMax    int64
	AccessMode     string
	AttachmentMode string
	MountOptions   *CSIMountOptions
}

// ClientCSINodeExpandVolumeResponse says what the node did.
type ClientCSINodeExpandVolumeResponse struct {
	// CapacityBytes is the size the node plugin reported, 0 if it did not
	// say or was not called.
	CapacityBytes int64
	// Expanded is false when nothing was mounted there to grow.
	Expanded bool
}
