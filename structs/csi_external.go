package structs

// MaxExternalPerPage bounds one page of a provider's volume listing.
const MaxExternalPerPage = 1000

// CSIVolumeExternalListRequest lists one page of the volumes a plugin's
// storage provider has, registered or not (ListVolumes).
type CSIVolumeExternalListRequest struct {
	PluginID  string
	PerPage   int32
	NextToken string
	QueryOptions
}

// CSIVolumeExternalStub is the provider's view of one volume, in Nomad's
// api.CSIVolumeExternalStub shape; every ID is the provider's.
type CSIVolumeExternalStub struct {
	ExternalID               string
	CapacityBytes            int64
	VolumeContext            map[string]string
	CloneID                  string
	SnapshotID               string
	PublishedExternalNodeIDs []string
	IsAbnormal               bool
	Status                   string
}

// CSIVolumeExternalListResponse is one page; NextToken is empty on the
// last.
type CSIVolumeExternalListResponse struct {
	Volumes   []*CSIVolumeExternalStub
	NextToken string
	QueryMeta
}

// ClientCSIControllerListVolumesRequest asks a controller plugin for one
// page of its volumes.
type ClientCSIControllerListVolumesRequest struct {
	PluginID      string
	MaxEntries    int32
	StartingToken string
	CSIControllerQuery
}

// ClientCSIControllerListVolumesResponse is one page of volumes.
type ClientCSIControllerListVolumesResponse struct {
	Volumes   []*CSIVolumeExternalStub
	NextToken string
}
