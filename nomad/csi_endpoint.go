package nomad

import (
	"errors"
	"fmt"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/roamhq/roam/nomad/csiclaim"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// CSIVolume serves volume registration, reads and claims.
type CSIVolume struct {
	srv *Server
}

// CSIPlugin serves plugin reads.
type CSIPlugin struct {
	srv *Server
}

var validAccessModes = map[string]bool{
	structs.CSIAccessModeSingleNodeReader:      true,
	structs.CSIAccessModeSingleNodeWriter:      true,
	structs.CSIAccessModeMultiNodeReader:       true,
	structs.CSIAccessModeMultiNodeSingleWriter: true,
	structs.CSIAccessModeMultiNodeMultiWriter:  true,
}

var validAttachmentModes = map[string]bool{
	structs.CSIAttachmentModeFilesystem:  true,
	structs.CSIAttachmentModeBlockDevice: true,
}

// validateVolume checks a registration before anything is written.
func validateVolume(store *state.StateStore, v *structs.CSIVolume) error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	// The volume ID names directories on every client that mounts the
	// volume, the plugin ID those directories' parent: both must be safe
	// as file names. The external ID is the provider's, passed through.
	if v.ID == "" {
		add("volume ID is required")
	} else if err := structs.ValidateID(structs.IDKindVolume, v.ID); err != nil {
		errs = append(errs, err)
	}
	if v.Namespace != "" && v.Namespace != structs.DefaultNamespace {
		add("namespace %q is not supported", v.Namespace)
	}
	if v.ExternalID == "" {
		add("external_id is required")
	} else if err := structs.ValidateExternalID(structs.IDKindExternalVol, v.ExternalID); err != nil {
		errs = append(errs, err)
	}
	if len(v.RequestedCapabilities) == 0 {
		add("at least one capability is required")
	}
	for _, c := range v.RequestedCapabilities {
		if !validAccessModes[c.AccessMode] {
			add("access mode %q is not a CSI access mode", c.AccessMode)
		}
		if !validAttachmentModes[c.AttachmentMode] {
			add("attachment mode %q is not file-system or block-device", c.AttachmentMode)
		}
	}
	if err := v.RequestedTopologies.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(v.Topologies) > structs.MaxTopologies {
		add("%d topologies; at most %d", len(v.Topologies), structs.MaxTopologies)
	}
	if v.CapacityMin > structs.MaxVolumeCapacity {
		add("capacity_min %d is more than %d bytes (1 EiB), which no provider offers", v.CapacityMin, int64(structs.MaxVolumeCapacity))
	}
	if v.CapacityMin < 0 || v.CapacityMax < 0 || (v.CapacityMax > 0 && v.CapacityMin > v.CapacityMax) {
		add("capacity_min %d and capacity_max %d are not a valid range", v.CapacityMin, v.CapacityMax)
	}
	if v.PluginID == "" {
		add("plugin_id is required")
	} else if err := structs.ValidateID(structs.IDKindPlugin, v.PluginID); err != nil {
		errs = append(errs, err)
	} else if p, err := store.CSIPluginByID(nil, v.PluginID); err != nil {
		return err
	} else if p == nil {
		add("unknown plugin %q: no client reports it", v.PluginID)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("volume %s: %w: %w", quoteVolumeID(v.ID), structs.ErrInvalidRequest, errors.Join(errs...))
}

// quoteVolumeID quotes a volume ID for an error, cut short when it is too
// long to be one: the error names it but does not echo it whole.
func quoteVolumeID(id string) string {
	if len(id) > 2*structs.MaxIDBytes {
		return fmt.Sprintf("%q…", id[:structs.MaxIDBytes/2])
	}
	return fmt.Sprintf("%q", id)
}

// Register records volumes that exist in the storage provider. Every volume
// must name a known plugin and valid capabilities; one bad volume fails the
// whole request and nothing is written. A volume whose ID is registered
// already updates its registration, within the rules of
// structs.CheckCSIVolumeUpdate: its identity (namespace, plugin and
// external ID) is fixed, and what its claims rely on stays while it has
// any.
func (c *CSIVolume) Register(args *structs.CSIVolumeRegisterRequest, reply *structs.CSIVolumeRegisterResponse) error {
	if done, err := c.srv.forward("CSIVolume.Register", args, args, reply); done {
		return err
	}
	if len(args.Volumes) == 0 {
		return fmt.Errorf("%w: no volumes given", structs.ErrInvalidRequest)
	}
	store := c.srv.State()
	vols := make([]*structs.CSIVolume, 0, len(args.Volumes))
	seen := make(map[string]bool, len(args.Volumes))
	for _, v := range args.Volumes {
		if v == nil {
			return fmt.Errorf("%w: volumes must not hold null", structs.ErrInvalidRequest)
		}
		if err := validateVolume(store, v); err != nil {
			return err
		}
		// Two entries for one ID would be a registration and its update
		// in one write; the update would be refused at apply time anyway.
		if seen[v.ID] {
			return fmt.Errorf("volume %q: %w: given twice", v.ID, structs.ErrInvalidRequest)
		}
		seen[v.ID] = true
		cp := v.Copy()
		cp.Namespace = structs.DefaultNamespace
		if cp.Name == "" {
			cp.Name = cp.ID
		}
		cp.Claims = nil // claims are the server's, never the caller's
		// A registered volume is accessible where its spec requires.
		if len(cp.Topologies) == 0 && cp.RequestedTopologies != nil && len(cp.RequestedTopologies.Required) > 0 {
			cp.Topologies = structs.CopyTopologies(cp.RequestedTopologies.Required)
		}
		old, err := store.CSIVolumeByID(nil, cp.Namespace, cp.ID)
		if err != nil {
			return err
		}
		if old == nil && (cp.SnapshotID != "" || cp.CloneID != "") {
			return fmt.Errorf("volume %q: %w: snapshot_id and clone_id apply only to volume create; a registered volume exists already",
				cp.ID, structs.ErrInvalidRequest)
		}
		if needsExpand(old, cp) {
			err = checkExpandingUpdate(store, old, cp)
		} else {
			err = checkVolumeUpdate(store, cp)
		}
		if err != nil {
			return err
		}
		vols = append(vols, cp)
	}
	// A larger capacity_min grows the volume first (Nomad's rule); the
	// registration then records the grown volume.
	if err := c.srv.expandForUpdates(vols, args.WriteRequest); err != nil {
		return err
	}
	req := structs.CSIVolumeRegisterRequest{Volumes: vols, WriteRequest: args.WriteRequest}
	_, index, err := c.srv.raftApply(structs.CSIVolumeRegisterRequestType, &req)
	if err != nil {
		return err
	}
	reply.Index = index
	return nil
}

// Deregister removes volume registrations. A claimed volume is refused,
// unless Force and every claim may be released (csiclaim.Releasable: the
// client reported its allocation terminal, or its node is down or gone).
// IDs are not held to structs.ValidateID here: deregistering writes no
// path anywhere, and a volume registered before IDs were checked must
// stay removable.
func (c *CSIVolume) Deregister(args *structs.CSIVolumeDeregisterRequest, reply *structs.CSIVolumeDeregisterResponse) error {
	if done, err := c.srv.forward("CSIVolume.Deregister", args, args, reply); done {
		return err
	}
	if len(args.VolumeIDs) == 0 {
		return fmt.Errorf("%w: no volume IDs given", structs.ErrInvalidRequest)
	}
	store := c.srv.State()
	for _, id := range args.VolumeIDs {
		v, err := store.CSIVolumeByID(nil, structs.DefaultNamespace, id)
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("%w: volume %q", structs.ErrNotFound, id)
		}
		if len(v.Claims) == 0 {
			continue
		}
		if !args.Force {
			return fmt.Errorf("%w: volume %q has %d claim(s); release them or deregister with force", structs.ErrInvalidRequest, id, len(v.Claims))
		}
		for allocID, cl := range v.Claims {
			held, err := claimHeld(store, allocID, cl)
			if err != nil {
				return err
			}
			if held != "" {
				return fmt.Errorf("%w: volume %q is claimed: %s", structs.ErrInvalidRequest, id, held)
			}
		}
	}
	req := structs.CSIVolumeDeregisterRequest{VolumeIDs: args.VolumeIDs, Force: args.Force, WriteRequest: args.WriteRequest}
	_, index, err := c.srv.raftApply(structs.CSIVolumeDeregisterRequestType, &req)
	if err != nil {
		return err
	}
	reply.Index = index
	return nil
}

// List returns volume stubs; a blocking query.
func (c *CSIVolume) List(args *structs.CSIVolumeListRequest, reply *structs.CSIVolumeListResponse) error {
	if done, err := c.srv.forward("CSIVolume.List", args, args, reply); done {
		return err
	}
	return c.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		var vols []*structs.CSIVolume
		var err error
		if args.PluginID != "" {
			vols, err = store.CSIVolumesByPlugin(ws, args.PluginID)
		} else {
			vols, err = store.CSIVolumes(ws, structs.DefaultNamespace, args.Prefix)
		}
		if err != nil {
			return err
		}
		reply.Volumes = make([]*structs.CSIVolListStub, 0, len(vols))
		for _, v := range vols {
			p, err := store.CSIPluginByID(ws, v.PluginID)
			if err != nil {
				return err
			}
			reply.Volumes = append(reply.Volumes, volumeStub(v, p))
		}
		reply.Index, err = maxTableIndex(store, state.TableCSIVolumes, state.TableCSIPlugins)
		return err
	})
}

// Get returns one volume, without secrets; nil when unknown.
func (c *CSIVolume) Get(args *structs.CSIVolumeGetRequest, reply *structs.CSIVolumeGetResponse) error {
	if done, err := c.srv.forward("CSIVolume.Get", args, args, reply); done {
		return err
	}
	return c.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		v, err := store.CSIVolumeByID(ws, structs.DefaultNamespace, args.ID)
		if err != nil {
			return err
		}
		reply.Volume = nil
		if v == nil {
			reply.Index, err = store.Index(state.TableCSIVolumes)
			return err
		}
		reply.Volume = v.Sanitize()
		reply.Index = v.ModifyIndex
		return nil
	})
}

func volumeStub(v *structs.CSIVolume, p *structs.CSIPlugin) *structs.CSIVolListStub {
	s := &structs.CSIVolListStub{
		ID: v.ID, Namespace: v.Namespace, Name: v.Name, ExternalID: v.ExternalID,
		PluginID: v.PluginID, Provider: v.Provider, CreateIndex: v.CreateIndex, ModifyIndex: v.ModifyIndex,
	}
	if len(v.RequestedCapabilities) > 0 {
		s.AccessMode = v.RequestedCapabilities[0].AccessMode
		s.AttachmentMode = v.RequestedCapabilities[0].AttachmentMode
	}
	for _, cl := range v.Claims {
		if cl.Mode == structs.CSIVolumeClaimWrite {
			s.CurrentWriters++
		} else {
			s.CurrentReaders++
		}
	}
	if p != nil {
		s.Provider = p.Provider
		s.ControllerRequired = p.ControllerRequired
		s.ControllersHealthy, s.ControllersExpected = p.ControllersHealthy, p.ControllersExpected
		s.NodesHealthy, s.NodesExpected = p.NodesHealthy, p.NodesExpected
		s.Schedulable = p.NodesHealthy > 0 && (!p.ControllerRequired || p.ControllersHealthy > 0)
	}
	return s
}

// List returns plugin stubs; a blocking query.
func (c *CSIPlugin) List(args *structs.CSIPluginListRequest, reply *structs.CSIPluginListResponse) error {
	if done, err := c.srv.forward("CSIPlugin.List", args, args, reply); done {
		return err
	}
	return c.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		plugins, err := store.CSIPlugins(ws, args.Prefix)
		if err != nil {
			return err
		}
		reply.Plugins = make([]*structs.CSIPluginListStub, 0, len(plugins))
		for _, p := range plugins {
			reply.Plugins = append(reply.Plugins, &structs.CSIPluginListStub{
				ID: p.ID, Provider: p.Provider, ControllerRequired: p.ControllerRequired,
				ControllersHealthy: p.ControllersHealthy, ControllersExpected: p.ControllersExpected,
				NodesHealthy: p.NodesHealthy, NodesExpected: p.NodesExpected,
				CreateIndex: p.CreateIndex, ModifyIndex: p.ModifyIndex,
			})
		}
		reply.Index, err = store.Index(state.TableCSIPlugins)
		return err
	})
}

// Get returns one plugin; nil when unknown.
func (c *CSIPlugin) Get(args *structs.CSIPluginGetRequest, reply *structs.CSIPluginGetResponse) error {
	if done, err := c.srv.forward("CSIPlugin.Get", args, args, reply); done {
		return err
	}
	return c.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		p, err := store.CSIPluginByID(ws, args.ID)
		if err != nil {
			return err
		}
		reply.Plugin = p
		if p == nil {
			reply.Index, err = store.Index(state.TableCSIPlugins)
			return err
		}
		reply.Index = p.ModifyIndex
		return nil
	})
}

// claimHeld says what holds a claim that csiclaim.Releasable does not yet
// allow to release; "" when it may be released.
func claimHeld(store *state.StateStore, allocID string, cl *structs.CSIVolumeClaim) (string, error) {
	a, err := store.AllocByID(nil, allocID)
	if err != nil {
		return "", err
	}
	n, err := store.NodeByID(nil, cl.NodeID)
	if err != nil {
		return "", err
	}
	if csiclaim.Releasable(a, n) {
		return "", nil
	}
	return csiclaim.WhyHeld(a), nil
}

// Lanes returns the leader's controller lanes: depth, calls in flight and
// the latest calls' durations and timeouts per plugin. Always answered by
// the leader (a stale read is not allowed: only the leader has lanes) and
// never blocks.
func (c *CSIPlugin) Lanes(args *structs.CSILanesRequest, reply *structs.CSILanesResponse) error {
	args.AllowStale = false
	args.MinQueryIndex = 0
	if done, err := c.srv.forward("CSIPlugin.Lanes", args, args, reply); done {
		return err
	}
	lanes := c.srv.lanes.Load()
	if lanes == nil {
		return fmt.Errorf("csi lanes: leader duties not running: %w", structs.ErrNoLeader)
	}
	reply.Lanes = lanes.Stats()
	reply.Index = max(c.srv.raft.AppliedIndex(), 1)
	reply.KnownLeader = true
	return nil
}
