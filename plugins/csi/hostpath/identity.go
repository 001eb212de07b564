package hostpath

import (
	"context"
	"fmt"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// identityServer is the CSI identity service, served in every mode.
type identityServer struct {
	csi.UnimplementedIdentityServer
	p *Plugin
}

var _ csi.IdentityServer = (*identityServer)(nil)

func (s *identityServer) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{
		Name:          PluginName,
		VendorVersion: Version,
		Manifest:      map[string]string{"mode": string(s.p.cfg.Mode)},
	}, nil
}

func (s *identityServer) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	resp := &csi.GetPluginCapabilitiesResponse{}
	if s.p.cfg.Mode.servesController() {
		resp.Capabilities = append(resp.Capabilities,
			&csi.PluginCapability{Type: &csi.PluginCapability_Service_{
				Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE},
			}},
			&csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{
				VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE},
			}},
		)
	}
	if s.p.cfg.Zone != "" {
		resp.Capabilities = append(resp.Capabilities, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{
			Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS},
		}})
	}
	return resp, nil
}

// Probe reports ready while the state dir is reachable.
func (s *identityServer) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if _, err := os.Stat(s.p.cfg.StateDir); err != nil {
		return nil, status.Error(codes.FailedPrecondition, fmt.Sprintf("state dir: %v", err))
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
