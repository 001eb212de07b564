package agent

import (
	"encoding/json"
	"net/http"
	"sort"
	"strconv"

	"github.com/roamhq/roam/api"
	"github.com/roamhq/roam/structs"
)

// Routes of the CSI volume and plugin API; each takes an ID after it.
const (
	csiVolumePathPrefix = "/v1/volume/csi/"
	csiPluginPathPrefix = "/v1/plugin/csi/"
)

// maxVolumeBody bounds a volume register request body.
const maxVolumeBody = 1 << 20

// addCSIRoutes adds the volume and plugin routes.
func (s *HTTPServer) addCSIRoutes() {
	s.routes["/v1/volumes"] = map[string]handlerFunc{http.MethodGet: s.csiVolumesList}
	s.routes[csiVolumePathPrefix] = map[string]handlerFunc{
		http.MethodGet:    s.csiVolumeGet,
		http.MethodPut:    s.csiVolumeRegister,
		http.MethodPost:   s.csiVolumeRegister,
		http.MethodDelete: s.csiVolumeDeregister,
	}
	s.routes["/v1/volumes/external"] = map[string]handlerFunc{http.MethodGet: s.csiVolumesExternal}
	s.routes["/v1/plugins"] = map[string]handlerFunc{http.MethodGet: s.csiPluginsList}
	s.routes[csiPluginPathPrefix] = map[string]handlerFunc{http.MethodGet: s.csiPluginGet}
	s.routes[csiLanesPath] = map[string]handlerFunc{http.MethodGet: s.csiLanes}
}

// csiLanesPath is a Roam route (Nomad has no lanes): the leader's
// controller lanes.
const csiLanesPath = "/v1/plugins/csi/lanes"

// csiLanes answers GET /v1/plugins/csi/lanes with every plugin lane the
// leader has used since it became leader: depth now, calls in flight,
// call and timeout counts and the latest calls. Always the leader's
// answer; not a blocking query.
func (s *HTTPServer) csiLanes(w http.ResponseWriter, r *http.Request) (any, error) {
	var args structs.CSILanesRequest
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	var reply structs.CSILanesResponse
	if err := s.rpc(r, "CSIPlugin.Lanes", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Lanes == nil {
		reply.Lanes = []*structs.CSILaneStats{}
	}
	return reply.Lanes, nil
}

// requireCSIType refuses list requests for any type but csi, the only one
// Roam has; Nomad requires the parameter too.
func requireCSIType(r *http.Request) error {
	switch t := r.URL.Query().Get("type"); t {
	case "csi":
		return nil
	case "":
		return badRequest("Missing type value: must be csi")
	default:
		return badRequest("Unsupported type %q: must be csi", t)
	}
}

// csiVolumesList answers GET /v1/volumes?type=csi[&plugin_id=][&prefix=]
// with volume stubs; a blocking query.
func (s *HTTPServer) csiVolumesList(w http.ResponseWriter, r *http.Request) (any, error) {
	if err := requireCSIType(r); err != nil {
		return nil, err
	}
	args := structs.CSIVolumeListRequest{PluginID: r.URL.Query().Get("plugin_id")}
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	var reply structs.CSIVolumeListResponse
	if err := s.rpc(r, "CSIVolume.List", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Volumes == nil {
		reply.Volumes = []*structs.CSIVolListStub{}
	}
	return reply.Volumes, nil
}

// csiVolumeInput is a volume as Nomad's api.CSIVolumeRegisterRequest
// carries it. Fields Roam has no use for (topologies, the read-only status
// fields Nomad's client echoes back) are ignored.
type csiVolumeInput struct {
	ID                    string
	Name                  string
	Namespace             string
	ExternalID            string
	PluginID              string
	AccessMode            string
	AttachmentMode        string
	MountOptions          *api.CSIMountOptions
	Secrets               map[string]string
	Parameters            map[string]string
	Context               map[string]string
	RequestedCapacityMin  int64
	RequestedCapacityMax  int64
	RequestedCapabilities []*api.CSIVolumeCapability
	SnapshotID            string
	CloneID               string
	RequestedTopologies   *structs.CSITopologyRequest
}

// csiVolumeRegisterBody is Nomad's api.CSIVolumeRegisterRequest.
type csiVolumeRegisterBody struct {
	Volumes []*csiVolumeInput
}

// toStruct converts the input to the server's volume.
func (in *csiVolumeInput) toStruct() *structs.CSIVolume {
	v := &structs.CSIVolume{
		ID: in.ID, Name: in.Name, Namespace: in.Namespace, ExternalID: in.ExternalID,
		PluginID: in.PluginID, Secrets: in.Secrets, Parameters: in.Parameters, Context: in.Context,
		CapacityMin: in.RequestedCapacityMin, CapacityMax: in.RequestedCapacityMax,
		SnapshotID: in.SnapshotID, CloneID: in.CloneID,
		RequestedTopologies: in.RequestedTopologies,
	}
	for _, c := range in.RequestedCapabilities {
		if c != nil {
			v.RequestedCapabilities = append(v.RequestedCapabilities,
				&structs.CSIVolumeCapability{AccessMode: c.AccessMode, AttachmentMode: c.AttachmentMode})
		}
	}
	// Nomad's older single access/attachment mode stands for one capability.
	if len(v.RequestedCapabilities) == 0 && (in.AccessMode != "" || in.AttachmentMode != "") {
		v.RequestedCapabilities = []*structs.CSIVolumeCapability{{AccessMode: in.AccessMode, AttachmentMode: in.AttachmentMode}}
	}
	if in.MountOptions != nil {
		v.MountOptions = &structs.CSIMountOptions{
			FSType: in.MountOptions.FSType, MountFlags: in.MountOptions.MountFlags,
		}
	}
	return v
}

// decodeVolumesBody reads a {"Volumes": [...]} body (register and create
// share it). A single volume without an ID takes the path's; a single
// volume with another ID is refused.
func decodeVolumesBody(r *http.Request, op string) ([]*structs.CSIVolume, error) {
	pathVolID := pathID(r, csiVolumePathPrefix)
	body, err := readBody(r, maxVolumeBody)
	if err != nil {
		return nil, err
	}
	var in csiVolumeRegisterBody
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, badRequest("Failed to decode volume %s request: %v", op, err)
	}
	if len(in.Volumes) == 0 {
		return nil, badRequest("Volumes must be specified")
	}
	vols := make([]*structs.CSIVolume, 0, len(in.Volumes))
	for _, v := range in.Volumes {
		if v == nil {
			return nil, badRequest("Volumes must not hold null")
		}
		vols = append(vols, v.toStruct())
	}
	if len(vols) == 1 {
		switch v := vols[0]; {
		case v.ID == "":
			v.ID = pathVolID
		case v.ID != pathVolID:
			return nil, badRequest("Volume ID %q does not match the volume ID in the URL %q", v.ID, pathVolID)
		}
	}
	return vols, nil
}

// csiVolumeRegister answers PUT/POST /v1/volume/csi/:id with body
// {"Volumes": [...]}. A single volume without an ID takes the path's; a
// single volume with another ID is refused. Bad input is a 400 and
// nothing is written.
func (s *HTTPServer) csiVolumeRegister(w http.ResponseWriter, r *http.Request) (any, error) {
	vols, err := decodeVolumesBody(r, "register")
	if err != nil {
		return nil, err
	}
	args := structs.CSIVolumeRegisterRequest{Volumes: vols}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.CSIVolumeRegisterResponse
	if err := s.rpc(r, "CSIVolume.Register", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	return api.CSIVolumeRegisterResponse{}, nil
}

// csiVolumeDeregister answers DELETE /v1/volume/csi/:id[?force=true].
func (s *HTTPServer) csiVolumeDeregister(w http.ResponseWriter, r *http.Request) (any, error) {
	force, err := boolParam(r, "force")
	if err != nil {
		return nil, err
	}
	args := structs.CSIVolumeDeregisterRequest{VolumeIDs: []string{pathID(r, csiVolumePathPrefix)}, Force: force}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.CSIVolumeDeregisterResponse
	if err := s.rpc(r, "CSIVolume.Deregister", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	return struct{}{}, nil
}

// apiCSIVolume renders v as the api package's CSIVolume (Nomad's shape),
// with the health of its plugin p (nil when the plugin is gone)
// denormalized into it as Nomad does. Secrets are never shown. ReadAllocs
// and WriteAllocs map claiming allocation IDs to null, as Nomad's do;
// Claims adds each claim's node and state, by allocation ID.
func apiCSIVolume(v *structs.CSIVolume, p *structs.CSIPlugin) *api.CSIVolume {
	out := &api.CSIVolume{
		ID: v.ID, Name: v.Name, Namespace: v.Namespace, ExternalID: v.ExternalID,
		PluginID: v.PluginID, Provider: v.Provider,
		Parameters: v.Parameters, Context: v.Context, Capacity: v.Capacity,
		RequestedCapacityMin: v.CapacityMin, RequestedCapacityMax: v.CapacityMax,
		SnapshotID: v.SnapshotID, CloneID: v.CloneID,
		RequestedTopologies: apiTopologyRequest(v.RequestedTopologies),
		Topologies:          apiTopologies(v.Topologies),
		ReadAllocs:          map[string]*struct{}{}, WriteAllocs: map[string]*struct{}{},
		Claims:      []*api.CSIVolumeClaim{},
		CreateIndex: v.CreateIndex, ModifyIndex: v.ModifyIndex,
	}
	if v.MountOptions != nil {
		out.MountOptions = &api.CSIMountOptions{FSType: v.MountOptions.FSType, MountFlags: v.MountOptions.MountFlags}
	}
	out.RequestedCapabilities = make([]*api.CSIVolumeCapability, 0, len(v.RequestedCapabilities))
	for _, c := range v.RequestedCapabilities {
		out.RequestedCapabilities = append(out.RequestedCapabilities,
			&api.CSIVolumeCapability{AccessMode: c.AccessMode, AttachmentMode: c.AttachmentMode})
	}
	if len(v.RequestedCapabilities) > 0 {
		out.AccessMode = v.RequestedCapabilities[0].AccessMode
		out.AttachmentMode = v.RequestedCapabilities[0].AttachmentMode
	}
	for id, c := range v.Claims {
		if c.Mode == structs.CSIVolumeClaimWrite {
			out.WriteAllocs[id] = nil
		} else {
			out.ReadAllocs[id] = nil
		}
		out.Claims = append(out.Claims, &api.CSIVolumeClaim{
			AllocationID: c.AllocationID, NodeID: c.NodeID, ExternalNodeID: c.ExternalNodeID,
			Mode: c.Mode, AccessMode: c.AccessMode, AttachmentMode: c.AttachmentMode,
			State: string(c.State), UpdatedAt: c.UpdatedAt,
		})
	}
	sort.Slice(out.Claims, func(i, j int) bool { return out.Claims[i].AllocationID < out.Claims[j].AllocationID })
	if p != nil {
		out.Provider = p.Provider
		out.ProviderVersion = p.Version
		out.ControllerRequired = p.ControllerRequired
		out.ControllersHealthy, out.ControllersExpected = p.ControllersHealthy, p.ControllersExpected
		out.NodesHealthy, out.NodesExpected = p.NodesHealthy, p.NodesExpected
		out.Schedulable = p.NodesHealthy > 0 && (!p.ControllerRequired || p.ControllersHealthy > 0)
	}
	return out
}

// apiTopologies renders topologies as the api package's.
func apiTopologies(ts []*structs.CSITopology) []*api.CSITopology {
	if ts == nil {
		return nil
	}
	out := make([]*api.CSITopology, 0, len(ts))
	for _, t := range ts {
		if t != nil {
			out = append(out, &api.CSITopology{Segments: t.Segments})
		}
	}
	return out
}

// apiTopologyRequest renders a topology request as the api package's.
func apiTopologyRequest(r *structs.CSITopologyRequest) *api.CSITopologyRequest {
	if r == nil {
		return nil
	}
	return &api.CSITopologyRequest{Required: apiTopologies(r.Required), Preferred: apiTopologies(r.Preferred)}
}

// csiVolumeGet answers GET /v1/volume/csi/:id; a blocking query. An
// unknown volume is a 404.
func (s *HTTPServer) csiVolumeGet(w http.ResponseWriter, r *http.Request) (any, error) {
	args := structs.CSIVolumeGetRequest{ID: pathID(r, csiVolumePathPrefix)}
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	args.Prefix = ""
	var reply structs.CSIVolumeGetResponse
	if err := s.rpc(r, "CSIVolume.Get", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Volume == nil {
		return nil, errNotFound("volume")
	}
	// The plugin's health is read at once, never blocking: the volume's
	// index is what the caller waits on.
	pargs := structs.CSIPluginGetRequest{ID: reply.Volume.PluginID}
	pargs.QueryOptions = args.QueryOptions
	pargs.MinQueryIndex = 0
	var preply structs.CSIPluginGetResponse
	if err := s.rpc(r, "CSIPlugin.Get", &pargs, &preply); err != nil {
		return nil, err
	}
	return apiCSIVolume(reply.Volume, preply.Plugin), nil
}

// csiPluginsList answers GET /v1/plugins?type=csi with plugin stubs; a
// blocking query.
func (s *HTTPServer) csiPluginsList(w http.ResponseWriter, r *http.Request) (any, error) {
	if err := requireCSIType(r); err != nil {
		return nil, err
	}
	var args structs.CSIPluginListRequest
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	var reply structs.CSIPluginListResponse
	if err := s.rpc(r, "CSIPlugin.List", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Plugins == nil {
		reply.Plugins = []*structs.CSIPluginListStub{}
	}
	return reply.Plugins, nil
}

// csiPluginGet answers GET /v1/plugin/csi/:id; a blocking query. An
// unknown plugin is a 404.
func (s *HTTPServer) csiPluginGet(w http.ResponseWriter, r *http.Request) (any, error) {
	args := structs.CSIPluginGetRequest{ID: pathID(r, csiPluginPathPrefix)}
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	args.Prefix = ""
	var reply structs.CSIPluginGetResponse
	if err := s.rpc(r, "CSIPlugin.Get", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Plugin == nil {
		return nil, errNotFound("plugin")
	}
	return csiPluginView{CSIPlugin: reply.Plugin, Allocations: s.pluginAllocs(r, args.Region, reply.Plugin)}, nil
}

// csiPluginView is a plugin with its instances' allocations, as Nomad's
// api.CSIPlugin has them.
type csiPluginView struct {
	*structs.CSIPlugin
	Allocations []*structs.AllocListStub
}

// pluginAllocs reads the allocations of p's instances that run as tasks,
// by ID order. One that cannot be read (gone meanwhile) is left out: it
// only decorates the answer.
func (s *HTTPServer) pluginAllocs(r *http.Request, region string, p *structs.CSIPlugin) []*structs.AllocListStub {
	ids := map[string]bool{}
	for _, m := range []map[string]*structs.CSIInfo{p.Controllers, p.Nodes} {
		for _, info := range m {
			if info != nil && info.AllocID != "" {
				ids[info.AllocID] = true
			}
		}
	}
	out := []*structs.AllocListStub{}
	for _, id := range sortedKeys(ids) {
		args := structs.AllocSpecificRequest{AllocID: id}
		args.Region = region
		var reply structs.SingleAllocResponse
		if err := s.rpc(r, "Alloc.GetAlloc", &args, &reply); err != nil || reply.Alloc == nil {
			continue
		}
		out = append(out, reply.Alloc.Stub())
	}
	return out
}

// sortedKeys returns m's keys in order.
func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// csiVolumesExternalReply is Nomad's api.CSIVolumeListExternalResponse.
type csiVolumesExternalReply struct {
	Volumes   []*structs.CSIVolumeExternalStub
	NextToken string
}

// csiVolumesExternal answers GET /v1/volumes/external?plugin_id=ID
// [&per_page=N][&next_token=T]: one page of the volumes the plugin's
// storage provider has, registered or not (CSI ListVolumes).
func (s *HTTPServer) csiVolumesExternal(w http.ResponseWriter, r *http.Request) (any, error) {
	q := r.URL.Query()
	args := structs.CSIVolumeExternalListRequest{PluginID: q.Get("plugin_id"), NextToken: q.Get("next_token")}
	if args.PluginID == "" {
		return nil, badRequest("Missing plugin_id")
	}
	if raw := q.Get("per_page"); raw != "" {
		n, err := strconv.ParseInt(raw, 10, 32)
		if err != nil || n < 0 || n > structs.MaxExternalPerPage {
			return nil, badRequest("Invalid per_page %q: must be a whole number from 0 to %d", raw, structs.MaxExternalPerPage)
		}
		args.PerPage = int32(n)
	}
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	var reply structs.CSIVolumeExternalListResponse
	if err := s.rpc(r, "CSIVolume.ListExternal", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	out := csiVolumesExternalReply{Volumes: reply.Volumes, NextToken: reply.NextToken}
	if out.Volumes == nil {
		out.Volumes = []*structs.CSIVolumeExternalStub{}
	}
	return out, nil
}
