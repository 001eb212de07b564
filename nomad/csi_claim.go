package nomad

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/roamhq/roam/structs"
)

// csiCallTimeout bounds one destructive controller call in its lane.
const csiCallTimeout = 2 * time.Minute

// Claim claims a volume for an allocation (State taken) or releases the
// claim (State unpublishing). Only the allocation's node may ask. Each
// step of either walk is checkpointed through Raft, so a new leader, or
// the volume watcher, continues where this one stopped.
func (c *CSIVolume) Claim(args *structs.CSIVolumeClaimRequest, reply *structs.CSIVolumeClaimResponse) error {
	if done, err := c.srv.forward("CSIVolume.Claim", args, args, reply); done {
		return err
	}
	srv := c.srv
	store := srv.State()
	node, err := store.NodeBySecretID(nil, args.AuthToken)
	if err != nil {
		return err
	}
	if node == nil {
		return fmt.Errorf("%w: claims must come from the allocation's node", structs.ErrPermissionDenied)
	}
	alloc, err := store.AllocByID(nil, args.AllocationID)
	if err != nil {
		return err
	}
	if alloc == nil {
		return fmt.Errorf("%w: allocation %s", structs.ErrNotFound, args.AllocationID)
	}
	if alloc.NodeID != node.ID {
		return fmt.Errorf("%w: allocation %s is not on node %s", structs.ErrPermissionDenied, alloc.ID, node.ID)
	}
	vol, err := store.CSIVolumeByID(nil, structs.DefaultNamespace, args.VolumeID)
	if err != nil {
		return err
	}
	if vol == nil {
		return fmt.Errorf("%w: volume %q", structs.ErrNotFound, args.VolumeID)
	}
	ctx, cancel := context.WithTimeout(srv.shutdownCtx, csiCallTimeout+srv.config.RPCHoldTimeout)
	defer cancel()
	k := claimKey{vol.ID, alloc.ID}
	if !srv.claims.start(k) {
		return fmt.Errorf("%w: allocation %s, volume %s", structs.ErrClaimInProgress, alloc.ID, vol.ID)
	}
	defer srv.claims.done(k)

	switch args.State {
	case structs.CSIVolumeClaimStateTaken:
		if alloc.TerminalStatus() {
			return fmt.Errorf("%w: allocation %s is terminal and may not claim volumes", structs.ErrInvalidRequest, alloc.ID)
		}
		claim := &structs.CSIVolumeClaim{
			AllocationID: alloc.ID, NodeID: node.ID, Mode: args.Mode,
			AccessMode: args.AccessMode, AttachmentMode: args.AttachmentMode,
		}
		if info := node.CSINodePlugins[vol.PluginID]; info != nil && info.NodeInfo != nil {
			claim.ExternalNodeID = info.NodeInfo.ID
		}
		pc, err := srv.claimVolume(ctx, vol, claim)
		if err != nil {
			return err
		}
		reply.PublishContext = pc
		latest, err := srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
		if err != nil {
			return err
		}
		reply.Volume = latest.Copy() // the claiming node needs the secrets
		return nil
	case structs.CSIVolumeClaimStateUnpublishing:
		// The node already unpublished and unstaged before asking.
		return srv.releaseClaim(ctx, vol.ID, alloc.ID, true)
	default:
		return fmt.Errorf("%w: claim state %q: ask for %q or %q", structs.ErrInvalidRequest, args.State,
			structs.CSIVolumeClaimStateTaken, structs.CSIVolumeClaimStateUnpublishing)
	}
}

// checkpointClaim writes one claim transition through Raft. An empty State
// frees the claim.
func (s *Server) checkpointClaim(volID string, claim *structs.CSIVolumeClaim) error {
	c := *claim
	c.UpdatedAt = time.Now().UnixNano()
	_, _, err := s.raftApply(structs.CSIVolumeClaimRequestType, &structs.CSIVolumeClaimUpdateRequest{
		Namespace: structs.DefaultNamespace, VolumeID: volID, Claim: &c,
	})
	return err
}

// claimVolume reserves the claim (publishing), publishes at a controller
// through the plugin's lane when the plugin has one, and marks it taken.
// A failed publish is rolled back: the controller is told to unpublish
// (the publish may have happened even if its answer was lost) and the
// reservation is freed, so a failure never leaves a volume stuck.
func (s *Server) claimVolume(ctx context.Context, vol *structs.CSIVolume, claim *structs.CSIVolumeClaim) (map[string]string, error) {
	if existing := vol.Claims[claim.AllocationID]; existing != nil {
		switch existing.State {
		case structs.CSIVolumeClaimStateTaken:
			return existing.PublishContext, nil // a retried claim: already done
		case structs.CSIVolumeClaimStatePublishing:
			// Resumed below: publish is idempotent for the same node.
		default:
			return nil, fmt.Errorf("%w: allocation %s's claim on %s is being released (%s)",
				structs.ErrInvalidRequest, claim.AllocationID, vol.ID, existing.State)
		}
	}
	if err := vol.CanClaim(claim); err != nil {
		if !errors.Is(err, structs.ErrCSIMaxClaims) {
			return nil, err
		}
		// The claims in the way may belong to allocations that are
		// already over (the one this alloc replaces, on a lost node):
		// release those now instead of failing the replacement until the
		// volume watcher gets to them.
		settled, busy, serr := s.settleStaleClaims(ctx, vol, claim.AllocationID)
		if serr != nil {
			// The stale claim could not be released yet (say its node is
			// alive but unreachable): the caller may come back, and will
			// get in once the claim is released or the node is down.
			return nil, fmt.Errorf("%w: volume %s: releasing a stale claim: %v", structs.ErrClaimInProgress, vol.ID, serr)
		}
		if err := settled.CanClaim(claim); err != nil {
			if busy {
				// A stale claim in the way is being released right now
				// (by the volume watcher): ask the caller to come back.
				return nil, fmt.Errorf("%w: volume %s: a stale claim is being released", structs.ErrClaimInProgress, vol.ID)
			}
			return nil, err
		}
		vol = settled
	}
	claim.State = structs.CSIVolumeClaimStatePublishing
	// The FSM checks admission again at apply time, so two claims racing
	// for a single-writer volume cannot both be reserved.
	if err := s.checkpointClaim(vol.ID, claim); err != nil {
		return nil, err
	}

	plugin, err := s.State().CSIPluginByID(nil, vol.PluginID)
	if err != nil {
		return nil, err
	}
	if plugin != nil && plugin.ControllerRequired {
		pc, err := s.controllerPublish(ctx, vol, claim)
		if errors.Is(err, structs.ErrOutcomeUnknown) {
			// The publish may still be running at the controller: keep the
			// reservation, which a retried claim resumes (publish is
			// idempotent) and the volume watcher settles if nobody does.
			return nil, err
		}
		if err != nil {
			s.rollbackClaim(vol, claim, err)
			return nil, err
		}
		claim.PublishContext = pc
	}
	claim.State = structs.CSIVolumeClaimStateTaken
	if err := s.checkpointClaim(vol.ID, claim); err != nil {
		return nil, err
	}
	return claim.PublishContext, nil
}

// settleStaleClaims releases the volume's claims whose allocation is
// terminal or gone or whose node is down, and returns the volume as it is
// afterwards. busy reports a stale claim it left alone because the leader
// is already releasing it.
func (s *Server) settleStaleClaims(ctx context.Context, vol *structs.CSIVolume, except string) (_ *structs.CSIVolume, busy bool, _ error) {
	now := time.Now()
	for allocID, other := range vol.Claims {
		if allocID == except || !s.claimStale(other) {
			continue
		}
		k := claimKey{vol.ID, allocID}
		if !s.claims.start(k) {
			busy = true
			continue
		}
		err := s.releaseClaim(ctx, vol.ID, allocID, false)
		s.claims.done(k)
		if err != nil {
			return nil, busy, err
		}
		s.logger.Info("released a stale claim for a new one", "volume_id", vol.ID, "stale_alloc_id", allocID,
			"took", time.Since(now))
	}
	latest, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
	if err != nil {
		return nil, busy, err
	}
	if latest == nil {
		return nil, busy, fmt.Errorf("%w: volume %q", structs.ErrNotFound, vol.ID)
	}
	return latest, busy, nil
}

// rollbackClaim undoes a reservation whose publish failed. If the undo
// itself fails, the claim stays in publishing and the volume watcher
// settles it.
func (s *Server) rollbackClaim(vol *structs.CSIVolume, claim *structs.CSIVolumeClaim, cause error) {
	if structs.IsRetryable(cause) {
		return // leadership is moving: the next leader's watcher settles it
	}
	ctx, cancel := context.WithTimeout(s.shutdownCtx, csiCallTimeout)
	defer cancel()
	if err := s.controllerUnpublish(ctx, vol, claim); err != nil {
		s.logger.Warn("rollback of failed publish could not unpublish; the volume watcher will retry",
			"volume_id", vol.ID, "alloc_id", claim.AllocationID, "error", err)
		return
	}
	free := *claim
	free.State = ""
	if err := s.checkpointClaim(vol.ID, &free); err != nil {
		s.logger.Warn("rollback of failed publish could not free the claim", "volume_id", vol.ID, "error", err)
	}
}

// releaseClaim walks a claim down to freed: unpublishing, node-detached
// (the node plugin unpublished and unstaged; skipped when nodeDone or the
// node is gone or down), controller-detached, then freed. Every step is a
// checkpoint; a call that fails leaves the claim where it got to.
func (s *Server) releaseClaim(ctx context.Context, volID, allocID string, nodeDone bool) error {
	vol, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, volID)
	if err != nil {
		return err
	}
	if vol == nil {
		return fmt.Errorf("%w: volume %q", structs.ErrNotFound, volID)
	}
	claim := vol.Claims[allocID]
	if claim == nil {
		return nil // already freed: releasing is idempotent
	}
	c := *claim
	if c.State == structs.CSIVolumeClaimStateTaken || c.State == structs.CSIVolumeClaimStatePublishing {
		c.State = structs.CSIVolumeClaimStateUnpublishing
		if err := s.checkpointClaim(volID, &c); err != nil {
			return err
		}
	}
	if c.State == structs.CSIVolumeClaimStateUnpublishing {
		if !nodeDone {
			if err := s.nodeDetach(ctx, vol, &c); err != nil {
				return err
			}
		}
		c.State = structs.CSIVolumeClaimStateNodeDetached
		if err := s.checkpointClaim(volID, &c); err != nil {
			return err
		}
	}
	if c.State == structs.CSIVolumeClaimStateNodeDetached {
		if err := s.controllerUnpublish(ctx, vol, &c); err != nil {
			return err
		}
		c.State = structs.CSIVolumeClaimStateControllerDetached
		if err := s.checkpointClaim(volID, &c); err != nil {
			return err
		}
	}
	c.State = ""
	return s.checkpointClaim(volID, &c)
}

// nodeDetach asks the claim's node to unpublish and unstage the volume.
// A node that is gone or down cannot, and need not: its mounts went with it.
func (s *Server) nodeDetach(ctx context.Context, vol *structs.CSIVolume, claim *structs.CSIVolumeClaim) error {
	node, err := s.State().NodeByID(nil, claim.NodeID)
	if err != nil {
		return err
	}
	if node == nil || node.Status == structs.NodeStatusDown {
		return nil
	}
	req := structs.ClientCSINodeDetachVolumeRequest{
		PluginID: vol.PluginID, VolumeID: vol.ID, ExternalID: vol.ExternalID, AllocID: claim.AllocationID,
		NodeID: claim.ExternalNodeID, AttachmentMode: claim.AttachmentMode, AccessMode: claim.AccessMode,
		ReadOnly: claim.Mode == structs.CSIVolumeClaimRead,
	}
	var resp structs.ClientCSINodeDetachVolumeResponse
	err = s.clientRPC(ctx, node.ID, "ClientCSI.NodeDetachVolume", &req, &resp)
	if errors.Is(err, structs.ErrNodeNotConnected) {
		// The node is alive but not reachable right now; try again later.
		return fmt.Errorf("node detach of %s from node %s: %w", vol.ID, node.ID, err)
	}
	return err
}

// controllerPublish attaches the volume to the claim's node at the
// plugin's first healthy controller, through the plugin's lane.
func (s *Server) controllerPublish(ctx context.Context, vol *structs.CSIVolume, claim *structs.CSIVolumeClaim) (map[string]string, error) {
	var pc map[string]string
	err := s.onController(ctx, vol.PluginID, "publish", func(ctx context.Context, cn *structs.Node) error {
		req := structs.ClientCSIControllerAttachVolumeRequest{
			PluginID: vol.PluginID, VolumeID: vol.ExternalID, ClientCSINodeID: claim.ExternalNodeID,
			AttachmentMode: claim.AttachmentMode, AccessMode: claim.AccessMode,
			ReadOnly: claim.Mode == structs.CSIVolumeClaimRead, MountOptions: vol.MountOptions,
			Secrets: vol.Secrets, VolumeContext: vol.Context,
			CSIControllerQuery: structs.CSIControllerQuery{ControllerNodeID: cn.ID},
		}
		var resp structs.ClientCSIControllerAttachVolumeResponse
		if err := s.clientRPC(ctx, cn.ID, "ClientCSI.ControllerAttachVolume", &req, &resp); err != nil {
			return err
		}
		pc = resp.PublishContext
		return nil
	})
	return pc, err
}

// controllerUnpublish detaches the volume from the claim's node, through
// the plugin's lane. A plugin with no controller needs nothing.
func (s *Server) controllerUnpublish(ctx context.Context, vol *structs.CSIVolume, claim *structs.CSIVolumeClaim) error {
	plugin, err := s.State().CSIPluginByID(nil, vol.PluginID)
	if err != nil {
		return err
	}
	if plugin == nil || !plugin.ControllerRequired {
		return nil
	}
	return s.onController(ctx, vol.PluginID, "unpublish", func(ctx context.Context, cn *structs.Node) error {
		req := structs.ClientCSIControllerDetachVolumeRequest{
			PluginID: vol.PluginID, VolumeID: vol.ExternalID, ClientCSINodeID: claim.ExternalNodeID,
			Secrets: vol.Secrets, CSIControllerQuery: structs.CSIControllerQuery{ControllerNodeID: cn.ID},
		}
		var resp structs.ClientCSIControllerDetachVolumeResponse
		return s.clientRPC(ctx, cn.ID, "ClientCSI.ControllerDetachVolume", &req, &resp)
	})
}

// onController runs one destructive controller call: it waits its turn in
// the plugin's lane, then tries the plugin's healthy controllers on ready
// nodes, lowest node ID first, moving on only when a controller could not
// be reached.
func (s *Server) onController(ctx context.Context, pluginID, op string, call func(ctx context.Context, cn *structs.Node) error) error {
	lanes := s.lanes.Load()
	if lanes == nil {
		return fmt.Errorf("%w: not the leader; controller calls run on the leader", structs.ErrNoLeader)
	}
	return lanes.Do(ctx, pluginID, op, func(ctx context.Context) error {
		candidates, err := pluginControllers(s.State(), pluginID)
		if err != nil {
			return err
		}
		if nodeID, ok := lanes.fencedTo(pluginID, time.Now()); ok {
			if candidates, err = fencedCandidates(pluginID, candidates, nodeID); err != nil {
				return err
			}
		}
		var tried *structs.Node
		node, err := callController(ctx, pluginID, candidates, func(ctx context.Context, n *structs.Node) error {
			tried = n
			return call(ctx, n)
		})
		switch {
		case errors.Is(err, structs.ErrOutcomeUnknown) && tried != nil:
			s.logger.Warn("controller call outcome unknown; the plugin's calls stay on its node until one succeeds there",
				"plugin_id", pluginID, "op", op, "node_id", tried.ID, "error", err)
			lanes.setFence(pluginID, tried.ID, time.Now().Add(csiCallTimeout))
		case err == nil && node != nil:
			lanes.liftFence(pluginID, node.ID)
		}
		return err
	})
}
