package client

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/roamhq/roam/structs"
)

// csiPluginClient speaks CSI to one plugin over its unix socket. It is the
// CSI boundary: every method returns errors whose gRPC status has been
// translated into a structs.ErrCSI* sentinel, and nothing above it looks at
// gRPC codes.
type csiPluginClient struct {
	conn       *grpc.ClientConn
	identity   csi.IdentityClient
	controller csi.ControllerClient
	node       csi.NodeClient
}

// dialCSIPlugin prepares a connection to the plugin listening on socket (an
// absolute path, or unix:// + path). It does not wait for the plugin: a
// plugin that is not up yet fails calls with ErrCSIUnavailable.
func dialCSIPlugin(socket string) (*csiPluginClient, error) {
	path := csiSocketPath(socket)
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("csi plugin socket %q: path must be absolute", socket)
	}
	bc := backoff.DefaultConfig
	// A restarted plugin should be found within a fingerprint or two, not
	// after gRPC's default two-minute ceiling.
	bc.MaxDelay = 5 * time.Second
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: time.Second}),
	)
	if err != nil {
		return nil, fmt.Errorf("csi plugin socket %q: %w", socket, err)
	}
	return &csiPluginClient{
		conn:       conn,
		identity:   csi.NewIdentityClient(conn),
		controller: csi.NewControllerClient(conn),
		node:       csi.NewNodeClient(conn),
	}, nil
}

func (p *csiPluginClient) close() error { return p.conn.Close() }

// csiSocketPath is the file path of a plugin socket given as a path or a
// unix:// endpoint.
func csiSocketPath(socket string) string {
	return strings.TrimPrefix(strings.TrimPrefix(socket, "unix://"), "unix:")
}

// csiError translates a plugin call's error into the structs sentinel for
// its gRPC code, keeping the method and the plugin's message.
func csiError(method string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("csi %s: %w: %w", method, structs.ErrCSIUnavailable, err)
		}
		return fmt.Errorf("csi %s: %w: %w", method, structs.ErrCSIInternal, err)
	}
	var sentinel error
	switch st.Code() {
	case codes.InvalidArgument, codes.OutOfRange:
		sentinel = structs.ErrCSIInvalidArgument
	case codes.NotFound:
		sentinel = structs.ErrCSINotFound
	case codes.FailedPrecondition:
		sentinel = structs.ErrCSIFailedPrecondition
	case codes.ResourceExhausted:
		sentinel = structs.ErrCSIResourceExhausted
	case codes.AlreadyExists:
		sentinel = structs.ErrCSIAlreadyExists
	case codes.Unimplemented:
		sentinel = structs.ErrCSIUnimplemented
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		// ABORTED is the spec's "an operation for this volume is pending":
		// as retryable as an unreachable plugin.
		sentinel = structs.ErrCSIUnavailable
	default:
		sentinel = structs.ErrCSIInternal
	}
	return fmt.Errorf("csi %s: %w: %s", method, sentinel, st.Message())
}

// csiCall runs one plugin method and translates its error.
func csiCall[Req, Resp any](ctx context.Context, method string, fn func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	resp, err := fn(ctx, req)
	return resp, csiError(method, err)
}

// Identity service.

func (p *csiPluginClient) GetPluginInfo(ctx context.Context) (*csi.GetPluginInfoResponse, error) {
	return csiCall(ctx, "GetPluginInfo", p.identity.GetPluginInfo, &csi.GetPluginInfoRequest{})
}

func (p *csiPluginClient) GetPluginCapabilities(ctx context.Context) (*csi.GetPluginCapabilitiesResponse, error) {
	return csiCall(ctx, "GetPluginCapabilities", p.identity.GetPluginCapabilities, &csi.GetPluginCapabilitiesRequest{})
}

// Probe reports whether the plugin is ready; an unset ready flag means
// ready, per the spec.
func (p *csiPluginClient) Probe(ctx context.Context) (bool, error) {
	resp, err := csiCall(ctx, "Probe", p.identity.Probe, &csi.ProbeRequest{})
	if err != nil {
		return false, err
	}
	return resp.GetReady() == nil || resp.GetReady().GetValue(), nil
}

// Controller service.

func (p *csiPluginClient) ControllerGetCapabilities(ctx context.Context) (*csi.ControllerGetCapabilitiesResponse, error) {
	return csiCall(ctx, "ControllerGetCapabilities", p.controller.ControllerGetCapabilities, &csi.ControllerGetCapabilitiesRequest{})
}

func (p *csiPluginClient) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	return csiCall(ctx, "ControllerPublishVolume", p.controller.ControllerPublishVolume, req)
}

func (p *csiPluginClient) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	return csiCall(ctx, "ControllerUnpublishVolume", p.controller.ControllerUnpublishVolume, req)
}

func (p *csiPluginClient) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	return csiCall(ctx, "CreateVolume", p.controller.CreateVolume, req)
}

func (p *csiPluginClient) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	return csiCall(ctx, "DeleteVolume", p.controller.DeleteVolume, req)
}

func (p *csiPluginClient) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	return csiCall(ctx, "ValidateVolumeCapabilities", p.controller.ValidateVolumeCapabilities, req)
}

func (p *csiPluginClient) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	return csiCall(ctx, "CreateSnapshot", p.controller.CreateSnapshot, req)
}

func (p *csiPluginClient) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	return csiCall(ctx, "DeleteSnapshot", p.controller.DeleteSnapshot, req)
}

func (p *csiPluginClient) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	return csiCall(ctx, "ControllerExpandVolume", p.controller.ControllerExpandVolume, req)
}

func (p *csiPluginClient) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	return csiCall(ctx, "ListVolumes", p.controller.ListVolumes, req)
}

func (p *csiPluginClient) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	return csiCall(ctx, "ListSnapshots", p.controller.ListSnapshots, req)
}

// Node service.

func (p *csiPluginClient) NodeGetInfo(ctx context.Context) (*csi.NodeGetInfoResponse, error) {
	return csiCall(ctx, "NodeGetInfo", p.node.NodeGetInfo, &csi.NodeGetInfoRequest{})
}

func (p *csiPluginClient) NodeGetCapabilities(ctx context.Context) (*csi.NodeGetCapabilitiesResponse, error) {
	return csiCall(ctx, "NodeGetCapabilities", p.node.NodeGetCapabilities, &csi.NodeGetCapabilitiesRequest{})
}

func (p *csiPluginClient) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	return csiCall(ctx, "NodeStageVolume", p.node.NodeStageVolume, req)
}

func (p *csiPluginClient) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	return csiCall(ctx, "NodeUnstageVolume", p.node.NodeUnstageVolume, req)
}

func (p *csiPluginClient) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	return csiCall(ctx, "NodePublishVolume", p.node.NodePublishVolume, req)
}

func (p *csiPluginClient) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	return csiCall(ctx, "NodeUnpublishVolume", p.node.NodeUnpublishVolume, req)
}

func (p *csiPluginClient) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	return csiCall(ctx, "NodeExpandVolume", p.node.NodeExpandVolume, req)
}

// csiControllerInfo turns controller capabilities into the node's view.
func csiControllerInfo(resp *csi.ControllerGetCapabilitiesResponse) *structs.CSIControllerInfo {
	info := &structs.CSIControllerInfo{}
	for _, c := range resp.GetCapabilities() {
		switch c.GetRpc().GetType() {
		case csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME:
			info.SupportsCreateDelete = true
		case csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME:
			info.SupportsAttachDetach = true
		case csi.ControllerServiceCapability_RPC_LIST_VOLUMES:
			info.SupportsListVolumes = true
		case csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES:
			info.SupportsListVolumesAttachedNodes = true
		case csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT:
			info.SupportsCreateSnapshot = true
		case csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS:
			info.SupportsListSnapshots = true
		case csi.ControllerServiceCapability_RPC_EXPAND_VOLUME:
			info.SupportsExpand = true
		case csi.ControllerServiceCapability_RPC_PUBLISH_READONLY:
			info.SupportsReadOnlyAttach = true
		case csi.ControllerServiceCapability_RPC_CLONE_VOLUME:
			info.SupportsClone = true
		}
	}
	return info
}

// nodeRequiresStage reports whether the node capabilities include
// STAGE_UNSTAGE_VOLUME.
func nodeRequiresStage(resp *csi.NodeGetCapabilitiesResponse) bool {
	for _, c := range resp.GetCapabilities() {
		if c.GetRpc().GetType() == csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME {
			return true
		}
	}
	return false
}

// nodeCanExpand reports whether the node capabilities include
// EXPAND_VOLUME: without it the CSI spec forbids calling NodeExpandVolume.
func nodeCanExpand(resp *csi.NodeGetCapabilitiesResponse) bool {
	for _, c := range resp.GetCapabilities() {
		if c.GetRpc().GetType() == csi.NodeServiceCapability_RPC_EXPAND_VOLUME {
			return true
		}
	}
	return false
}

// requiresController reports whether the plugin advertises a controller
// service.
func requiresController(resp *csi.GetPluginCapabilitiesResponse) bool {
	for _, c := range resp.GetCapabilities() {
		if c.GetService().GetType() == csi.PluginCapability_Service_CONTROLLER_SERVICE {
			return true
		}
	}
	return false
}

// csiAccessModes maps Roam's access mode names to CSI's.
var csiAccessModes = map[string]csi.VolumeCapability_AccessMode_Mode{
	structs.CSIAccessModeSingleNodeReader:      csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
	structs.CSIAccessModeSingleNodeWriter:      csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
	structs.CSIAccessModeMultiNodeReader:       csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
	structs.CSIAccessModeMultiNodeSingleWriter: csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER,
	structs.CSIAccessModeMultiNodeMultiWriter:  csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER,
}

// csiVolumeCapability builds the CSI capability for an access/attachment
// pair. Bad names are ErrCSIInvalidArgument: no plugin could accept them.
func csiVolumeCapability(accessMode, attachmentMode string, opts *structs.CSIMountOptions) (*csi.VolumeCapability, error) {
	mode, ok := csiAccessModes[accessMode]
	if !ok {
		return nil, fmt.Errorf("%w: unknown access mode %q", structs.ErrCSIInvalidArgument, accessMode)
	}
	vc := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode}}
	switch attachmentMode {
	case structs.CSIAttachmentModeFilesystem, "":
		m := &csi.VolumeCapability_MountVolume{}
		if opts != nil {
			m.FsType = opts.FSType
			m.MountFlags = append([]string(nil), opts.MountFlags...)
		}
		vc.AccessType = &csi.VolumeCapability_Mount{Mount: m}
	case structs.CSIAttachmentModeBlockDevice:
		vc.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	default:
		return nil, fmt.Errorf("%w: unknown attachment mode %q", structs.ErrCSIInvalidArgument, attachmentMode)
	}
	return vc, nil
}

// csiVolumeCapabilities builds a list of capabilities.
func csiVolumeCapabilities(caps []*structs.CSIVolumeCapability, opts *structs.CSIMountOptions) ([]*csi.VolumeCapability, error) {
	out := make([]*csi.VolumeCapability, 0, len(caps))
	for _, c := range caps {
		vc, err := csiVolumeCapability(c.AccessMode, c.AttachmentMode, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, vc)
	}
	return out, nil
}
