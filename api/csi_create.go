package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
)

// CSIVolumeCreateRequest is the body of a create.
type CSIVolumeCreateRequest struct {
	Volumes []*CSIVolume
}

// CSIVolumeCreateResponse carries the created volumes, without secrets.
type CSIVolumeCreateResponse struct {
	Volumes  []*CSIVolume
	Warnings string
}

// CSISnapshot is a snapshot of a volume, as its plugin reports it.
// Name, Secrets and Parameters are sent on create; SourceVolumeID names
// the volume to snapshot.
type CSISnapshot struct {
	ID                     string
	ExternalSourceVolumeID string
	SizeBytes              int64
	// CreateTime is a Unix time in seconds.
	CreateTime     int64
	IsReady        bool
	SourceVolumeID string
	PluginID       string
	Name           string            `json:",omitempty"`
	Secrets        map[string]string `json:",omitempty"`
	Parameters     map[string]string `json:",omitempty"`
}

// CSISnapshotCreateRequest is the body of a snapshot create.
type CSISnapshotCreateRequest struct {
	Snapshots []*CSISnapshot
}

// CSISnapshotCreateResponse carries the snapshots taken.
type CSISnapshotCreateResponse struct {
	Snapshots []*CSISnapshot
}

// CSISnapshotListResponse is one page of a plugin's snapshots; NextToken
// is empty on the last page.
type CSISnapshotListResponse struct {
	Snapshots []*CSISnapshot
	NextToken string
}

// Create creates vol in the storage provider through its plugin's
// controller and registers it; ExternalID is assigned by the provider. A
// bad volume or an unknown plugin is an *UnexpectedResponseError with
// status 400.
func (v *CSIVolumes) Create(vol *CSIVolume, w *WriteOptions) ([]*CSIVolume, *WriteMeta, error) {
	req := &CSIVolumeCreateRequest{Volumes: []*CSIVolume{vol}}
	var out CSIVolumeCreateResponse
	wm, err := v.c.write(http.MethodPut, "/v1/volume/csi/"+vol.ID+"/create", nil, req, &out, w)
	if err != nil {
		return nil, nil, err
	}
	return out.Volumes, wm, nil
}

// Delete deletes volume id in the storage provider and deregisters it. A
// claimed volume is refused.
func (v *CSIVolumes) Delete(id string, w *WriteOptions) (*WriteMeta, error) {
	return v.c.write(http.MethodDelete, "/v1/volume/csi/"+id+"/delete", nil, nil, nil, w)
}

// Detach releases the claims on volume id held on nodeID, whose
// allocations must all be terminal.
func (v *CSIVolumes) Detach(id, nodeID string, w *WriteOptions) (*WriteMeta, error) {
	params := url.Values{"node": {nodeID}}
	return v.c.write(http.MethodDelete, "/v1/volume/csi/"+id+"/detach", params, nil, nil, w)
}

// Expand grows volume id to at least min bytes (at most max, when above
// 0), at the controller and on every node where it is mounted, and
// returns the volume as registered. A size below its capacity is refused.
func (v *CSIVolumes) Expand(id string, min, max int64, w *WriteOptions) (*CSIVolume, *WriteMeta, error) {
	req := struct{ RequestedCapacityMin, RequestedCapacityMax int64 }{min, max}
	var out CSIVolume
	wm, err := v.c.write(http.MethodPut, "/v1/volume/csi/"+id+"/expand", nil, req, &out, w)
	if err != nil {
		return nil, nil, err
	}
	return &out, wm, nil
}

// CreateSnapshot snapshots snap.SourceVolumeID, named snap.Name (the
// server makes up a name when it is empty).
func (v *CSIVolumes) CreateSnapshot(snap *CSISnapshot, w *WriteOptions) (*CSISnapshotCreateResponse, *WriteMeta, error) {
	req := &CSISnapshotCreateRequest{Snapshots: []*CSISnapshot{snap}}
	var out CSISnapshotCreateResponse
	wm, err := v.c.write(http.MethodPut, "/v1/volumes/snapshot", nil, req, &out, w)
	if err != nil {
		return nil, nil, err
	}
	return &out, wm, nil
}

// DeleteSnapshot deletes snapshot snapshotID of plugin pluginID. Deleting
// an unknown snapshot succeeds.
func (v *CSIVolumes) DeleteSnapshot(pluginID, snapshotID string, w *WriteOptions) (*WriteMeta, error) {
	params := url.Values{"plugin_id": {pluginID}, "snapshot_id": {snapshotID}}
	return v.c.write(http.MethodDelete, "/v1/volumes/snapshot", params, nil, nil, w)
}

// ListSnapshots returns one page of pluginID's snapshots, starting at
// nextToken (empty for the first page).
func (v *CSIVolumes) ListSnapshots(pluginID, nextToken string, q *QueryOptions) (*CSISnapshotListResponse, *QueryMeta, error) {
	params := url.Values{"plugin_id": {pluginID}}
	if nextToken != "" {
		params.Set("next_token", nextToken)
	}
	buf, qm, err := v.c.rawQuery("/v1/volumes/snapshot", params, q)
	if err != nil {
		return nil, nil, err
	}
	var out CSISnapshotListResponse
	if err := json.Unmarshal(buf, &out); err != nil {
		return nil, nil, fmt.Errorf("api: decode response: %w", err)
	}
	return &out, qm, nil
}

// CSIVolumeExternalStub is one volume as the storage provider lists it.
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

// CSIVolumeListExternalResponse is one page of a provider's volumes.
type CSIVolumeListExternalResponse struct {
	Volumes   []*CSIVolumeExternalStub
	NextToken string
}

// ListExternal returns one page (perPage entries at most, 0 for the
// provider's choice) of the volumes pluginID's storage provider has,
// starting at nextToken (empty for the first page).
func (v *CSIVolumes) ListExternal(pluginID string, perPage int32, nextToken string, q *QueryOptions) (*CSIVolumeListExternalResponse, *QueryMeta, error) {
	params := url.Values{"plugin_id": {pluginID}}
	if perPage != 0 {
		params.Set("per_page", strconv.Itoa(int(perPage)))
	}
	if nextToken != "" {
		params.Set("next_token", nextToken)
	}
	buf, qm, err := v.c.rawQuery("/v1/volumes/external", params, q)
	if err != nil {
		return nil, nil, err
	}
	var out CSIVolumeListExternalResponse
	if err := json.Unmarshal(buf, &out); err != nil {
		return nil, nil, fmt.Errorf("decode external volumes: %w", err)
	}
	return &out, qm, nil
}
