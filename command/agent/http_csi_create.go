package agent

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/roamhq/roam/api"
	"github.com/roamhq/roam/structs"
)

// csiSnapshotPath is Nomad's snapshot route: PUT creates, DELETE deletes,
// GET lists.
const csiSnapshotPath = "/v1/volumes/snapshot"

// addCSICreateRoutes adds the routes that change the storage provider
// (create, delete, snapshots) and the operator's detach.
func (s *HTTPServer) addCSICreateRoutes() {
	s.routes[subRoute(csiVolumePathPrefix, "create")] = map[string]handlerFunc{
		http.MethodPut:  s.csiVolumeCreate,
		http.MethodPost: s.csiVolumeCreate,
	}
	s.routes[subRoute(csiVolumePathPrefix, "delete")] = map[string]handlerFunc{
		http.MethodDelete: s.csiVolumeDelete,
	}
	s.routes[subRoute(csiVolumePathPrefix, "detach")] = map[string]handlerFunc{
		http.MethodDelete: s.csiVolumeDetach,
		http.MethodPut:    s.csiVolumeDetach,
	}
	s.routes[subRoute(csiVolumePathPrefix, "expand")] = map[string]handlerFunc{
		http.MethodPut:  s.csiVolumeExpand,
		http.MethodPost: s.csiVolumeExpand,
	}
	s.routes[csiSnapshotPath] = map[string]handlerFunc{
		http.MethodPut:    s.csiSnapshotCreate,
		http.MethodPost:   s.csiSnapshotCreate,
		http.MethodDelete: s.csiSnapshotDelete,
		http.MethodGet:    s.csiSnapshotList,
	}
}

// csiVolumeCreate answers PUT/POST /v1/volume/csi/:id/create with body
// {"Volumes": [...]}, shaped as for a register but without external IDs.
// A single volume without an ID takes the path's.
func (s *HTTPServer) csiVolumeCreate(w http.ResponseWriter, r *http.Request) (any, error) {
	vols, err := decodeVolumesBody(r, "create")
	if err != nil {
		return nil, err
	}
	args := structs.CSIVolumeCreateRequest{Volumes: vols}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.CSIVolumeCreateResponse
	if err := s.rpc(r, "CSIVolume.Create", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	out := api.CSIVolumeCreateResponse{Volumes: make([]*api.CSIVolume, 0, len(reply.Volumes))}
	plugins := map[string]*structs.CSIPlugin{}
	for _, v := range reply.Volumes {
		p, ok := plugins[v.PluginID]
		if !ok {
			// The plugin's health only decorates the answer: a failed
			// read leaves it out rather than failing a done create.
			pargs := structs.CSIPluginGetRequest{ID: v.PluginID}
			pargs.Region = args.Region
			var preply structs.CSIPluginGetResponse
			if err := s.rpc(r, "CSIPlugin.Get", &pargs, &preply); err == nil {
				p = preply.Plugin
			}
			plugins[v.PluginID] = p
		}
		out.Volumes = append(out.Volumes, apiCSIVolume(v, p))
	}
	return out, nil
}

// csiVolumeDelete answers DELETE /v1/volume/csi/:id/delete: the volume is
// deleted in the storage provider and deregistered. A claimed volume is a
// 400.
func (s *HTTPServer) csiVolumeDelete(w http.ResponseWriter, r *http.Request) (any, error) {
	args := structs.CSIVolumeDeleteRequest{VolumeIDs: []string{pathID(r, csiVolumePathPrefix)}}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.CSIVolumeDeleteResponse
	if err := s.rpc(r, "CSIVolume.Delete", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	return struct{}{}, nil
}

// csiVolumeDetach answers DELETE/PUT /v1/volume/csi/:id/detach?node=ID:
// the volume's claims on that node are released, which requires their
// allocations to be terminal.
func (s *HTTPServer) csiVolumeDetach(w http.ResponseWriter, r *http.Request) (any, error) {
	node := r.URL.Query().Get("node")
	if node == "" {
		return nil, badRequest("Missing node")
	}
	args := structs.CSIVolumeUnpublishRequest{VolumeID: pathID(r, csiVolumePathPrefix), NodeID: node}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.CSIVolumeUnpublishResponse
	if err := s.rpc(r, "CSIVolume.Unpublish", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	return struct{}{}, nil
}

// csiSnapshotJSON is Nomad's api.CSISnapshot.
type csiSnapshotJSON struct {
	ID                     string
	ExternalSourceVolumeID string
	SizeBytes              int64
	CreateTime             int64
	IsReady                bool
	SourceVolumeID         string
	PluginID               string
	Name                   string            `json:",omitempty"`
	Secrets                map[string]string `json:",omitempty"`
	Parameters             map[string]string `json:",omitempty"`
}

// csiSnapshotCreateBody is Nomad's api.CSISnapshotCreateRequest.
type csiSnapshotCreateBody struct {
	Snapshots []*csiSnapshotJSON
}

// csiSnapshotsReply is Nomad's api.CSISnapshotCreateResponse and
// api.CSISnapshotListResponse.
type csiSnapshotsReply struct {
	Snapshots []*csiSnapshotJSON
	NextToken string `json:",omitempty"`
}

// snapshotView renders a plugin's snapshot; sourceVolID is Roam's ID of
// the source volume when known.
func snapshotView(sn *structs.CSISnapshot, sourceVolID, name string) *csiSnapshotJSON {
	return &csiSnapshotJSON{
		ID: sn.ID, ExternalSourceVolumeID: sn.ExternalSourceID, SizeBytes: sn.SizeBytes,
		CreateTime: sn.CreateTime, IsReady: sn.IsReady, SourceVolumeID: sourceVolID,
		PluginID: sn.PluginID, Name: name,
	}
}

// csiSnapshotCreate answers PUT/POST /v1/volumes/snapshot with body
// {"Snapshots": [{"SourceVolumeID": ..., "Name": ...}]}.
func (s *HTTPServer) csiSnapshotCreate(w http.ResponseWriter, r *http.Request) (any, error) {
	body, err := readBody(r, maxVolumeBody)
	if err != nil {
		return nil, err
	}
	var in csiSnapshotCreateBody
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, badRequest("Failed to decode snapshot create request: %v", err)
	}
	if len(in.Snapshots) == 0 {
		return nil, badRequest("Snapshots must be specified")
	}
	var args structs.CSISnapshotCreateRequest
	for _, sn := range in.Snapshots {
		if sn == nil {
			return nil, badRequest("Snapshots must not hold null")
		}
		args.Snapshots = append(args.Snapshots, &structs.CSISnapshotSpec{
			SourceVolumeID: sn.SourceVolumeID, Name: sn.Name, Parameters: sn.Parameters, Secrets: sn.Secrets,
		})
	}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.CSISnapshotCreateResponse
	if err := s.rpc(r, "CSIVolume.CreateSnapshot", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	out := csiSnapshotsReply{Snapshots: make([]*csiSnapshotJSON, 0, len(reply.Snapshots))}
	for i, sn := range reply.Snapshots {
		var src, name string
		if i < len(args.Snapshots) {
			src, name = args.Snapshots[i].SourceVolumeID, args.Snapshots[i].Name
		}
		out.Snapshots = append(out.Snapshots, snapshotView(sn, src, name))
	}
	return out, nil
}

// csiSnapshotDelete answers DELETE /v1/volumes/snapshot?plugin_id=&snapshot_id=.
func (s *HTTPServer) csiSnapshotDelete(w http.ResponseWriter, r *http.Request) (any, error) {
	q := r.URL.Query()
	args := structs.CSISnapshotDeleteRequest{PluginID: q.Get("plugin_id"), SnapshotID: q.Get("snapshot_id")}
	if args.PluginID == "" || args.SnapshotID == "" {
		return nil, badRequest("Missing plugin_id or snapshot_id")
	}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.CSISnapshotDeleteResponse
	if err := s.rpc(r, "CSIVolume.DeleteSnapshot", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	return struct{}{}, nil
}

// csiSnapshotList answers GET /v1/volumes/snapshot?plugin_id=[&per_page=][&next_token=]
// with one page of the plugin's snapshots. It asks the plugin each time:
// it is not a blocking query.
func (s *HTTPServer) csiSnapshotList(w http.ResponseWriter, r *http.Request) (any, error) {
	q := r.URL.Query()
	args := structs.CSISnapshotListRequest{PluginID: q.Get("plugin_id"), StartingToken: q.Get("next_token")}
	if args.PluginID == "" {
		return nil, badRequest("Missing plugin_id")
	}
	if raw := q.Get("per_page"); raw != "" {
		n, err := strconv.ParseInt(raw, 10, 32)
		if err != nil || n < 0 {
			return nil, badRequest("Invalid per_page %q", raw)
		}
		args.MaxEntries = int32(n)
	}
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	args.MinQueryIndex = 0
	var reply structs.CSISnapshotListResponse
	if err := s.rpc(r, "CSIVolume.ListSnapshots", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	out := csiSnapshotsReply{Snapshots: make([]*csiSnapshotJSON, 0, len(reply.Snapshots)), NextToken: reply.NextToken}
	for _, sn := range reply.Snapshots {
		if sn != nil {
			out.Snapshots = append(out.Snapshots, snapshotView(sn, "", ""))
		}
	}
	return out, nil
}

// csiVolumeExpandBody is the body of PUT /v1/volume/csi/:id/expand, a
// Roam route (Nomad expands only by a register or create again).
type csiVolumeExpandBody struct {
	RequestedCapacityMin int64
	RequestedCapacityMax int64
}

// csiVolumeExpand answers PUT/POST /v1/volume/csi/:id/expand: the volume
// grows to at least RequestedCapacityMin bytes, at the controller and on
// every node where it is mounted. A size below its capacity is a 400.
func (s *HTTPServer) csiVolumeExpand(w http.ResponseWriter, r *http.Request) (any, error) {
	body, err := readBody(r, maxVolumeBody)
	if err != nil {
		return nil, err
	}
	var in csiVolumeExpandBody
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, badRequest("Failed to decode volume expand request: %v", err)
	}
	if in.RequestedCapacityMin <= 0 {
		return nil, badRequest("RequestedCapacityMin must be above 0")
	}
	args := structs.CSIVolumeExpandRequest{
		VolumeID: pathID(r, csiVolumePathPrefix), CapacityMin: in.RequestedCapacityMin, CapacityMax: in.RequestedCapacityMax,
	}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.CSIVolumeExpandResponse
	if err := s.rpc(r, "CSIVolume.Expand", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	var p *structs.CSIPlugin
	pargs := structs.CSIPluginGetRequest{ID: reply.Volume.PluginID}
	pargs.Region = args.Region
	var preply structs.CSIPluginGetResponse
	if err := s.rpc(r, "CSIPlugin.Get", &pargs, &preply); err == nil {
		p = preply.Plugin
	}
	return apiCSIVolume(reply.Volume, p), nil
}
