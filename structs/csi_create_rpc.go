package structs

// Requests and responses of the CSIVolume calls that change the storage
// provider itself (create, delete, snapshot) or release claims on an
// operator's word (unpublish). Every destructive one runs in the plugin's
// lane on the leader.

// CSIVolumeCreateRequest creates volumes in the storage provider and
// registers them. ExternalID is ignored: the provider assigns it.
type CSIVolumeCreateRequest struct {
	Volumes []*CSIVolume
	WriteRequest
}

// CSIVolumeCreateResponse carries the created volumes, without secrets.
type CSIVolumeCreateResponse struct {
	Volumes []*CSIVolume
	QueryMeta
}

// CSIVolumeDeleteRequest deletes volumes in the storage provider and
// removes their registrations. A claimed volume is refused.
type CSIVolumeDeleteRequest struct {
	VolumeIDs []string
	WriteRequest
}

// CSIVolumeDeleteResponse answers a delete.
type CSIVolumeDeleteResponse struct {
	QueryMeta
}

// CSIVolumeUnpublishRequest releases the claims on VolumeID held by
// allocations on NodeID. Every such allocation must be terminal (or gone).
type CSIVolumeUnpublishRequest struct {
	VolumeID string
	NodeID   string
	WriteRequest
}

// CSIVolumeUnpublishResponse names the allocations whose claims were freed.
type CSIVolumeUnpublishResponse struct {
	Released []string
	QueryMeta
}

// CSISnapshotSpec asks for one snapshot of a registered volume.
type CSISnapshotSpec struct {
	SourceVolumeID string
	// Name is the idempotency key the provider sees; the server makes one
	// up when it is empty.
	Name       string
	Parameters map[string]string
	// Secrets default to the source volume's.
	Secrets map[string]string
}

// CSISnapshotCreateRequest snapshots volumes.
type CSISnapshotCreateRequest struct {
	Snapshots []*CSISnapshotSpec
	WriteRequest
}

// CSISnapshotCreateResponse carries the snapshots, in request order.
type CSISnapshotCreateResponse struct {
	Snapshots []*CSISnapshot
	QueryMeta
}

// CSISnapshotDeleteRequest deletes one snapshot of a plugin. Deleting an
// unknown snapshot succeeds.
type CSISnapshotDeleteRequest struct {
	PluginID   string
	SnapshotID string
	Secrets    map[string]string
	WriteRequest
}

// CSISnapshotDeleteResponse answers a snapshot delete.
type CSISnapshotDeleteResponse struct {
	QueryMeta
}

// CSISnapshotListRequest lists one page of a plugin's snapshots.
type CSISnapshotListRequest struct {
	PluginID      string
	MaxEntries    int32
	StartingToken string
	Secrets       map[string]string
	QueryOptions
}

// CSISnapshotListResponse is one page of snapshots; NextToken is empty on
// the last page.
type CSISnapshotListResponse struct {
	Snapshots []*CSISnapshot
	NextToken string
	QueryMeta
}
