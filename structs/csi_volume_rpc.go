package structs

// Requests and responses of the CSIVolume and CSIPlugin services.

// CSIVolumeRegisterRequest registers volumes that already exist in the
// storage provider.
type CSIVolumeRegisterRequest struct {
	Volumes []*CSIVolume
	WriteRequest
}

// CSIVolumeRegisterResponse answers a register.
type CSIVolumeRegisterResponse struct {
	QueryMeta
}

// CSIVolumeDeregisterRequest removes volume registrations. A claimed
// volume is refused unless Force, and even then only when every claiming
// allocation is terminal.
type CSIVolumeDeregisterRequest struct {
	VolumeIDs []string
	Force     bool
	WriteRequest
}

// CSIVolumeDeregisterResponse answers a deregister.
type CSIVolumeDeregisterResponse struct {
	QueryMeta
}

// CSIVolumeListRequest lists volumes, optionally of one plugin.
type CSIVolumeListRequest struct {
	PluginID string
	QueryOptions
}

// CSIVolListStub is a volume in a list.
type CSIVolListStub struct {
	ID                  string
	Namespace           string
	Name                string
	ExternalID          string
	PluginID            string
	Provider            string
	AccessMode          string
	AttachmentMode      string
	CurrentReaders      int
	CurrentWriters      int
	Schedulable         bool
	ControllerRequired  bool
	ControllersHealthy  int
	ControllersExpected int
	NodesHealthy        int
	NodesExpected       int
	CreateIndex         uint64
	ModifyIndex         uint64
}

// CSIVolumeListResponse carries volume stubs.
type CSIVolumeListResponse struct {
	Volumes []*CSIVolListStub
	QueryMeta
}

// CSIVolumeGetRequest names one volume.
type CSIVolumeGetRequest struct {
	ID string
	QueryOptions
}

// CSIVolumeGetResponse carries one volume without secrets, nil if none.
type CSIVolumeGetResponse struct {
	Volume *CSIVolume
	QueryMeta
}

// CSIPluginListRequest lists plugins.
type CSIPluginListRequest struct {
	QueryOptions
}

// CSIPluginListStub is a plugin in a list.
type CSIPluginListStub struct {
	ID                  string
	Provider            string
	ControllerRequired  bool
	ControllersHealthy  int
	ControllersExpected int
	NodesHealthy        int
	NodesExpected       int
	CreateIndex         uint64
	ModifyIndex         uint64
}

// CSIPluginListResponse carries plugin stubs.
type CSIPluginListResponse struct {
	Plugins []*CSIPluginListStub
	QueryMeta
}

// CSIPluginGetRequest names one plugin.
type CSIPluginGetRequest struct {
	ID string
	QueryOptions
}

// CSIPluginGetResponse carries one plugin, nil if none.
type CSIPluginGetResponse struct {
	Plugin *CSIPlugin
	QueryMeta
}

// CSIVolumeClaimUpdateRequest is the Raft entry of one claim transition.
type CSIVolumeClaimUpdateRequest struct {
	Namespace string
	VolumeID  string
	Claim     *CSIVolumeClaim
	WriteRequest
}

// CSIVolumeClaimRequest asks for (State taken) or releases (State
// unpublishing) an allocation's claim on a volume. Only the allocation's
// node may claim or release (its secret as the token).
type CSIVolumeClaimRequest struct {
	VolumeID       string
	AllocationID   string
	NodeID         string
	Mode           string // read or write
	AccessMode     string
	AttachmentMode string
	// State is CSIVolumeClaimStateTaken to claim, or
	// CSIVolumeClaimStateUnpublishing to release.
	State CSIClaimState
	WriteRequest
}

// CSIVolumeClaimResponse carries what the node needs to stage and publish
// the volume: the controller's publish context and the volume (with the
// secrets the node plugin needs; only the claiming node receives them).
type CSIVolumeClaimResponse struct {
	PublishContext map[string]string
	Volume         *CSIVolume
	QueryMeta
}
