package nomad

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/internal/upgrade"
	"github.com/roamhq/roam/nomad/csiclaim"
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
		// The claiming client builds directories from these IDs. One
		// registered before IDs were checked is not handed out again;
		// releasing it (below) stays possible.
		if err := structs.ValidateID(structs.IDKindVolume, vol.ID); err != nil {
			return err
		}
		if err := structs.ValidateID(structs.IDKindPlugin, vol.PluginID); err != nil {
			return err
		}
		// The scheduler places only inside the volume's topology; a claim
		// from outside it (a placement from before the volume's topology
		// was known, or a forged one) never reaches the provider.
		if why := outsideTopology(vol, node.CSINodePlugins[vol.PluginID]); why != "" {
			return fmt.Errorf("%w: %s (node %s)", structs.ErrInvalidRequest, why, node.ID)
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
// frees the claim, which may let a blocked evaluation place.
func (s *Server) checkpointClaim(volID string, claim *structs.CSIVolumeClaim) error {
	c := *claim
	c.UpdatedAt = time.Now().UnixNano()
	_, _, err := s.raftApply(structs.CSIVolumeClaimRequestType, &structs.CSIVolumeClaimUpdateRequest{
		Namespace: structs.DefaultNamespace, VolumeID: volID, Claim: &c,
	})
	if err == nil && c.State == structs.CSIVolumeClaimStateFreed {
		s.broker.unblock()
	}
	return err
}

// claimVolume admits a new claim beside the volume's others, then walks it
// to taken: reserved (publishing), published at a controller through the
// plugin's lane when the plugin needs it, taken. A publish the plugin
// refuses is rolled back, so a failure never leaves a volume stuck; one
// whose outcome is unknown keeps the reservation for a retried claim (the
// publish is idempotent) or the volume watcher.
func (s *Server) claimVolume(ctx context.Context, vol *structs.CSIVolume, claim *structs.CSIVolumeClaim) (map[string]string, error) {
	w := claimWalk{goal: csiclaim.GoalClaim, volID: vol.ID, allocID: claim.AllocationID, want: claim}
	if vol.Claims[claim.AllocationID] == nil {
		// Ask the core first: a claim it refuses (a terminal allocation)
		// must not release anyone else's stale claim on its way in.
		in, _, err := s.claimInput(w)
		if err != nil {
			return nil, err
		}
		if step := csiclaim.Next(in); step.Action == csiclaim.ActionFail {
			return nil, claimStepError(w, step, nil)
		}
		if err := s.admitClaim(ctx, vol, claim); err != nil {
			return nil, err
		}
	}
	c, err := s.walkClaim(ctx, w)
	if err != nil {
		return nil, err
	}
	return c.PublishContext, nil
}

// admitClaim checks that a new claim fits the volume. Claims in the way
// whose allocations are over (the one this allocation replaces, on a lost
// node) are released first, instead of failing the replacement until the
// volume watcher gets to them. The FSM checks admission again when the
// reservation is applied, so two claims racing for a single-writer volume
// cannot both get in.
func (s *Server) admitClaim(ctx context.Context, vol *structs.CSIVolume, claim *structs.CSIVolumeClaim) error {
	err := vol.CanClaim(claim)
	if err == nil || !errors.Is(err, structs.ErrCSIMaxClaims) {
		return err
	}
	settled, busy, serr := s.settleStaleClaims(ctx, vol, claim.AllocationID)
	if serr != nil {
		// The stale claim could not be released yet (say its node is
		// alive but unreachable): the caller may come back, and will get
		// in once the claim is released or the node is down.
		return fmt.Errorf("%w: volume %s: releasing a stale claim: %w", structs.ErrClaimInProgress, vol.ID, serr)
	}
	if err := settled.CanClaim(claim); err != nil {
		if busy {
			// A stale claim in the way is being released right now (by
			// the volume watcher): ask the caller to come back.
			return fmt.Errorf("%w: volume %s: a stale claim is being released", structs.ErrClaimInProgress, vol.ID)
		}
		return err
	}
	return nil
}

// settleStaleClaims releases the volume's claims that csiclaim.Releasable
// allows (their allocation's tasks are gone) and returns the volume as it
// is afterwards. busy reports a releasable claim it left alone because the
// leader is already working on it.
func (s *Server) settleStaleClaims(ctx context.Context, vol *structs.CSIVolume, except string) (_ *structs.CSIVolume, busy bool, _ error) {
	now := time.Now()
	store := s.State()
	for allocID, other := range vol.Claims {
		if allocID == except {
			continue
		}
		held, err := claimHeld(store, allocID, other)
		if err != nil {
			return nil, busy, err
		}
		if held != "" {
			continue
		}
		k := claimKey{vol.ID, allocID}
		if !s.claims.start(k) {
			busy = true
			continue
		}
		err = s.releaseClaim(ctx, vol.ID, allocID, false)
		s.claims.done(k)
		if err != nil {
			return nil, busy, err
		}
		s.logger.Info("released a stale claim for a new one", "volume_id", vol.ID, "stale_alloc_id", allocID,
			"took", time.Since(now))
	}
	latest, err := store.CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
	if err != nil {
		return nil, busy, err
	}
	if latest == nil {
		return nil, busy, fmt.Errorf("%w: volume %q", structs.ErrNotFound, vol.ID)
	}
	return latest, busy, nil
}

// releaseClaim walks a claim down to freed: unpublishing and the node
// detach (skipped when nodeReleased or the node is gone or down: the walk
// starts at node-detached), node-detached, the controller unpublish, then
// freed. It starts
// only once csiclaim.Releasable allows (or the claim's own node asked,
// nodeReleased); until then it fails with structs.ErrCSIClaimInUse and
// changes nothing. Every step is a checkpoint; a call that fails leaves
// the claim where it got to. The caller holds the claim's in-flight key.
func (s *Server) releaseClaim(ctx context.Context, volID, allocID string, nodeReleased bool) error {
	_, err := s.walkClaim(ctx, claimWalk{goal: csiclaim.GoalRelease, volID: volID, allocID: allocID, nodeReleased: nodeReleased})
	return err
}

// claimWalk is one walk of a claim towards its goal.
type claimWalk struct {
	goal    csiclaim.Goal
	volID   string
	allocID string
	// want is the claim asked for (GoalClaim): node, modes.
	want *structs.CSIVolumeClaim
	// nodeReleased: the claim's node unpublished the volume itself.
	nodeReleased bool
}

// maxClaimSteps bounds one walk; the longest (a claim whose publish is
// refused, rolled back) takes about a dozen steps.
const maxClaimSteps = 32

// walkClaim carries out csiclaim.Next's steps for one claim until the goal
// is reached, the claim must wait, or a step fails. It returns the claim
// as last stored (nil once freed). State is read afresh at every step, so
// the walk resumes from any checkpoint: this leader's, or a previous
// leader's.
func (s *Server) walkClaim(ctx context.Context, w claimWalk) (*structs.CSIVolumeClaim, error) {
	var (
		last       csiclaim.Outcome
		lastErr    error
		publishCtx map[string]string
		// wrote says this walk has checkpointed the claim, to state left.
		wrote bool
		left  structs.CSIClaimState
	)
	for range maxClaimSteps {
		in, vol, err := s.claimInput(w)
		if err != nil {
			return nil, partWay(wrote, left, err)
		}
		in.Last = last
		step := csiclaim.Next(in)
		s.logger.Trace("claim step", "volume_id", w.volID, "alloc_id", w.allocID, "goal", w.goal,
			"step", step, "reason", step.Reason)
		switch step.Action {
		case csiclaim.ActionDone:
			return in.Claim, nil
		case csiclaim.ActionWait:
			return in.Claim, partWay(wrote, left, fmt.Errorf("%w: volume %s: %s", step.Err, w.volID, step.Reason))
		case csiclaim.ActionFail:
			return in.Claim, partWay(wrote, left, claimStepError(w, step, lastErr))
		case csiclaim.ActionRollback:
			// The node never got the volume: release as if it had let go.
			// Rolled back whole, the walk changed nothing in the end.
			if err := s.releaseClaim(ctx, w.volID, w.allocID, true); err != nil {
				s.logger.Warn("rollback of a refused publish stopped part way; the volume watcher will finish it",
					"volume_id", w.volID, "alloc_id", w.allocID, "error", err)
				if wrote || errors.Is(err, structs.ErrPartlyDone) {
					return nil, fmt.Errorf("%w: the rollback stopped part way (%w), the volume watcher finishes it: %w",
						structs.ErrPartlyDone, err, claimStepError(w, step, lastErr))
				}
			}
			return nil, claimStepError(w, step, lastErr)
		case csiclaim.ActionCheckpoint:
			c := in.Claim
			if c == nil {
				c = w.want
			}
			next := *c
			next.State = step.State
			if step.State == structs.CSIVolumeClaimStateTaken && publishCtx != nil {
				next.PublishContext = publishCtx
			}
			if err := s.checkpointClaim(w.volID, &next); err != nil {
				return in.Claim, partWay(wrote, left, err)
			}
			wrote, left = true, next.State
			last, lastErr = csiclaim.Outcome{}, nil
		case csiclaim.ActionCall:
			err := s.claimCall(ctx, step.Call, vol, in.Claim, &publishCtx)
			last, lastErr = csiclaim.Outcome{Call: step.Call, Result: csiclaim.Classify(step.Call, err)}, err
			if err != nil {
				s.logger.Debug("claim call failed", "volume_id", w.volID, "alloc_id", w.allocID,
					"call", step.Call, "result", last.Result, "error", err)
			}
		}
	}
	// A broken invariant of the core, but not worth a server: report it.
	s.logger.Error("claim walk did not settle; the core is looping", "volume_id", w.volID, "alloc_id", w.allocID,
		"steps", maxClaimSteps)
	return nil, fmt.Errorf("claim walk of volume %s, allocation %s did not settle in %d steps", w.volID, w.allocID, maxClaimSteps)
}

// partWay is the error of a claim walk that stops with err after it has
// checkpointed the claim (wrote), last to state left: whatever err says,
// the call did change the claim, and the change goes on without it (a
// retry resumes from the checkpoint; the volume watcher finishes a release
// or rolls back a reservation left behind). So it is marked
// structs.ErrPartlyDone: a refusal such as "no leader" or "in progress" on
// its own would let forward send the call again to the next leader, and
// the caller would take that attempt's answer for the whole call's. What
// stopped the walk still decides whether the caller retries, and how the
// HTTP API answers.
func partWay(wrote bool, left structs.CSIClaimState, err error) error {
	if !wrote || errors.Is(err, structs.ErrPartlyDone) {
		return err
	}
	if left == structs.CSIVolumeClaimStateFreed {
		left = "freed"
	}
	return fmt.Errorf("%w: the claim was left %s, to be finished by a retry or the volume watcher: %w",
		structs.ErrPartlyDone, left, err)
}

// claimStepError is the error a failed step reports: the sentinel the core
// named, the last call's own error, or both.
func claimStepError(w claimWalk, step csiclaim.Step, callErr error) error {
	switch {
	case callErr != nil && step.Err != nil:
		return fmt.Errorf("%w: volume %s, allocation %s: %s: %w", step.Err, w.volID, w.allocID, step.Reason, callErr)
	case callErr != nil:
		return fmt.Errorf("volume %s, allocation %s: %s: %w", w.volID, w.allocID, step.Reason, callErr)
	case step.Err != nil:
		return fmt.Errorf("%w: volume %s, allocation %s: %s", step.Err, w.volID, w.allocID, step.Reason)
	}
	return fmt.Errorf("volume %s, allocation %s: %s", w.volID, w.allocID, step.Reason)
}

// claimInput reads what the next step of w's claim depends on.
func (s *Server) claimInput(w claimWalk) (csiclaim.Input, *structs.CSIVolume, error) {
	store := s.State()
	in := csiclaim.Input{Goal: w.goal, NodeReleased: w.nodeReleased, PublishTimeout: stuckPublishingAfter}
	vol, err := store.CSIVolumeByID(nil, structs.DefaultNamespace, w.volID)
	if err != nil {
		return in, nil, err
	}
	if vol == nil {
		return in, nil, fmt.Errorf("%w: volume %q", structs.ErrNotFound, w.volID)
	}
	in.Claim = vol.Claims[w.allocID]
	in.PublishingFor = s.publishAges.Of(w.volID, in.Claim, time.Now())
	nodeID := ""
	switch {
	case in.Claim != nil:
		nodeID = in.Claim.NodeID
	case w.want != nil:
		nodeID = w.want.NodeID
	}
	if in.Alloc, err = store.AllocByID(nil, w.allocID); err != nil {
		return in, nil, err
	}
	if nodeID != "" {
		if in.Node, err = store.NodeByID(nil, nodeID); err != nil {
			return in, nil, err
		}
	}
	in.PluginID = vol.PluginID
	if in.Plugin, err = store.CSIPluginByID(nil, vol.PluginID); err != nil {
		return in, nil, err
	}
	return in, vol, nil
}

// claimCall makes one CSI call of a walk. Every call has a deadline: node
// calls their own, controller calls their lane's.
func (s *Server) claimCall(ctx context.Context, c csiclaim.Call, vol *structs.CSIVolume, claim *structs.CSIVolumeClaim, publishCtx *map[string]string) error {
	switch c {
	case csiclaim.CallControllerPublish:
		pc, err := s.controllerPublish(ctx, vol, claim)
		*publishCtx = pc
		return err
	case csiclaim.CallNodeDetach:
		ctx, cancel := context.WithTimeout(ctx, s.config.CSINodeDetachTimeout)
		defer cancel()
		return s.nodeDetach(ctx, vol, claim)
	case csiclaim.CallControllerUnpublish:
		return s.controllerUnpublish(ctx, vol, claim)
	}
	return fmt.Errorf("%w: claim call %v", structs.ErrInvalidRequest, c)
}

// nodeDetach asks the claim's node to unpublish and unstage the volume.
// The core skips it for a node that is gone or down: its mounts went with
// it.
func (s *Server) nodeDetach(ctx context.Context, vol *structs.CSIVolume, claim *structs.CSIVolumeClaim) error {
	req := structs.ClientCSINodeDetachVolumeRequest{
		PluginID: vol.PluginID, VolumeID: vol.ID, ExternalID: vol.ExternalID, AllocID: claim.AllocationID,
		NodeID: claim.ExternalNodeID, AttachmentMode: claim.AttachmentMode, AccessMode: claim.AccessMode,
		ReadOnly: claim.Mode == structs.CSIVolumeClaimRead,
	}
	var resp structs.ClientCSINodeDetachVolumeResponse
	if err := s.clientRPC(ctx, claim.NodeID, "ClientCSI.NodeDetachVolume", &req, &resp); err != nil {
		return fmt.Errorf("node detach of %s from node %s: %w", vol.ID, claim.NodeID, err)
	}
	return nil
}

// controllerPublish attaches the volume to the claim's node at the
// plugin's first healthy controller, through the plugin's lane.
func (s *Server) controllerPublish(ctx context.Context, vol *structs.CSIVolume, claim *structs.CSIVolumeClaim) (map[string]string, error) {
	var pc map[string]string
	var reply structs.CSIControllerReply
	key := laneadmit.Call{Volume: laneadmit.VolumeKey(vol.ExternalID), Node: claim.NodeID}
	err := s.onController(ctx, vol.PluginID, "publish", key, &reply, func(ctx context.Context, cn *structs.Node) error {
		req := structs.ClientCSIControllerAttachVolumeRequest{
			PluginID: vol.PluginID, VolumeID: vol.ExternalID, ClientCSINodeID: claim.ExternalNodeID,
			AttachmentMode: claim.AttachmentMode, AccessMode: claim.AccessMode,
			ReadOnly: claim.Mode == structs.CSIVolumeClaimRead, MountOptions: vol.MountOptions,
			Secrets: vol.Secrets, VolumeContext: vol.Context,
			CSIControllerQuery: controllerQuery(ctx, cn),
		}
		var resp structs.ClientCSIControllerAttachVolumeResponse
		if err := s.clientRPC(ctx, cn.ID, "ClientCSI.ControllerAttachVolume", &req, &resp); err != nil {
			return err
		}
		pc, reply = resp.PublishContext, resp.CSIControllerReply
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
	var resp structs.ClientCSIControllerDetachVolumeResponse
	key := laneadmit.Call{Volume: laneadmit.VolumeKey(vol.ExternalID), Node: claim.NodeID}
	return s.onController(ctx, vol.PluginID, "unpublish", key, &resp.CSIControllerReply, func(ctx context.Context, cn *structs.Node) error {
		req := structs.ClientCSIControllerDetachVolumeRequest{
			PluginID: vol.PluginID, VolumeID: vol.ExternalID, ClientCSINodeID: claim.ExternalNodeID,
			Secrets: vol.Secrets, CSIControllerQuery: controllerQuery(ctx, cn),
		}
		return s.clientRPC(ctx, cn.ID, "ClientCSI.ControllerDetachVolume", &req, &resp)
	})
}

// leaderTermKey is the context key under which onController passes its
// lanes' term to the calls it makes.
type leaderTermKey struct{}

// laneTerm is the term of the lanes a call runs in, zero outside a lane.
func laneTerm(ctx context.Context) uint64 {
	term, _ := ctx.Value(leaderTermKey{}).(uint64)
	return term
}

// controllerQuery addresses a controller call to cn, stamped with the term
// of the lanes it runs in (none outside a lane) and, for a lane call, the
// bounds unknownCallEnds counts on.
func controllerQuery(ctx context.Context, cn *structs.Node) structs.CSIControllerQuery {
	q := structs.CSIControllerQuery{ControllerNodeID: cn.ID, LeaderTerm: laneTerm(ctx)}
	if q.LeaderTerm != 0 {
		q.StartWithin, q.Timeout = csiCallStartWithin, csiCallTimeout
	}
	return q
}

// csiCallStartWithin is how long a lane call may wait in its client's lane
// for its turn (behind a deposed leader's calls, or a lane that runs fewer
// calls at once than this leader's) before the client refuses it unrun.
const csiCallStartWithin = 30 * time.Second

// unknownCallEnds is when a lane call whose outcome became unknown at now
// has ended at its client: it was sent before now (and reached the client
// before now, unless the network held it), began within
// csiCallStartWithin of reaching it or never, and ran at most
// csiCallTimeout. The in-memory fence holds until then. Clients before
// CSIControllerQuery.StartWithin do not bound the wait: for them the
// fence counts on the call having started by now.
func unknownCallEnds(now time.Time) time.Time {
	return now.Add(csiCallStartWithin + csiCallTimeout)
}

// applyRecordedFence narrows candidates by pluginID's fence in Raft, unless
// this leader has seen a call answered on the fenced node.
func (s *Server) applyRecordedFence(lanes *controllerLanes, pluginID string, candidates iter.Seq[*structs.Node]) (iter.Seq[*structs.Node], error) {
	rec, err := s.State().CSIControllerFence(nil, pluginID)
	if err != nil || rec == nil || lanes.knownIdle(pluginID, rec.NodeID) {
		return candidates, err
	}
	node, err := s.State().NodeByID(nil, rec.NodeID)
	if err != nil {
		return nil, err
	}
	return recordedFenceCandidates(pluginID, candidates, rec, node)
}

// recordFence writes pluginID's fence to nodeID through Raft, unless it
// already names that node.
func (s *Server) recordFence(pluginID, nodeID string) error {
	rec, err := s.State().CSIControllerFence(nil, pluginID)
	if err != nil {
		return err
	}
	if rec != nil && rec.NodeID == nodeID {
		return nil
	}
	if _, _, err := s.raftApply(structs.CSIControllerFenceRequestType, &structs.CSIControllerFenceRequest{
		Fence: structs.CSIControllerFence{PluginID: pluginID, NodeID: nodeID},
	}); err != nil {
		return fmt.Errorf("record controller fence for plugin %q on node %s: %w", pluginID, nodeID, err)
	}
	return nil
}

// onController runs one destructive controller call: it waits its turn in
// the plugin's lane, then tries the plugin's healthy controllers on ready
// nodes, lowest node ID first, moving on only when a controller could not
// be reached. key is the volume, and for publish and unpublish the claim's
// node, that no other call of the lane may act on at once; the lane runs
// as many calls as the plugin's controller_concurrency allows (see
// laneLimit). call decodes its answer's CSIControllerReply into reply
// (nil: the caller has none to give, and an answer counts as one from a
// lane of one call).
func (s *Server) onController(ctx context.Context, pluginID, op string, key laneadmit.Call,
	reply *structs.CSIControllerReply, call func(ctx context.Context, cn *structs.Node) error) error {
	lanes := s.lanes.Load()
	if lanes == nil {
		return fmt.Errorf("%w: not the leader; controller calls run on the leader", structs.ErrNoLeader)
	}
	ctx = context.WithValue(ctx, leaderTermKey{}, lanes.term)
	plugin, err := s.State().CSIPluginByID(nil, pluginID)
	if err != nil {
		return err
	}
	req := laneRequest{PluginID: pluginID, Op: op, Key: key, Limit: s.laneLimit(lanes, plugin)}
	return lanes.Call(ctx, req, func(ctx context.Context) error {
		candidates, err := pluginControllers(s.State(), pluginID)
		if err != nil {
			return err
		}
		if controllerFenceDisabled() {
			fenceOffWarning.Do(func() {
				s.logger.Warn("controller fences are off: this server may call two controllers of one plugin at once",
					"env", EnvDisableControllerFence)
			})
		} else if nodeID, ok := lanes.fencedTo(pluginID, time.Now()); ok {
			if candidates, err = fencedCandidates(pluginID, candidates, nodeID); err != nil {
				return err
			}
		} else if candidates, err = s.applyRecordedFence(lanes, pluginID, candidates); err != nil {
			return err
		}
		var tried *structs.Node
		node, err := callController(ctx, pluginID, candidates, func(ctx context.Context, n *structs.Node) error {
			if req.Limit > 1 {
				// Several calls at once: none goes to a node other than
				// the one the others run on, or a fence (in memory, or
				// recorded for the next leader) would name only one of
				// two nodes with calls in flight.
				busyOn, ok := lanes.enterNode(pluginID, n.ID)
				if !ok {
					return fmt.Errorf("%w: plugin %q has controller calls in flight on node %s; this %s waits for them rather than go to node %s",
						structs.ErrClaimInProgress, pluginID, busyOn, op, n.ID)
				}
				defer lanes.leaveNode(pluginID)
			}
			tried = n
			// Recorded before the call, so that a leader taking over
			// while it runs knows where it went.
			if err := s.recordFence(pluginID, n.ID); err != nil {
				return err
			}
			start := time.Now()
			s.logger.Debug("controller call", "plugin_id", pluginID, "op", op, "node_id", n.ID)
			if reply != nil {
				*reply = structs.CSIControllerReply{}
			}
			err := call(ctx, n)
			s.logger.Debug("controller call returned", "plugin_id", pluginID, "op", op, "node_id", n.ID,
				"duration", time.Since(start), "error", err)
			return err
		})
		// An answer from node means every call sent there before it has
		// ended, so the plugin's calls may move elsewhere, only when its
		// lane says so (see structs.CSIControllerReply).
		var drained bool
		if node != nil {
			// Read again: the call may have waited long in the lane.
			now, rerr := s.State().CSIPluginByID(nil, pluginID)
			if rerr != nil {
				now = nil
			}
			drained = earlierCallsEnded(now, node.ID, req.Limit, reply, err)
		}
		if drained {
			lanes.markIdle(pluginID, node.ID)
		}
		switch {
		case errors.Is(err, structs.ErrOutcomeUnknown) && tried != nil:
			s.logger.Warn("controller call outcome unknown; the plugin's calls stay on its node until one succeeds there",
				"plugin_id", pluginID, "op", op, "node_id", tried.ID, "error", err)
			lanes.setFence(pluginID, tried.ID, unknownCallEnds(time.Now()))
		case err == nil && drained:
			lanes.liftFence(pluginID, node.ID)
		}
		return err
	})
}

// earlierCallsEnded reports whether an answer from the controller on
// nodeID (reply and err) shows that every call sent there before it has
// ended. A success says so in reply (false from a lane of several calls
// that still ran one; never set by a lane of one). An error carries no
// reply, so it shows that much only when the controller's lane runs one
// call at a time, as every lane did before controller_concurrency; a
// controller the plugin no longer lists is judged by the leader's own
// lane (limit): one call at a time, as before, or else not at all.
func earlierCallsEnded(plugin *structs.CSIPlugin, nodeID string, limit int, reply *structs.CSIControllerReply, err error) bool {
	if err == nil {
		return reply == nil || !reply.LaneBusyBefore
	}
	var info *structs.CSIInfo
	if plugin != nil {
		info = plugin.Controllers[nodeID]
	}
	if info == nil {
		return limit <= 1
	}
	return info.ControllerConcurrency <= 1
}

// laneLimit is how many of plugin's calls its lane runs at once: the
// plugin's controller_concurrency once every server reads LaneBusyBefore
// (upgrade.ControllerConcurrency), one before. A plugin whose controllers
// disagree is logged once per disagreement.
func (s *Server) laneLimit(lanes *controllerLanes, plugin *structs.CSIPlugin) int {
	if plugin == nil {
		return 1
	}
	if plugin.ControllerConcurrencyWarning != "" && lanes.firstWarning(plugin.ID, plugin.ControllerConcurrencyWarning) {
		s.logger.Warn("csi plugin's controllers disagree on controller_concurrency; the smallest is used",
			"plugin_id", plugin.ID, "warning", plugin.ControllerConcurrencyWarning)
	}
	if plugin.ControllerConcurrency <= 1 {
		return 1
	}
	min, known := s.minServerVersion()
	return pluginLaneLimit(plugin, min, known)
}

// pluginLaneLimit is laneLimit's decision, given the oldest server build
// (known false: none could be read).
func pluginLaneLimit(plugin *structs.CSIPlugin, minServer upgrade.Version, known bool) int {
	if plugin == nil || !known || !upgrade.ControllerConcurrency.Enabled(minServer) {
		return 1
	}
	return min(max(1, plugin.ControllerConcurrency), laneadmit.MaxLimit)
}
