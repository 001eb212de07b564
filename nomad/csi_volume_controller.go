// The CSIVolume RPCs that drive a controller plugin through the lane:
// Create, Delete, Unpublish and the snapshot calls (CreateSnapshot,
// DeleteSnapshot, ListSnapshots). Register, Deregister and the reads are in
// csi_endpoint.go, Claim in csi_claim.go, Expand in csi_volume_expand.go.

package nomad

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// csiProvisionContext bounds one create, delete or snapshot request: its
// wait in the lane, the controller call, and the Raft writes around it.
func (s *Server) csiProvisionContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.shutdownCtx, csiCallTimeout+s.config.RPCHoldTimeout)
}

// validateVolumeCreate checks a volume to create: as a registration, but
// with no external ID, which the provider assigns.
func validateVolumeCreate(store *state.StateStore, v *structs.CSIVolume) error {
	cp := v.Copy()
	cp.ExternalID = "to be created" // satisfies validateVolume; replaced by the provider's
	if err := validateVolume(store, cp); err != nil {
		return err
	}
	return checkVolumeSource(store, v)
}

// checkVolumeSource checks a create's content source: at most one of
// snapshot_id and clone_id, each a valid provider ID, and a plugin with a
// controller that advertises what it needs (CREATE_DELETE_SNAPSHOT to
// restore a snapshot, CLONE_VOLUME to clone), so that a plugin that would
// ignore the source and hand back an empty volume is never asked.
func checkVolumeSource(store *state.StateStore, v *structs.CSIVolume) error {
	if v.SnapshotID == "" && v.CloneID == "" {
		return nil
	}
	if v.SnapshotID != "" && v.CloneID != "" {
		return fmt.Errorf("volume %q: %w: snapshot_id %q and clone_id %q both given; a volume has one source",
			v.ID, structs.ErrInvalidRequest, v.SnapshotID, v.CloneID)
	}
	capability, supports := "CREATE_DELETE_SNAPSHOT", func(i *structs.CSIControllerInfo) bool { return i.SupportsCreateSnapshot }
	if v.SnapshotID != "" {
		if err := structs.ValidateExternalID(structs.IDKindSnapshot, v.SnapshotID); err != nil {
			return fmt.Errorf("volume %q: snapshot_id: %w", v.ID, err)
		}
	} else {
		if err := structs.ValidateExternalID(structs.IDKindExternalVol, v.CloneID); err != nil {
			return fmt.Errorf("volume %q: clone_id: %w", v.ID, err)
		}
		capability, supports = "CLONE_VOLUME", func(i *structs.CSIControllerInfo) bool { return i.SupportsClone }
	}
	p, err := store.CSIPluginByID(nil, v.PluginID)
	if err != nil {
		return err
	}
	if p != nil {
		for _, c := range p.Controllers {
			if c != nil && c.ControllerInfo != nil && supports(c.ControllerInfo) {
				return nil
			}
		}
	}
	what := "snapshot_id"
	if v.CloneID != "" {
		what = "clone_id"
	}
	return fmt.Errorf("volume %q: %w: %s needs a plugin whose controller advertises %s; plugin %q has none that does",
		v.ID, structs.ErrInvalidRequest, what, capability, v.PluginID)
}

// Create creates volumes in the storage provider through the plugin's
// controller, in the plugin's lane, and registers each with the external
// ID, capacity and context the provider answered with. Every volume is
// validated before any is created. The provider sees the volume ID as the
// name, its idempotency key, so a create retried after a failure (even
// one between the provider's answer and the registration) gets the same
// provider volume back rather than a second one.
//
// A create of an ID that is already registered updates the registration
// instead (see createAsUpdate), under the same rules as a register of it:
// the provider is not called.
func (c *CSIVolume) Create(args *structs.CSIVolumeCreateRequest, reply *structs.CSIVolumeCreateResponse) error {
	if done, err := c.srv.forward("CSIVolume.Create", args, args, reply); done {
		return err
	}
	if len(args.Volumes) == 0 {
		return fmt.Errorf("%w: no volumes given", structs.ErrInvalidRequest)
	}
	srv := c.srv
	store := srv.State()
	seen := make(map[string]bool, len(args.Volumes))
	// updates holds, by position, the registration update a create of a
	// registered ID becomes.
	updates := make([]*structs.CSIVolume, len(args.Volumes))
	for i, v := range args.Volumes {
		if v == nil {
			return fmt.Errorf("%w: volumes must not hold null", structs.ErrInvalidRequest)
		}
		if seen[v.ID] {
			return fmt.Errorf("volume %q: %w: given twice", v.ID, structs.ErrInvalidRequest)
		}
		seen[v.ID] = true
		existing, err := store.CSIVolumeByID(nil, structs.DefaultNamespace, v.ID)
		if err != nil {
			return err
		}
		if existing == nil {
			if err := validateVolumeCreate(store, v); err != nil {
				return err
			}
			continue
		}
		next := createAsUpdate(existing, v)
		if err := validateVolume(store, next); err != nil {
			return err
		}
		if needsExpand(existing, next) {
			err = checkExpandingUpdate(store, existing, next)
		} else {
			err = checkVolumeUpdate(store, next)
		}
		if err != nil {
			return err
		}
		updates[i] = next
	}
	var grow []*structs.CSIVolume
	for _, u := range updates {
		if u != nil {
			grow = append(grow, u)
		}
	}
	if err := srv.expandForUpdates(grow, args.WriteRequest); err != nil {
		return err
	}
	ctx, cancel := srv.csiProvisionContext()
	defer cancel()
	for i, v := range args.Volumes {
		var vol *structs.CSIVolume
		var index uint64
		var err error
		if updates[i] != nil {
			vol, index, err = srv.registerVolume(updates[i], args.WriteRequest)
		} else {
			vol, index, err = srv.createVolume(ctx, v, args.WriteRequest)
		}
		if err != nil {
			return err
		}
		reply.Volumes = append(reply.Volumes, vol.Sanitize())
		reply.Index = index
	}
	return nil
}

// createVolume creates one volume at the controller and registers it. It
// returns the volume as registered.
func (s *Server) createVolume(ctx context.Context, v *structs.CSIVolume, wr structs.WriteRequest) (*structs.CSIVolume, uint64, error) {
	var created structs.ClientCSIControllerCreateVolumeResponse
	key := laneadmit.Create(v.ID, v.SnapshotID, v.CloneID)
	err := s.onController(ctx, v.PluginID, "create", key, &created.CSIControllerReply, func(ctx context.Context, cn *structs.Node) error {
		req := structs.ClientCSIControllerCreateVolumeRequest{
			PluginID: v.PluginID, Name: v.ID, CapacityMin: v.CapacityMin, CapacityMax: v.CapacityMax,
			Capabilities: v.RequestedCapabilities, MountOptions: v.MountOptions,
			Parameters: v.Parameters, Secrets: v.Secrets, SnapshotID: v.SnapshotID, CloneID: v.CloneID,
			Topologies:         v.RequestedTopologies,
			CSIControllerQuery: controllerQuery(ctx, cn),
		}
		return s.clientRPC(ctx, cn.ID, "ClientCSI.ControllerCreateVolume", &req, &created)
	})
	if err != nil {
		return nil, 0, fmt.Errorf("creating volume %q: %w", v.ID, err)
	}
	if created.ExternalVolumeID == "" {
		return nil, 0, fmt.Errorf("creating volume %q: plugin %q answered without a volume ID", v.ID, v.PluginID)
	}
	vol := v.Copy()
	vol.Namespace = structs.DefaultNamespace
	if vol.Name == "" {
		vol.Name = vol.ID
	}
	vol.Claims = nil
	vol.ExternalID = created.ExternalVolumeID
	vol.Capacity = created.CapacityBytes
	vol.Topologies = structs.CopyTopologies(created.Topologies)
	if len(vol.Topologies) == 0 && vol.RequestedTopologies != nil && len(vol.RequestedTopologies.Required) > 0 {
		// A provider that does not say keeps to what was required.
		vol.Topologies = structs.CopyTopologies(vol.RequestedTopologies.Required)
	}
	// The provider's context is what the node plugin needs; the caller's
	// fills in only keys the provider did not set.
	if len(created.VolumeContext) > 0 {
		merged := maps.Clone(vol.Context)
		if merged == nil {
			merged = make(map[string]string, len(created.VolumeContext))
		}
		maps.Copy(merged, created.VolumeContext)
		vol.Context = merged
	}
	latest, index, err := s.registerVolume(vol, wr)
	if err != nil {
		// The provider volume exists unregistered; a retried create finds
		// it again by name.
		s.logger.Warn("created volume could not be registered; retry the create",
			"volume_id", v.ID, "external_id", vol.ExternalID, "error", err)
		return nil, 0, fmt.Errorf("registering created volume %q: %w", v.ID, err)
	}
	return latest, index, nil
}

// errVolumeClaimed refuses a delete of a volume that has claims.
func errVolumeClaimed(v *structs.CSIVolume) error {
	return fmt.Errorf("%w: volume %q has %d claim(s); stop its allocations and detach it first",
		structs.ErrInvalidRequest, v.ID, len(v.Claims))
}

// Delete deletes volumes in the storage provider, through the plugin's
// lane, and then removes their registrations. A claimed volume is refused.
//
// The claims are checked once up front and again inside the lane, just
// before the controller call: a claim reserved after that check has its
// publish queued behind the delete in the same lane, where it fails and is
// rolled back, so a volume is never deleted under a claim that got as far
// as publishing.
func (c *CSIVolume) Delete(args *structs.CSIVolumeDeleteRequest, reply *structs.CSIVolumeDeleteResponse) error {
	if done, err := c.srv.forward("CSIVolume.Delete", args, args, reply); done {
		return err
	}
	if len(args.VolumeIDs) == 0 {
		return fmt.Errorf("%w: no volume IDs given", structs.ErrInvalidRequest)
	}
	for _, id := range args.VolumeIDs {
		if err := structs.ValidateID(structs.IDKindVolume, id); err != nil {
			return err
		}
	}
	srv := c.srv
	store := srv.State()
	for _, id := range args.VolumeIDs {
		v, err := store.CSIVolumeByID(nil, structs.DefaultNamespace, id)
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("%w: volume %q", structs.ErrNotFound, id)
		}
		if len(v.Claims) > 0 {
			return errVolumeClaimed(v)
		}
	}
	ctx, cancel := srv.csiProvisionContext()
	defer cancel()
	var deleted []string
	for _, id := range args.VolumeIDs {
		index, err := srv.deleteVolume(ctx, id, args.WriteRequest)
		if err != nil {
			return partlyDone(deleted, "deleted", fmt.Errorf("volume %q: %w", id, err))
		}
		deleted = append(deleted, id)
		reply.Index = index
	}
	return nil
}

// partlyDone is the error of a call over several items that stopped with
// err after the items in done were, marked structs.ErrPartlyDone: sent
// again as a call that never ran, it would be refused for those (a volume
// deleted is not found) or repeat them (a second snapshot), and the caller
// would never hear what was done.
func partlyDone(done []string, what string, err error) error {
	if len(done) == 0 || errors.Is(err, structs.ErrPartlyDone) {
		return err
	}
	return fmt.Errorf("%w: %s %s first, then: %w", structs.ErrPartlyDone, what, strings.Join(done, ", "), err)
}

// deleteVolume deletes one volume at the controller and deregisters it.
func (s *Server) deleteVolume(ctx context.Context, id string, wr structs.WriteRequest) (uint64, error) {
	v, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, id)
	if err != nil {
		return 0, err
	}
	if v == nil {
		return 0, fmt.Errorf("%w: volume %q", structs.ErrNotFound, id)
	}
	var resp structs.ClientCSIControllerDeleteVolumeResponse
	key := laneadmit.Call{Volume: laneadmit.VolumeKey(v.ExternalID)}
	err = s.onController(ctx, v.PluginID, "delete", key, &resp.CSIControllerReply, func(ctx context.Context, cn *structs.Node) error {
		cur, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, id)
		if err != nil {
			return err
		}
		if cur == nil {
			return fmt.Errorf("%w: volume %q", structs.ErrNotFound, id)
		}
		if len(cur.Claims) > 0 {
			return errVolumeClaimed(cur)
		}
		req := structs.ClientCSIControllerDeleteVolumeRequest{
			PluginID: cur.PluginID, ExternalVolumeID: cur.ExternalID, Secrets: cur.Secrets,
			CSIControllerQuery: controllerQuery(ctx, cn),
		}
		return s.clientRPC(ctx, cn.ID, "ClientCSI.ControllerDeleteVolume", &req, &resp)
	})
	if err != nil {
		return 0, fmt.Errorf("deleting volume %q: %w", id, err)
	}
	req := structs.CSIVolumeDeregisterRequest{VolumeIDs: []string{id}, WriteRequest: wr}
	_, index, err := s.raftApply(structs.CSIVolumeDeregisterRequestType, &req)
	if err != nil {
		// Deleting again is harmless: the plugin answers an unknown volume
		// with success.
		return 0, fmt.Errorf("deregistering deleted volume %q: %w", id, err)
	}
	return index, nil
}

// Unpublish releases the claims on a volume held by allocations on one
// node: the node detaches (unless it is down or gone), then the
// controller, each step checkpointed as for any release. It is refused,
// releasing nothing, while any of those allocations still runs. A node
// holding no claim on the volume is not an error.
func (c *CSIVolume) Unpublish(args *structs.CSIVolumeUnpublishRequest, reply *structs.CSIVolumeUnpublishResponse) error {
	if done, err := c.srv.forward("CSIVolume.Unpublish", args, args, reply); done {
		return err
	}
	if args.VolumeID == "" || args.NodeID == "" {
		return fmt.Errorf("%w: a volume ID and a node ID are required", structs.ErrInvalidRequest)
	}
	// A release makes the node's client take apart the directories it
	// built from these IDs: refuse any that could not name one.
	if err := structs.ValidateID(structs.IDKindVolume, args.VolumeID); err != nil {
		return err
	}
	if err := structs.ValidateID(structs.IDKindNode, args.NodeID); err != nil {
		return err
	}
	srv := c.srv
	store := srv.State()
	vol, err := store.CSIVolumeByID(nil, structs.DefaultNamespace, args.VolumeID)
	if err != nil {
		return err
	}
	if vol == nil {
		return fmt.Errorf("%w: volume %q", structs.ErrNotFound, args.VolumeID)
	}
	var allocIDs []string
	for allocID, cl := range vol.Claims {
		if cl.NodeID != args.NodeID {
			continue
		}
		held, err := claimHeld(store, allocID, cl)
		if err != nil {
			return err
		}
		if held != "" {
			return fmt.Errorf("%w: volume %q is claimed on node %s: %s", structs.ErrInvalidRequest, vol.ID, args.NodeID, held)
		}
		allocIDs = append(allocIDs, allocID)
	}
	ctx, cancel := srv.csiProvisionContext()
	defer cancel()
	var errs []error
	for _, allocID := range allocIDs {
		k := claimKey{vol.ID, allocID}
		if !srv.claims.start(k) {
			errs = append(errs, fmt.Errorf("%w: allocation %s, volume %s", structs.ErrClaimInProgress, allocID, vol.ID))
			continue
		}
		err := srv.releaseClaim(ctx, vol.ID, allocID, false)
		srv.claims.done(k)
		if err != nil {
			errs = append(errs, fmt.Errorf("releasing allocation %s's claim: %w", allocID, err))
			continue
		}
		reply.Released = append(reply.Released, allocID)
	}
	if len(errs) == 0 {
		return nil
	}
	return partlyDone(reply.Released, "released the claims of", errors.Join(errs...))
}

// knownPlugin refuses an empty or unknown plugin ID as a bad request.
func knownPlugin(store *state.StateStore, pluginID string) error {
	if pluginID == "" {
		return fmt.Errorf("%w: plugin_id is required", structs.ErrInvalidRequest)
	}
	if err := structs.ValidateID(structs.IDKindPlugin, pluginID); err != nil {
		return err
	}
	p, err := store.CSIPluginByID(nil, pluginID)
	if err != nil {
		return err
	}
	if p == nil {
		return fmt.Errorf("%w: unknown plugin %q: no client reports it", structs.ErrInvalidRequest, pluginID)
	}
	return nil
}

// CreateSnapshot snapshots registered volumes through their plugins'
// lanes. All source volumes are checked before any snapshot is taken. A
// snapshot without a name gets one from its volume's ID and the time.
func (c *CSIVolume) CreateSnapshot(args *structs.CSISnapshotCreateRequest, reply *structs.CSISnapshotCreateResponse) error {
	if done, err := c.srv.forward("CSIVolume.CreateSnapshot", args, args, reply); done {
		return err
	}
	if len(args.Snapshots) == 0 {
		return fmt.Errorf("%w: no snapshots given", structs.ErrInvalidRequest)
	}
	srv := c.srv
	store := srv.State()
	vols := make([]*structs.CSIVolume, len(args.Snapshots))
	for i, snap := range args.Snapshots {
		if snap == nil || snap.SourceVolumeID == "" {
			return fmt.Errorf("%w: every snapshot needs a source volume ID", structs.ErrInvalidRequest)
		}
		if err := structs.ValidateID(structs.IDKindVolume, snap.SourceVolumeID); err != nil {
			return err
		}
		// The name goes to the provider as is.
		if snap.Name != "" {
			if err := structs.ValidateExternalID(structs.IDKindSnapshotNm, snap.Name); err != nil {
				return err
			}
		}
		v, err := store.CSIVolumeByID(nil, structs.DefaultNamespace, snap.SourceVolumeID)
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("%w: volume %q", structs.ErrNotFound, snap.SourceVolumeID)
		}
		if err := knownPlugin(store, v.PluginID); err != nil {
			return err
		}
		vols[i] = v
	}
	ctx, cancel := srv.csiProvisionContext()
	defer cancel()
	for i, spec := range args.Snapshots {
		v := vols[i]
		name := spec.Name
		if name == "" {
			name = defaultSnapshotName(v.ID, time.Now())
		}
		secrets := spec.Secrets
		if secrets == nil {
			secrets = v.Secrets
		}
		var resp structs.ClientCSIControllerCreateSnapshotResponse
		key := laneadmit.Call{Volume: laneadmit.VolumeKey(v.ExternalID)}
		err := srv.onController(ctx, v.PluginID, "snapshot-create", key, &resp.CSIControllerReply, func(ctx context.Context, cn *structs.Node) error {
			req := structs.ClientCSIControllerCreateSnapshotRequest{
				PluginID: v.PluginID, ExternalVolumeID: v.ExternalID, Name: name,
				Parameters: spec.Parameters, Secrets: secrets,
				CSIControllerQuery: controllerQuery(ctx, cn),
			}
			return srv.clientRPC(ctx, cn.ID, "ClientCSI.ControllerCreateSnapshot", &req, &resp)
		})
		if err != nil {
			return partlyDone(snapshotIDs(reply.Snapshots), "took snapshots", fmt.Errorf("snapshotting volume %q: %w", v.ID, err))
		}
		if resp.Snapshot == nil {
			return partlyDone(snapshotIDs(reply.Snapshots), "took snapshots",
				fmt.Errorf("snapshotting volume %q: plugin %q answered without a snapshot", v.ID, v.PluginID))
		}
		reply.Snapshots = append(reply.Snapshots, resp.Snapshot)
	}
	return nil
}

func snapshotIDs(snaps []*structs.CSISnapshot) []string {
	out := make([]string, 0, len(snaps))
	for _, sn := range snaps {
		out = append(out, sn.ID)
	}
	return out
}

// defaultSnapshotName names a snapshot of volume id taken at now: the ID
// and the Unix time, the ID cut short so that the name stays within the
// CSI spec's MaxIDBytes.
func defaultSnapshotName(id string, now time.Time) string {
	suffix := fmt.Sprintf("-%d", now.Unix())
	if len(id)+len(suffix) > structs.MaxIDBytes {
		id = id[:structs.MaxIDBytes-len(suffix)]
	}
	return id + suffix
}

// DeleteSnapshot deletes one snapshot through the plugin's lane. Deleting
// an unknown snapshot succeeds, as the plugin answers it.
func (c *CSIVolume) DeleteSnapshot(args *structs.CSISnapshotDeleteRequest, reply *structs.CSISnapshotDeleteResponse) error {
	if done, err := c.srv.forward("CSIVolume.DeleteSnapshot", args, args, reply); done {
		return err
	}
	srv := c.srv
	if err := knownPlugin(srv.State(), args.PluginID); err != nil {
		return err
	}
	if args.SnapshotID == "" {
		return fmt.Errorf("%w: snapshot_id is required", structs.ErrInvalidRequest)
	}
	if err := structs.ValidateExternalID(structs.IDKindSnapshot, args.SnapshotID); err != nil {
		return err
	}
	ctx, cancel := srv.csiProvisionContext()
	defer cancel()
	var resp structs.ClientCSIControllerDeleteSnapshotResponse
	key := laneadmit.Call{Volume: laneadmit.SnapshotKey(args.SnapshotID)}
	err := srv.onController(ctx, args.PluginID, "snapshot-delete", key, &resp.CSIControllerReply, func(ctx context.Context, cn *structs.Node) error {
		req := structs.ClientCSIControllerDeleteSnapshotRequest{
			PluginID: args.PluginID, ID: args.SnapshotID, Secrets: args.Secrets,
			CSIControllerQuery: controllerQuery(ctx, cn),
		}
		return srv.clientRPC(ctx, cn.ID, "ClientCSI.ControllerDeleteSnapshot", &req, &resp)
	})
	if err != nil {
		return fmt.Errorf("deleting snapshot %q of plugin %q: %w", args.SnapshotID, args.PluginID, err)
	}
	return nil
}

// ListSnapshots lists one page of a plugin's snapshots. Listing changes
// nothing, so it skips the server's lane (it would otherwise wait behind
// every queued publish and delete of the plugin) but picks the controller
// the same way: the first healthy candidate by node ID that answers. The
// client still runs it in its own per-plugin lane, so it never interleaves
// with a destructive call at the plugin. It runs on the leader, like the
// destructive calls, so a listing after a create sees the same controller.
func (c *CSIVolume) ListSnapshots(args *structs.CSISnapshotListRequest, reply *structs.CSISnapshotListResponse) error {
	args.AllowStale = false
	if done, err := c.srv.forward("CSIVolume.ListSnapshots", args, args, reply); done {
		return err
	}
	srv := c.srv
	store := srv.State()
	if err := knownPlugin(store, args.PluginID); err != nil {
		return err
	}
	index, err := srv.readFromController(args.PluginID, func(ctx context.Context, cn *structs.Node) error {
		req := structs.ClientCSIControllerListSnapshotsRequest{
			PluginID: args.PluginID, MaxEntries: args.MaxEntries, StartingToken: args.StartingToken,
			Secrets: args.Secrets, CSIControllerQuery: controllerQuery(ctx, cn),
		}
		var resp structs.ClientCSIControllerListSnapshotsResponse
		if err := srv.clientRPC(ctx, cn.ID, "ClientCSI.ControllerListSnapshots", &req, &resp); err != nil {
			return err
		}
		reply.Snapshots, reply.NextToken = resp.Snapshots, resp.NextToken
		return nil
	})
	if err != nil {
		return fmt.Errorf("listing snapshots of plugin %q: %w", args.PluginID, err)
	}
	reply.Index = index
	return nil
}
