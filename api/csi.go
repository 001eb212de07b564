package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
)

// CSI access and attachment modes, with Nomad's spellings.
const (
	CSIAccessModeSingleNodeReader      = "single-node-reader-only"
	CSIAccessModeSingleNodeWriter      = "single-node-writer"
	CSIAccessModeMultiNodeReader       = "multi-node-reader-only"
	CSIAccessModeMultiNodeSingleWriter = "multi-node-single-writer"
	CSIAccessModeMultiNodeMultiWriter  = "multi-node-multi-writer"

	CSIAttachmentModeFilesystem  = "file-system"
	CSIAttachmentModeBlockDevice = "block-device"
)

// CSIVolumes registers and reads CSI volumes.
type CSIVolumes struct{ c *Client }

// CSIVolumes returns a handle on the CSI volume endpoints.
func (c *Client) CSIVolumes() *CSIVolumes { return &CSIVolumes{c} }

// CSIVolumeCapability is an access/attachment pair a volume supports.
type CSIVolumeCapability struct {
	AccessMode     string
	AttachmentMode string
}

// CSIVolumeClaim is an allocation's claim on a volume.
type CSIVolumeClaim struct {
	AllocationID   string
	NodeID         string
	ExternalNodeID string
	Mode           string
	AccessMode     string
	AttachmentMode string
	State          string
	// UpdatedAt is a Unix time in nanoseconds.
	UpdatedAt int64
}

// CSIVolume is a volume in full. Secrets are sent on register and never
// returned by reads.
type CSIVolume struct {
	ID                    string
	Name                  string
	Namespace             string
	ExternalID            string
	PluginID              string
	Provider              string
	ProviderVersion       string
	AccessMode            string
	AttachmentMode        string
	MountOptions          *CSIMountOptions
	Secrets               map[string]string `json:",omitempty"`
	Parameters            map[string]string
	Context               map[string]string
	Capacity              int64
	RequestedCapacityMin  int64
	RequestedCapacityMax  int64
	RequestedCapabilities []*CSIVolumeCapability
	// SnapshotID or CloneID (the external ID of a volume to copy) is what
	// a volume create makes the volume from.
	SnapshotID string `json:",omitempty"`
	CloneID    string `json:",omitempty"`
	// RequestedTopologies is the spec's topology_request; Topologies is
	// where the volume is accessible (empty: everywhere).
	RequestedTopologies *CSITopologyRequest `json:",omitempty"`
	Topologies          []*CSITopology      `json:",omitempty"`
	// ReadAllocs and WriteAllocs are keyed by claiming allocation ID; the
	// values are always nil, as in Nomad.
	ReadAllocs  map[string]*struct{}
	WriteAllocs map[string]*struct{}
	// Claims are the claims on the volume, by allocation ID order.
	Claims              []*CSIVolumeClaim
	Schedulable         bool
	ControllerRequired  bool
	ControllersHealthy  int
	ControllersExpected int
	NodesHealthy        int
	NodesExpected       int
	CreateIndex         uint64
	ModifyIndex         uint64
}

// CSIVolumeListStub is a volume in a list.
type CSIVolumeListStub struct {
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

// CSIVolumeRegisterRequest is the body of a register.
type CSIVolumeRegisterRequest struct {
	Volumes []*CSIVolume
}

// CSIVolumeRegisterResponse answers a register.
type CSIVolumeRegisterResponse struct {
	Volumes  []*CSIVolume
	Warnings string
}

// List returns the volumes, all of them or (pluginID not empty) those of
// one plugin. q.Prefix filters by ID prefix.
func (v *CSIVolumes) List(pluginID string, q *QueryOptions) ([]*CSIVolumeListStub, *QueryMeta, error) {
	params := url.Values{"type": {"csi"}}
	if pluginID != "" {
		params.Set("plugin_id", pluginID)
	}
	buf, qm, err := v.c.rawQuery("/v1/volumes", params, q)
	if err != nil {
		return nil, nil, err
	}
	var out []*CSIVolumeListStub
	if err := json.Unmarshal(buf, &out); err != nil {
		return nil, nil, fmt.Errorf("api: decode response: %w", err)
	}
	return out, qm, nil
}

// Info returns one volume. An unknown ID is an *UnexpectedResponseError
// with status 404.
func (v *CSIVolumes) Info(id string, q *QueryOptions) (*CSIVolume, *QueryMeta, error) {
	var out CSIVolume
	qm, err := v.c.query("/v1/volume/csi/"+id, &out, q)
	if err != nil {
		return nil, nil, err
	}
	return &out, qm, nil
}

// Register registers vol, which must already exist in the storage
// provider. A bad volume, or one naming an unknown plugin, is an
// *UnexpectedResponseError with status 400.
func (v *CSIVolumes) Register(vol *CSIVolume, w *WriteOptions) (*WriteMeta, error) {
	req := &CSIVolumeRegisterRequest{Volumes: []*CSIVolume{vol}}
	var out CSIVolumeRegisterResponse
	return v.c.write(http.MethodPut, "/v1/volume/csi/"+vol.ID, nil, req, &out, w)
}

// Deregister removes the registration of volume id, leaving the volume in
// the storage provider. A claimed volume is refused unless force and every
// claiming allocation is terminal.
func (v *CSIVolumes) Deregister(id string, force bool, w *WriteOptions) (*WriteMeta, error) {
	params := url.Values{"force": {strconv.FormatBool(force)}}
	return v.c.write(http.MethodDelete, "/v1/volume/csi/"+id, params, nil, nil, w)
}

// CSIPlugins reads CSI plugins, as the cluster's nodes report them.
type CSIPlugins struct{ c *Client }

// CSIPlugins returns a handle on the CSI plugin endpoints.
func (c *Client) CSIPlugins() *CSIPlugins { return &CSIPlugins{c} }

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

// CSIPlugin is a plugin in full: its instances by node ID, and their
// health.
type CSIPlugin struct {
	ID                  string
	Provider            string
	Version             string
	ControllerRequired  bool
	Controllers         map[string]*CSIInfo
	Nodes               map[string]*CSIInfo
	ControllersHealthy  int
	ControllersExpected int
	NodesHealthy        int
	NodesExpected       int
	// ControllerConcurrency is how many destructive controller calls the
	// leader sends the plugin at once: the smallest controller_concurrency
	// among its healthy controllers.
	ControllerConcurrency int
	// ControllerConcurrencyWarning says so when they disagree.
	ControllerConcurrencyWarning string `json:",omitempty"`
	// Allocations are the plugin's instances' allocations, as Nomad
	// lists them.
	Allocations []*AllocationListStub
	CreateIndex uint64
	ModifyIndex uint64
}

// List returns the plugins; q.Prefix filters by ID prefix.
func (p *CSIPlugins) List(q *QueryOptions) ([]*CSIPluginListStub, *QueryMeta, error) {
	buf, qm, err := p.c.rawQuery("/v1/plugins", url.Values{"type": {"csi"}}, q)
	if err != nil {
		return nil, nil, err
	}
	var out []*CSIPluginListStub
	if err := json.Unmarshal(buf, &out); err != nil {
		return nil, nil, fmt.Errorf("api: decode response: %w", err)
	}
	return out, qm, nil
}

// Info returns one plugin. An unknown ID is an *UnexpectedResponseError
// with status 404.
func (p *CSIPlugins) Info(id string, q *QueryOptions) (*CSIPlugin, *QueryMeta, error) {
	var out CSIPlugin
	qm, err := p.c.query("/v1/plugin/csi/"+id, &out, q)
	if err != nil {
		return nil, nil, err
	}
	return &out, qm, nil
}

// CSITopology is a set of topology segments, such as {"zone": "b"}.
type CSITopology struct {
	Segments map[string]string
}

// CSITopologyRequest is a volume spec's topology_request.
type CSITopologyRequest struct {
	Required  []*CSITopology
	Preferred []*CSITopology
}
