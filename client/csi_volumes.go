package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"

	"github.com/roamhq/roam/structs"
)

// CSIMountClaim is what the node needs from a volume claim to mount the
// volume: the volume (plugin, external ID, context, secrets, options) and
// the controller's publish context.
type CSIMountClaim struct {
	Volume *structs.CSIVolume
	// PublishContext is the controller publish's result (empty for plugins
	// without a controller).
	PublishContext map[string]string
	// AccessMode and AttachmentMode of the claim; empty means the group's
	// volume request's.
	AccessMode     string
	AttachmentMode string
}

// CSIClaimFunc claims a group's volume for an allocation from the servers
// and returns what mounting it needs. The servers' claim is where the
// controller attach happens.
type CSIClaimFunc func(ctx context.Context, alloc *structs.Allocation, req *structs.VolumeRequest) (*CSIMountClaim, error)

// CSIReleaseFunc tells the servers the allocation no longer uses a volume
// on this node (node unpublish done), so they may detach it.
type CSIReleaseFunc func(ctx context.Context, alloc *structs.Allocation, volumeID string) error

// csiVolumeManagerConfig configures a csiVolumeManager.
type csiVolumeManagerConfig struct {
	// DataDir is the client's data dir; mounts live under DataDir/csi.
	DataDir string
	Plugins *csiManager
	Claim   CSIClaimFunc
	// Release is optional.
	Release CSIReleaseFunc
	// PluginWait bounds how long a mount waits for the volume's node plugin
	// to register here (a plugin task starting with, or restored after, the
	// allocation that needs it). Zero means defaultCSIPluginWait.
	PluginWait time.Duration
	// NodeCallTimeout bounds each node plugin call, and the whole of a
	// server's NodeDetachVolume request. Zero means
	// defaultCSINodeCallTimeout.
	NodeCallTimeout time.Duration
	// Store keeps the record of what is mounted across a client restart;
	// nil keeps it in memory only.
	Store  csiMountStore
	Logger hclog.Logger
}

// csiMountStore is where a volume manager records its mounts (the
// client's state DB).
type csiMountStore interface {
	putCSIMount(allocID, name string, mnt *csiAllocMount) error
	deleteCSIMount(allocID, name string) error
	csiMounts() (map[string]map[string]*csiAllocMount, []error)
}

// defaultCSIPluginWait is PluginWait when unset.
const defaultCSIPluginWait = time.Minute

// defaultCSINodeCallTimeout is NodeCallTimeout when unset; the client
// config's default.
const defaultCSINodeCallTimeout = 50 * time.Second

// csiVolumeManager mounts CSI volumes for allocations: NodeStageVolume
// once per volume on the node (when the plugin asks for staging), then
// NodePublishVolume per allocation, and the reverse when allocations stop.
// Operations on one volume run one at a time; operations on different
// volumes, of one plugin or several, never wait for each other: no lock
// shared between volumes is held across a plugin call. Each plugin call
// is bounded by NodeCallTimeout, so a hung plugin holds a volume's turn
// for that long at most.
//
// Paths, under DataDir/csi/<plugin>/:
//
//	staging/<volume>              the volume's staging path
//	per-alloc/<alloc>/<volume>    an allocation's target path
//
// What is mounted is recorded in the Store, and a restarted client starts
// from that record: until a restored allocation's Remount re-establishes
// its volumes, the record is what keeps a servers' NodeDetachVolume for
// another allocation from unstaging a volume the restored one's tasks
// still use. A mount the record lacks (a Store write that failed),
// NodeDetachVolume rebuilds from the servers' IDs.
type csiVolumeManager struct {
	cfg    csiVolumeManagerConfig
	logger hclog.Logger

	// mu guards volumes and allocs, and each csiVolumeUse's refs.
	mu      sync.Mutex
	volumes map[string]*csiVolumeUse             // by plugin ID + "/" + volume ID
	allocs  map[string]map[string]*csiAllocMount // alloc ID → volume name → mount
}

var _ VolumeHook = (*csiVolumeManager)(nil)

// csiVolumeUse is one volume on this node. Holding sem is holding the
// volume: staged and users are guarded by it.
type csiVolumeUse struct {
	sem  chan struct{} // capacity 1
	refs int           // holders and waiters; guarded by csiVolumeManager.mu

	staged bool
	users  map[string]bool // alloc IDs it is published for
	// restored is set while the volume's users come from the Store's
	// record of an earlier client: whether it is staged is not known, so
	// its last user's unmount unstages it whatever staged says.
	restored bool
}

// csiAllocMount is one volume mounted for an allocation.
type csiAllocMount struct {
	PluginID   string
	VolumeID   string
	ExternalID string
	Target     string
}

func newCSIVolumeManager(cfg csiVolumeManagerConfig) *csiVolumeManager {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.PluginWait <= 0 {
		cfg.PluginWait = defaultCSIPluginWait
	}
	if cfg.NodeCallTimeout <= 0 {
		cfg.NodeCallTimeout = defaultCSINodeCallTimeout
	}
	m := &csiVolumeManager{
		cfg:     cfg,
		logger:  cfg.Logger.Named("csi_volumes"),
		volumes: map[string]*csiVolumeUse{},
		allocs:  map[string]map[string]*csiAllocMount{},
	}
	if cfg.Store != nil {
		m.restore()
	}
	return m
}

// restore starts from the Store's record of an earlier client's mounts.
func (m *csiVolumeManager) restore() {
	mounts, errs := m.cfg.Store.csiMounts()
	for _, err := range errs {
		m.logger.Error("skipping an unreadable record of mounted volumes", "error", err)
	}
	for allocID, byName := range mounts {
		for name, mnt := range byName {
			if mnt == nil {
				continue
			}
			if m.allocs[allocID] == nil {
				m.allocs[allocID] = map[string]*csiAllocMount{}
			}
			m.allocs[allocID][name] = mnt
			key := mnt.PluginID + "/" + mnt.VolumeID
			u := m.volumes[key]
			if u == nil {
				u = &csiVolumeUse{sem: make(chan struct{}, 1), users: map[string]bool{}}
				m.volumes[key] = u
			}
			u.users[allocID] = true
			u.restored = true
		}
	}
}

// recordMount keeps the manager's record of one mount, in memory and in
// the Store.
func (m *csiVolumeManager) recordMount(allocID, name string, mnt *csiAllocMount) {
	m.mu.Lock()
	if m.allocs[allocID] == nil {
		m.allocs[allocID] = map[string]*csiAllocMount{}
	}
	m.allocs[allocID][name] = mnt
	m.mu.Unlock()
	if m.cfg.Store != nil {
		if err := m.cfg.Store.putCSIMount(allocID, name, mnt); err != nil {
			m.logger.Error("failed to record a mounted volume", "alloc_id", allocID, "volume", name, "error", err)
		}
	}
}

// forgetMount drops the record of one mount.
func (m *csiVolumeManager) forgetMount(allocID, name string) {
	m.mu.Lock()
	delete(m.allocs[allocID], name)
	if len(m.allocs[allocID]) == 0 {
		delete(m.allocs, allocID)
	}
	m.mu.Unlock()
	if m.cfg.Store != nil {
		if err := m.cfg.Store.deleteCSIMount(allocID, name); err != nil {
			m.logger.Error("failed to forget a mounted volume", "alloc_id", allocID, "volume", name, "error", err)
		}
	}
}

// csiDir is DataDir/csi, beneath which every path of the manager's lies.
func (m *csiVolumeManager) csiDir() string { return filepath.Join(m.cfg.DataDir, "csi") }

// stagingPath is a volume's staging path. The IDs come from the servers;
// one that structs.ValidateID refuses is an error, never a path outside
// csiDir.
func (m *csiVolumeManager) stagingPath(pluginID, volumeID string) (string, error) {
	return idPath(m.csiDir(), idOf(structs.IDKindPlugin, pluginID), fixed("staging"), idOf(structs.IDKindVolume, volumeID))
}

// targetPath is an allocation's target path for a volume, under the same
// rule as stagingPath.
func (m *csiVolumeManager) targetPath(pluginID, allocID, volumeID string) (string, error) {
	return idPath(m.csiDir(), idOf(structs.IDKindPlugin, pluginID), fixed("per-alloc"),
		idOf(structs.IDKindAlloc, allocID), idOf(structs.IDKindVolume, volumeID))
}

// lock takes the volume for one operation; the returned func gives it back.
func (m *csiVolumeManager) lock(ctx context.Context, pluginID, volumeID string) (*csiVolumeUse, func(), error) {
	key := pluginID + "/" + volumeID
	m.mu.Lock()
	u := m.volumes[key]
	if u == nil {
		u = &csiVolumeUse{sem: make(chan struct{}, 1), users: map[string]bool{}}
		m.volumes[key] = u
	}
	u.refs++
	m.mu.Unlock()
	unref := func() {
		m.mu.Lock()
		u.refs--
		if u.refs == 0 && !u.staged && len(u.users) == 0 {
			delete(m.volumes, key)
		}
		m.mu.Unlock()
	}
	select {
	case u.sem <- struct{}{}:
	case <-ctx.Done():
		unref()
		// The other operation is a plugin call that has not finished yet:
		// as retryable as the call itself.
		return nil, nil, fmt.Errorf("%w: volume %s: waiting for another operation on it: %w",
			structs.ErrCSIUnavailable, volumeID, ctx.Err())
	}
	return u, func() {
		unref()
		<-u.sem
	}, nil
}

// callCtx bounds one node plugin call by NodeCallTimeout. A call past it
// ends with DEADLINE_EXCEEDED, which the CSI boundary turns into
// structs.ErrCSIUnavailable.
func (m *csiVolumeManager) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, m.cfg.NodeCallTimeout)
}

// Mount claims, stages and publishes each of the group's volumes and
// returns their target paths by name. On failure it releases what it
// mounted for the allocation.
func (m *csiVolumeManager) Mount(ctx context.Context, alloc *structs.Allocation, volumes map[string]*structs.VolumeRequest) (map[string]string, error) {
	paths := make(map[string]string, len(volumes))
	names := make([]string, 0, len(volumes))
	for name := range volumes {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		path, err := m.mountOne(ctx, alloc, name, volumes[name], false)
		if err != nil {
			// Undo with a context of our own: the caller's may be what
			// ended the mount.
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			if uerr := m.Unmount(uctx, alloc); uerr != nil {
				m.logger.Error("failed to release volumes after a failed mount", "alloc_id", alloc.ID, "error", uerr)
			}
			cancel()
			return nil, fmt.Errorf("volume %q: %w", name, err)
		}
		paths[name] = path
	}
	return paths, nil
}

// errClaimFailed marks a mount that failed at the claim: the claim function
// already retried what may pass, so what it returns is the servers' answer.
var errClaimFailed = errors.New("claim")

// Remount re-establishes the volumes of an allocation restored after the
// client restarted, whose tasks may still be running on them. Claim, stage
// and publish are idempotent, so it redoes them to rebuild what this
// manager knows. It tries again while the plugin is unavailable; a claim
// the servers refuse (the allocation was stopped meanwhile, say), a plugin
// that does not register within PluginWait, any other plugin error, or ctx
// ending stops it. Unlike Mount it never releases a claim: the tasks use
// the volumes.
func (m *csiVolumeManager) Remount(ctx context.Context, alloc *structs.Allocation, volumes map[string]*structs.VolumeRequest) (map[string]string, error) {
	paths := make(map[string]string, len(volumes))
	names := make([]string, 0, len(volumes))
	for name := range volumes {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		backoff := 100 * time.Millisecond
		for {
			path, err := m.mountOne(ctx, alloc, name, volumes[name], true)
			if err == nil {
				paths[name] = path
				break
			}
			// Only a plugin that could not be reached or did not finish is
			// tried again. The servers' answer, a plugin that did not come
			// back within PluginWait, or the plugin's own refusal ends it.
			if !errors.Is(err, structs.ErrCSIUnavailable) || ctx.Err() != nil {
				return nil, fmt.Errorf("volume %q: %w", name, err)
			}
			m.logger.Warn("could not re-establish a restored allocation's volume; retrying",
				"alloc_id", alloc.ID, "volume", name, "error", err)
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("volume %q: %w (last error: %w)", name, ctx.Err(), err)
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}
	return paths, nil
}

// waitNodePlugin returns the node plugin pluginID, waiting up to
// PluginWait for it to register: a plugin task may be starting alongside
// the allocation, or being restored after a client restart.
func (m *csiVolumeManager) waitNodePlugin(ctx context.Context, pluginID string) (*csiManagedPlugin, error) {
	deadline := time.Now().Add(m.cfg.PluginWait)
	backoff := 50 * time.Millisecond
	for {
		p, err := m.cfg.Plugins.nodePlugin(pluginID)
		if err == nil || !errors.Is(err, structs.ErrCSIPluginNotFound) {
			return p, err
		}
		if !time.Now().Before(deadline) {
			return nil, fmt.Errorf("waited %s: %w", m.cfg.PluginWait, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (waiting for: %w)", ctx.Err(), err)
		case <-time.After(min(backoff, time.Until(deadline))):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// mountOne claims, stages and publishes one volume for alloc. With
// keepClaim the claim is left in place when the mount fails (a restored
// allocation still uses it); otherwise it is released.
func (m *csiVolumeManager) mountOne(ctx context.Context, alloc *structs.Allocation, name string, req *structs.VolumeRequest, keepClaim bool) (path string, err error) {
	if m.cfg.Claim == nil {
		return "", errors.New("csi volumes: no way to claim volumes on this client")
	}
	claim, err := m.cfg.Claim(ctx, alloc, req)
	if err != nil {
		return "", fmt.Errorf("%w: %w", errClaimFailed, err)
	}
	vol := claim.Volume
	if vol == nil {
		return "", errors.New("claim returned no volume")
	}
	// nodeDirty is set when a failed mount leaves the volume staged here:
	// releasing then would tell the servers the node let go of it.
	nodeDirty := false
	defer func() {
		// A claim whose mount failed is not recorded, so Unmount will not
		// release it: release it here rather than leave it to the servers'
		// volume watcher, unless the node still holds the volume.
		if err != nil && !keepClaim && !nodeDirty && m.cfg.Release != nil {
			if rerr := m.cfg.Release(ctx, alloc, vol.ID); rerr != nil {
				m.logger.Warn("could not release the claim of a failed mount", "volume_id", vol.ID, "error", rerr)
			}
		}
	}()
	// Both paths are built before any plugin call: IDs that could not
	// name a directory here fail the mount (releasing the claim) with
	// nothing created and nothing asked of the plugin.
	staging, err := m.stagingPath(vol.PluginID, vol.ID)
	if err != nil {
		return "", err
	}
	target, err := m.targetPath(vol.PluginID, alloc.ID, vol.ID)
	if err != nil {
		return "", err
	}
	p, err := m.waitNodePlugin(ctx, vol.PluginID)
	if err != nil {
		return "", err
	}
	access, attach := claim.AccessMode, claim.AttachmentMode
	if access == "" {
		access = req.AccessMode
	}
	if attach == "" {
		attach = req.AttachmentMode
	}
	opts := req.MountOptions
	if opts == nil {
		opts = vol.MountOptions
	}
	vc, err := csiVolumeCapability(access, attach, opts)
	if err != nil {
		return "", err
	}
	cctx, cancel := m.callCtx(ctx)
	caps, err := p.client.NodeGetCapabilities(cctx)
	cancel()
	if err != nil {
		return "", err
	}
	stage := nodeRequiresStage(caps)

	u, unlock, err := m.lock(ctx, vol.PluginID, vol.ID)
	if err != nil {
		return "", err
	}
	defer unlock()

	if !stage {
		staging = "" // the plugin stages nothing: it is sent no staging path
	} else {
		if !u.staged {
			if err := mkdirAllIn(m.csiDir(), staging, 0o700); err != nil {
				return "", fmt.Errorf("create staging dir: %w", err)
			}
			cctx, cancel := m.callCtx(ctx)
			_, err := p.client.NodeStageVolume(cctx, &csi.NodeStageVolumeRequest{
				VolumeId:          vol.ExternalID,
				PublishContext:    claim.PublishContext,
				StagingTargetPath: staging,
				VolumeCapability:  vc,
				Secrets:           vol.Secrets,
				VolumeContext:     vol.Context,
			})
			cancel()
			if err != nil {
				return "", err
			}
			u.staged = true
			m.logger.Debug("staged volume", "volume_id", vol.ID, "plugin_id", vol.PluginID)
		}
	}

	// The plugin creates the target itself; its parent is ours.
	if err := mkdirAllIn(m.csiDir(), filepath.Dir(target), 0o700); err != nil {
		return "", fmt.Errorf("create alloc mount dir: %w", err)
	}
	cctx, cancel = m.callCtx(ctx)
	_, err = p.client.NodePublishVolume(cctx, &csi.NodePublishVolumeRequest{
		VolumeId:          vol.ExternalID,
		PublishContext:    claim.PublishContext,
		StagingTargetPath: staging,
		TargetPath:        target,
		VolumeCapability:  vc,
		Readonly:          req.ReadOnly,
		Secrets:           vol.Secrets,
		VolumeContext:     vol.Context,
	})
	cancel()
	if err != nil {
		if len(u.users) == 0 && u.staged && !keepClaim {
			// Staged with no user: unstage it before the claim goes.
			cctx, cancel := m.callCtx(ctx)
			_, uerr := p.client.NodeUnstageVolume(cctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.ExternalID, StagingTargetPath: staging})
			cancel()
			if uerr != nil && !errors.Is(uerr, structs.ErrCSINotFound) {
				// Leave the claim to the servers: their node detach
				// unstages it before the controller lets go.
				nodeDirty = true
				m.logger.Warn("could not unstage the volume of a failed mount; the servers will detach it",
					"volume_id", vol.ID, "error", uerr)
			} else {
				u.staged = false
			}
		}
		return "", err
	}
	u.users[alloc.ID] = true
	m.recordMount(alloc.ID, name, &csiAllocMount{PluginID: vol.PluginID, VolumeID: vol.ID, ExternalID: vol.ExternalID, Target: target})
	m.logger.Debug("published volume", "volume_id", vol.ID, "alloc_id", alloc.ID, "target", target)
	return target, nil
}

// Unmount unpublishes each of the allocation's volumes and unstages those
// no other allocation here uses. Volumes it could not release stay
// recorded, so a second Unmount retries them.
func (m *csiVolumeManager) Unmount(ctx context.Context, alloc *structs.Allocation) error {
	m.mu.Lock()
	mounts := m.allocs[alloc.ID]
	names := make([]string, 0, len(mounts))
	for name := range mounts {
		names = append(names, name)
	}
	m.mu.Unlock()
	slices.Sort(names)

	var errs []error
	for _, name := range names {
		mnt := mounts[name]
		if err := m.unmountOne(ctx, alloc.ID, mnt, false); err != nil {
			errs = append(errs, fmt.Errorf("volume %q: %w", name, err))
			continue
		}
		m.forgetMount(alloc.ID, name)
		if m.cfg.Release != nil {
			if err := m.cfg.Release(ctx, alloc, mnt.VolumeID); err != nil {
				errs = append(errs, fmt.Errorf("volume %q: release claim: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// unmountOne unpublishes mnt for allocID and unstages the volume if that
// was its last user. NOT_FOUND from the plugin means already done. With
// unknown set, the manager has no record of the mount (the client
// restarted), so the volume is unstaged if nothing here uses it.
func (m *csiVolumeManager) unmountOne(ctx context.Context, allocID string, mnt *csiAllocMount, unknown bool) error {
	p, err := m.cfg.Plugins.nodePlugin(mnt.PluginID)
	if err != nil {
		return err
	}
	u, unlock, err := m.lock(ctx, mnt.PluginID, mnt.VolumeID)
	if err != nil {
		return err
	}
	defer unlock()

	cctx, cancel := m.callCtx(ctx)
	_, err = p.client.NodeUnpublishVolume(cctx, &csi.NodeUnpublishVolumeRequest{VolumeId: mnt.ExternalID, TargetPath: mnt.Target})
	cancel()
	if err != nil && !errors.Is(err, structs.ErrCSINotFound) {
		return err
	}
	delete(u.users, allocID)
	if len(u.users) > 0 || (!u.staged && !unknown && !u.restored) {
		return nil
	}
	cctx, cancel = m.callCtx(ctx)
	caps, err := p.client.NodeGetCapabilities(cctx)
	cancel()
	if err != nil {
		return err
	}
	if !nodeRequiresStage(caps) {
		u.staged, u.restored = false, false
		return nil
	}
	staging, err := m.stagingPath(mnt.PluginID, mnt.VolumeID)
	if err != nil {
		return err
	}
	cctx, cancel = m.callCtx(ctx)
	_, err = p.client.NodeUnstageVolume(cctx, &csi.NodeUnstageVolumeRequest{
		VolumeId:          mnt.ExternalID,
		StagingTargetPath: staging,
	})
	cancel()
	if err != nil && !errors.Is(err, structs.ErrCSINotFound) {
		return err
	}
	u.staged, u.restored = false, false
	m.logger.Debug("unstaged volume", "volume_id", mnt.VolumeID, "plugin_id", mnt.PluginID)
	return nil
}

// detach serves ClientCSI.NodeDetachVolume. The whole request, waiting
// for the volume's turn included, is bounded by NodeCallTimeout: the
// server that asked waits a little longer than that, so it gets this
// client's answer, and a hung plugin makes it an error wrapping
// structs.ErrCSIUnavailable (not done, may be retried) rather than a call
// that never returns.
func (m *csiVolumeManager) detach(ctx context.Context, args *structs.ClientCSINodeDetachVolumeRequest) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.NodeCallTimeout)
	defer cancel()
	var (
		mnt  *csiAllocMount
		name string
	)
	m.mu.Lock()
	for n, x := range m.allocs[args.AllocID] {
		if x.PluginID == args.PluginID && x.VolumeID == args.VolumeID {
			mnt, name = x, n
		}
	}
	m.mu.Unlock()
	unknown := mnt == nil
	if unknown {
		// Rebuilt from the server's IDs: refused, before the plugin is
		// asked to unpublish or unstage anything, unless each is one
		// plain name beneath csiDir.
		target, err := m.targetPath(args.PluginID, args.AllocID, args.VolumeID)
		if err != nil {
			return err
		}
		mnt = &csiAllocMount{
			PluginID:   args.PluginID,
			VolumeID:   args.VolumeID,
			ExternalID: args.ExternalID,
			Target:     target,
		}
	}
	if err := m.unmountOne(ctx, args.AllocID, mnt, unknown); err != nil {
		return err
	}
	if !unknown {
		m.forgetMount(args.AllocID, name)
	}
	return nil
}

// users returns, sorted, the allocations that have the volume published
// here (recorded mounts, and holders of the volume's turn), and whether it
// is staged. A volume whose turn another operation holds right now
// (a mount or unmount in progress) counts as used.
func (m *csiVolumeManager) users(pluginID, volumeID string) (allocIDs []string, staged bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	for allocID, mounts := range m.allocs {
		for _, mnt := range mounts {
			if mnt.PluginID == pluginID && mnt.VolumeID == volumeID {
				seen[allocID] = true
			}
		}
	}
	if u := m.volumes[pluginID+"/"+volumeID]; u != nil {
		// users and staged are guarded by the volume's turn, not by mu;
		// a busy turn is reported as staged rather than read under a race.
		select {
		case u.sem <- struct{}{}:
			staged = u.staged
			for id := range u.users {
				seen[id] = true
			}
			<-u.sem
		default:
			staged = true
		}
	}
	return slices.Sorted(maps.Keys(seen)), staged
}
