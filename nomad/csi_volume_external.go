package nomad

import (
	"context"
	"fmt"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// ListExternal lists one page of the volumes the plugin's storage
// provider has, registered or not, so an operator can see what exists
// there that Roam does not know. Like ListSnapshots it changes nothing:
// it skips the server's lane but picks the controller the same way, and
// the client runs it in its own per-plugin lane. A plugin none of whose
// controllers advertises LIST_VOLUMES is refused by name.
func (c *CSIVolume) ListExternal(args *structs.CSIVolumeExternalListRequest, reply *structs.CSIVolumeExternalListResponse) error {
	args.AllowStale = false
	if done, err := c.srv.forward("CSIVolume.ListExternal", args, args, reply); done {
		return err
	}
	srv := c.srv
	store := srv.State()
	if err := knownPlugin(store, args.PluginID); err != nil {
		return err
	}
	if args.PerPage < 0 || args.PerPage > structs.MaxExternalPerPage {
		return fmt.Errorf("%w: per_page %d is outside 0..%d", structs.ErrInvalidRequest, args.PerPage, structs.MaxExternalPerPage)
	}
	if len(args.NextToken) > structs.MaxIDBytes*4 {
		return fmt.Errorf("%w: next_token is %d bytes long", structs.ErrInvalidRequest, len(args.NextToken))
	}
	p, err := store.CSIPluginByID(nil, args.PluginID)
	if err != nil {
		return err
	}
	canList := false
	for _, ci := range p.Controllers {
		if ci != nil && ci.ControllerInfo != nil && ci.ControllerInfo.SupportsListVolumes {
			canList = true
		}
	}
	if !canList {
		return fmt.Errorf("%w: plugin %q does not list volumes (no controller advertises LIST_VOLUMES)",
			structs.ErrInvalidRequest, args.PluginID)
	}
	index, err := srv.readFromController(args.PluginID, func(ctx context.Context, cn *structs.Node) error {
		req := structs.ClientCSIControllerListVolumesRequest{
			PluginID: args.PluginID, MaxEntries: args.PerPage, StartingToken: args.NextToken,
			CSIControllerQuery: controllerQuery(ctx, cn),
		}
		var resp structs.ClientCSIControllerListVolumesResponse
		if err := srv.clientRPC(ctx, cn.ID, "ClientCSI.ControllerListVolumes", &req, &resp); err != nil {
			return err
		}
		reply.Volumes, reply.NextToken = resp.Volumes, resp.NextToken
		return nil
	})
	if err != nil {
		return fmt.Errorf("listing volumes of plugin %q: %w", args.PluginID, err)
	}
	reply.Index = index
	return nil
}

// readFromController runs a call that changes nothing (a listing) on the
// plugin's first healthy controller that answers, in the order the lane
// uses but outside it, and returns the plugins table's index for the
// reply (at least 1).
func (s *Server) readFromController(pluginID string, call func(ctx context.Context, cn *structs.Node) error) (uint64, error) {
	store := s.State()
	candidates, err := pluginControllers(store, pluginID)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(s.shutdownCtx, csiCallTimeout)
	defer cancel()
	if _, err := callController(ctx, pluginID, candidates, call); err != nil {
		return 0, err
	}
	index, err := store.Index(state.TableCSIPlugins)
	return max(index, 1), err
}
