package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/internal/upgrade"
	"github.com/roamhq/roam/structs"
)

// csiFingerprintTimeout bounds each fingerprint, so a hung plugin is
// reported unhealthy instead of stalling its loop.
const csiFingerprintTimeout = 10 * time.Second

// errCSIManagerShutdown is returned by calls made after the manager stopped.
var errCSIManagerShutdown = errors.New("csi plugin manager shut down")

// csiManagerConfig configures a csiManager.
type csiManagerConfig struct {
	// FingerprintInterval is the time between fingerprints of a plugin.
	FingerprintInterval time.Duration
	// ControllerCallTimeout bounds each controller call on its lane.
	ControllerCallTimeout time.Duration
	// OnChange is called, without locks held, after a fingerprint changed
	// what the node reports (health, capabilities, node info) or a plugin
	// was removed. The client re-registers at once.
	OnChange func()
	Logger   hclog.Logger
	// LeaderTerm is the highest controller-call leader term seen before
	// this manager started (read back from the state DB), and SaveTerm
	// records a new one; nil keeps it in memory only. A restarted client
	// must still refuse the calls its earlier self would have.
	LeaderTerm uint64
	SaveTerm   func(uint64) error
	// Lease, when set, says until when a leader's controller call may
	// run here: the moment before which the servers cannot have declared
	// this node down (see Client.controllerLease). The zero time means
	// not known, and calls are not bounded by it.
	Lease func() time.Time
	// Renew, when set, heartbeats now and returns once the servers
	// answered (the lease then runs from the heartbeat's send) or ctx
	// ended. A leader's call can come before the heartbeat loop's next
	// turn: after a leader change the new leader calls as soon as it has
	// taken over, while this client's heartbeats to the old one have been
	// failing and its lease is close to its end.
	Renew func(ctx context.Context) error
}

// leaseRenewAhead is how long before its lease ends a leader's call has
// this client heartbeat at once (csiManagerConfig.Renew), and the most a
// call waits for that heartbeat before its turn.
const leaseRenewAhead = time.Second

// leaseRetry is how often a call near its lease's end tries to renew it
// again, until it renews or the lease ends.
const leaseRetry = 200 * time.Millisecond

// csiManager keeps the CSI plugins this client talks to: it fingerprints
// each one, holds what the node reports about them, and owns each plugin's
// controller lane.
type csiManager struct {
	cfg    csiManagerConfig
	logger hclog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// leaderTerm is the highest leader term seen on a controller call or
	// a heartbeat answer (see admitTerm); saveMu orders its saves.
	leaderTerm atomic.Uint64
	saveMu     sync.Mutex
	// minServer is the oldest server build the last heartbeat answer
	// reported ("" from older leaders): once it has
	// upgrade.LaneTermRequired, destructive calls without a term are
	// refused (see admitTerm).
	minServer atomic.Pointer[string]

	// mu guards plugins and closed.
	mu      sync.Mutex
	plugins map[string]*csiManagedPlugin
	closed  bool
}

// csiManagedPlugin is one plugin: its connection, lane and latest
// fingerprint.
type csiManagedPlugin struct {
	cfg    CSIPluginConfig
	client *csiPluginClient
	lane   *csiLane // nil unless the plugin serves the controller here
	cancel context.CancelFunc
	done   chan struct{} // closed when the fingerprint loop has returned

	// mu guards the fingerprint below.
	mu         sync.Mutex
	controller *structs.CSIInfo
	node       *structs.CSIInfo
}

func newCSIManager(cfg csiManagerConfig) *csiManager {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.OnChange == nil {
		cfg.OnChange = func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &csiManager{
		cfg:     cfg,
		logger:  cfg.Logger.Named("csi"),
		ctx:     ctx,
		cancel:  cancel,
		plugins: map[string]*csiManagedPlugin{},
	}
	m.leaderTerm.Store(cfg.LeaderTerm)
	return m
}

// AddPlugin starts managing a plugin: it is fingerprinted at once and then
// every FingerprintInterval. Configured plugins come through here, and
// so do plugins started by tasks (csi_plugin_task.go). A plugin ID may be added once.
func (m *csiManager) AddPlugin(cfg *CSIPluginConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	client, err := dialCSIPlugin(cfg.Socket)
	if err != nil {
		return fmt.Errorf("csi plugin %q: %w", cfg.ID, err)
	}
	ctx, cancel := context.WithCancel(m.ctx)
	p := &csiManagedPlugin{
		cfg:    *cfg,
		client: client,
		cancel: cancel,
		done:   make(chan struct{}),
	}
	logger := m.logger.With("plugin_id", cfg.ID)
	if cfg.hasController() {
		p.lane = newCSILane(logger, func() int { return m.laneLimit(&p.cfg) })
	}

	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		cancel()
		_ = client.close()
		return errCSIManagerShutdown
	}
	if _, ok := m.plugins[cfg.ID]; ok {
		m.mu.Unlock()
		cancel()
		_ = client.close()
		return fmt.Errorf("csi plugin %q is already managed", cfg.ID)
	}
	m.plugins[cfg.ID] = p
	// Counted under mu: shutdown, which sets closed under mu, cannot have
	// started waiting yet.
	m.wg.Add(1)
	if p.lane != nil {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			p.lane.run(ctx)
		}()
	}
	m.mu.Unlock()

	go func() {
		defer m.wg.Done()
		defer close(p.done)
		m.fingerprintLoop(ctx, p, logger)
	}()
	logger.Info("managing csi plugin", "type", cfg.Type, "socket", cfg.Socket)
	return nil
}

// RemovePlugin stops managing a plugin. A controller call already running
// on its lane finishes first; queued ones fail with ErrCSIPluginNotFound.
func (m *csiManager) RemovePlugin(id string) error {
	m.mu.Lock()
	p, ok := m.plugins[id]
	delete(m.plugins, id)
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q", structs.ErrCSIPluginNotFound, id)
	}
	p.cancel()
	<-p.done
	if p.lane != nil {
		<-p.lane.stopped
	}
	err := p.client.close()
	m.cfg.OnChange()
	if err != nil {
		return fmt.Errorf("csi plugin %q: close: %w", id, err)
	}
	return nil
}

// plugin returns the managed plugin with id, or an error wrapping
// ErrCSIPluginNotFound.
func (m *csiManager) plugin(id string) (*csiManagedPlugin, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errCSIManagerShutdown
	}
	p, ok := m.plugins[id]
	if !ok {
		return nil, fmt.Errorf("%w: %q", structs.ErrCSIPluginNotFound, id)
	}
	return p, nil
}

// controllerPlugin returns a plugin that serves the controller service.
func (m *csiManager) controllerPlugin(id string) (*csiManagedPlugin, error) {
	p, err := m.plugin(id)
	if err != nil {
		return nil, err
	}
	if p.lane == nil {
		return nil, fmt.Errorf("%w: %q has no controller here (type %s)", structs.ErrCSIPluginNotFound, id, p.cfg.Type)
	}
	return p, nil
}

// nodePlugin returns a plugin that serves the node service.
func (m *csiManager) nodePlugin(id string) (*csiManagedPlugin, error) {
	p, err := m.plugin(id)
	if err != nil {
		return nil, err
	}
	if !p.cfg.hasNode() {
		return nil, fmt.Errorf("%w: %q has no node service here (type %s)", structs.ErrCSIPluginNotFound, id, p.cfg.Type)
	}
	return p, nil
}

// controllerCall runs fn on the plugin's controller lane: after every call
// queued before it, with a context the caller's cancellation does not cut
// and bounded by ControllerCallTimeout. A caller that gives up gets its
// context's error, while a call already started finishes on the client
// before the next one for the plugin starts.
//
// q is the sender's: a call from a leader term (q.LeaderTerm) below the
// highest seen is refused, when it arrives and again when its turn comes
// (see admitTerm); one whose turn comes after q.StartWithin is refused
// unrun; q.Timeout, when set, bounds the call if it is below
// ControllerCallTimeout.
//
// key is the volume, and for publish and unpublish the node, that no other
// call of the lane may act on at once (a lane of several; see csiLane).
// reply, when not nil, gets what the lane says of the calls before this
// one.
func (m *csiManager) controllerCall(ctx context.Context, pluginID, method string, q structs.CSIControllerQuery, key laneadmit.Call,
	reply *structs.CSIControllerReply, fn func(context.Context, *csiPluginClient) error) error {
	p, err := m.controllerPlugin(pluginID)
	if err != nil {
		return err
	}
	term := q.LeaderTerm
	if err := m.admitTerm(pluginID, method, term); err != nil {
		return err
	}
	b := laneBounds{timeout: m.cfg.ControllerCallTimeout, startWithin: max(q.StartWithin, 0)}
	if q.Timeout > 0 && q.Timeout < b.timeout {
		b.timeout = q.Timeout
	}
	busyBefore, err := p.lane.do(ctx, method, key, b, func(ctx context.Context) error {
		if err := m.admitTerm(pluginID, method, term); err != nil {
			return err
		}
		// A plugin that has stopped (its task is going, and the servers
		// have not heard yet) is reported as absent, not as an answer: the
		// call never reached it, so the servers may try the next
		// controller without two calls meeting at the provider.
		if _, err := os.Stat(csiSocketPath(p.cfg.Socket)); errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: %q: its socket %s is gone (the plugin stopped)", structs.ErrCSIPluginNotFound, pluginID, p.cfg.Socket)
		}
		if term != 0 {
			leased, stop, err := m.leased(ctx, pluginID, method)
			if err != nil {
				return err
			}
			defer stop()
			ctx = leased
		}
		err := fn(ctx, p.client)
		// A call that returned success as the lease lapsed did finish:
		// its answer stands.
		if err != nil && errors.Is(context.Cause(ctx), errLeaseLapsed) {
			return fmt.Errorf("csi %s for plugin %q: %w: cancelled at the plugin: %w; the plugin may have done part of it",
				method, pluginID, structs.ErrOutcomeUnknown, context.Cause(ctx))
		}
		if errors.Is(err, structs.ErrCSIUnavailable) && strings.Contains(err.Error(), "Error while dialing") {
			return fmt.Errorf("%w: %q: could not connect to it: %v", structs.ErrCSIPluginNotFound, pluginID, err)
		}
		if term != 0 && connectionBroke(err) {
			// Sent, and then the plugin went (killed, crashed): it may
			// have done all or part of the call. Reported as "did not
			// run", the servers would try another controller while the
			// provider may still finish this one.
			return fmt.Errorf("csi %s for plugin %q: %w: the plugin's connection broke during the call: %v",
				method, pluginID, structs.ErrOutcomeUnknown, err)
		}
		return err
	})
	if reply != nil {
		reply.LaneBusyBefore = busyBefore
	}
	return err
}

// laneLimit is how many calls a plugin's lane may run at once: its
// controller_concurrency once every server understands concurrent lanes
// (upgrade.ControllerConcurrency), one until then.
func (m *csiManager) laneLimit(cfg *CSIPluginConfig) int {
	min, err := upgrade.Parse(m.MinServerVersion())
	if err != nil || !upgrade.ControllerConcurrency.Enabled(min) {
		return 1
	}
	return cfg.concurrency()
}

// connectionBroke reports whether err is gRPC's UNAVAILABLE for a
// connection that broke after the call was sent, as opposed to a dial
// that failed (nothing sent) or a plugin that answered UNAVAILABLE itself.
// gRPC gives the two transport cases the same code; only its messages
// tell them apart.
func connectionBroke(err error) bool {
	if !errors.Is(err, structs.ErrCSIUnavailable) {
		return false
	}
	msg := err.Error()
	for _, s := range []string{"error reading from server", "transport is closing", "connection reset by peer", "broken pipe"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// errLeaseLapsed is the cause of a leader's controller call cancelled, or
// refused, because this client has not reached a server for so long that
// the servers may declare its node down.
var errLeaseLapsed = errors.New("no server reached for as long as the servers wait before declaring this node down")

// leased bounds a leader's controller call by this client's lease (see
// csiManagerConfig.Lease). A node the servers declare down lifts the
// fence that keeps the plugin's calls on it (see structs.CSIControllerFence),
// and the next leader may then call another node's controller. A call
// still running here would meet that one at the provider, so it is
// cancelled before the lease lapses: each heartbeat that gets through
// extends the lease, and only a client cut off from every server reaches
// its end. A call whose turn comes with the lease already lapsed is not
// run at all. stop must be called once the call returns.
func (m *csiManager) leased(ctx context.Context, pluginID, method string) (context.Context, func(), error) {
	if m.cfg.Lease == nil {
		return ctx, func() {}, nil
	}
	until := m.cfg.Lease()
	if until.IsZero() {
		return ctx, func() {}, nil
	}
	if time.Until(until) <= leaseRenewAhead {
		// The call has not started: it can wait a moment for a heartbeat.
		until = m.renew(ctx, time.Now().Add(leaseRenewAhead))
	}
	if until.IsZero() {
		return ctx, func() {}, nil
	}
	if !time.Now().Before(until) {
		return nil, nil, fmt.Errorf("csi %s for plugin %q: %w: %w; not run", method, pluginID, structs.ErrCSIUnavailable, errLeaseLapsed)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	var (
		mu      sync.Mutex
		stopped bool
		timer   *time.Timer
	)
	// check runs on the timer: it renews the lease when its end is near,
	// and cancels the call when it has come.
	check := func() {
		until := m.cfg.Lease()
		if d := time.Until(until); !until.IsZero() && d > 0 && d <= leaseRenewAhead {
			// Renewed while the call runs, bounded by the lease itself.
			until = m.renew(ctx, until)
		}
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		d := time.Until(until)
		switch {
		case until.IsZero():
			return // no longer known: not bounded
		case d > leaseRenewAhead:
			timer.Reset(d - leaseRenewAhead) // a heartbeat got through: the lease goes on
			return
		case d > 0:
			timer.Reset(min(d, leaseRetry))
			return
		}
		m.logger.Warn("cancelling a controller call: the servers may declare this node down and call another controller",
			"plugin_id", pluginID, "method", method)
		cancel(errLeaseLapsed)
	}
	mu.Lock()
	timer = time.AfterFunc(max(time.Until(until)-leaseRenewAhead, 0), check)
	mu.Unlock()
	return ctx, func() {
		mu.Lock()
		stopped = true
		timer.Stop()
		mu.Unlock()
		cancel(nil)
	}, nil
}

// renew heartbeats (csiManagerConfig.Renew) and waits for the answer until
// deadline at the latest, then returns the lease as it stands.
func (m *csiManager) renew(ctx context.Context, deadline time.Time) time.Time {
	if m.cfg.Renew != nil {
		rctx, cancel := context.WithDeadline(ctx, deadline)
		err := m.cfg.Renew(rctx)
		cancel()
		if err != nil {
			m.logger.Debug("could not renew the controller lease", "error", err)
		}
	}
	return m.cfg.Lease()
}

// admitTerm checks a controller call's leader term against the highest one
// this client has seen (on a call, or in a heartbeat answer), and raises
// that to term. Once a leader's call or answer has reached this client,
// every earlier leader is deposed: a call of theirs
// that arrives now was held on the way, and the new leader, having had its
// own call answered here, may already be calling another node's
// controller for the plugin. Running it could put two destructive calls at
// the provider at once, so it is refused, unrun. A call without a term
// (zero: a read from outside a leader's lane) is not checked.
func (m *csiManager) admitTerm(pluginID, method string, term uint64) error {
	if term == 0 {
		return termlessAdmitted(pluginID, method, m.MinServerVersion())
	}
	m.learnTerm(term)
	if seen := m.leaderTerm.Load(); term < seen {
		return fmt.Errorf("%w: csi %s for plugin %q sent in leader term %d, but this client has heard from term %d; not run",
			structs.ErrStaleLeaderTerm, method, pluginID, term, seen)
	}
	return nil
}

// learnTerm raises the highest leader term seen to term: controller calls
// of earlier terms are refused from now on.
func (m *csiManager) learnTerm(term uint64) {
	for {
		seen := m.leaderTerm.Load()
		if term <= seen {
			return
		}
		if m.leaderTerm.CompareAndSwap(seen, term) {
			m.saveTerm()
			return
		}
	}
}

// LeaderTerm is the highest leader term seen; heartbeats report it.
func (m *csiManager) LeaderTerm() uint64 { return m.leaderTerm.Load() }

// resetTerm replaces the leader term seen with term, if it is still from:
// the leader that answered a heartbeat which reported from has verified
// that it leads, in a lower term, so from cannot be its cluster's (a leader
// of a later term would have deposed it): it is another Raft cluster's,
// one whose servers were rebuilt and restored from a snapshot, which
// starts its terms again. Without the reset every controller call of the
// rebuilt cluster would be refused. If the term moved meanwhile (a call
// came from a newer leader), the reset no longer applies.
func (m *csiManager) resetTerm(from, term uint64) {
	if term >= from || !m.leaderTerm.CompareAndSwap(from, term) {
		return
	}
	m.logger.Warn("the leader verified that it leads in a term below the one this client remembers: the servers were rebuilt; starting from their term",
		"remembered_term", from, "leader_term", term)
	m.saveTerm()
}

// saveTerm records the term now seen, if the manager was given a store.
func (m *csiManager) saveTerm() {
	if m.cfg.SaveTerm == nil {
		return
	}
	m.saveMu.Lock()
	defer m.saveMu.Unlock()
	if err := m.cfg.SaveTerm(m.leaderTerm.Load()); err != nil {
		m.logger.Error("could not record the controller calls' leader term; a restart forgets it", "error", err)
	}
}

// Infos returns copies of the controller and node fingerprints by plugin
// ID, for the node the client registers.
func (m *csiManager) Infos() (controllers, nodes map[string]*structs.CSIInfo) {
	m.mu.Lock()
	plugins := make([]*csiManagedPlugin, 0, len(m.plugins))
	for _, p := range m.plugins {
		plugins = append(plugins, p)
	}
	m.mu.Unlock()
	controllers = map[string]*structs.CSIInfo{}
	nodes = map[string]*structs.CSIInfo{}
	for _, p := range plugins {
		p.mu.Lock()
		if p.controller != nil {
			controllers[p.cfg.ID] = copyCSIInfo(p.controller)
		}
		if p.node != nil {
			nodes[p.cfg.ID] = copyCSIInfo(p.node)
		}
		p.mu.Unlock()
	}
	return controllers, nodes
}

func (m *csiManager) fingerprintLoop(ctx context.Context, p *csiManagedPlugin, logger hclog.Logger) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if m.fingerprint(ctx, p, logger) && ctx.Err() == nil {
			m.cfg.OnChange()
		}
		t.Reset(m.cfg.FingerprintInterval)
	}
}

// fingerprint asks the plugin who it is and what it can do, stores the
// result and reports whether it changed anything the servers see.
func (m *csiManager) fingerprint(ctx context.Context, p *csiManagedPlugin, logger hclog.Logger) bool {
	ctx, cancel := context.WithTimeout(ctx, csiFingerprintTimeout)
	defer cancel()

	base := &structs.CSIInfo{PluginID: p.cfg.ID, AllocID: p.cfg.AllocID, UpdateTime: time.Now()}
	err := func() error {
		info, err := p.client.GetPluginInfo(ctx)
		if err != nil {
			return err
		}
		base.Provider, base.ProviderVersion = info.GetName(), info.GetVendorVersion()
		caps, err := p.client.GetPluginCapabilities(ctx)
		if err != nil {
			return err
		}
		base.RequiresControllerPlugin = requiresController(caps)
		ready, err := p.client.Probe(ctx)
		if err != nil {
			return err
		}
		if !ready {
			return errors.New("plugin probe: not ready")
		}
		return nil
	}()

	var ctrl, node *structs.CSIInfo
	if p.cfg.hasController() {
		ctrl = copyCSIInfo(base)
		ctrl.ControllerConcurrency = p.cfg.concurrency()
		cerr := err
		if cerr == nil {
			var resp *csi.ControllerGetCapabilitiesResponse
			resp, cerr = p.client.ControllerGetCapabilities(ctx)
			if cerr == nil {
				ctrl.ControllerInfo = csiControllerInfo(resp)
			}
		}
		setHealth(ctrl, cerr)
	}
	if p.cfg.hasNode() {
		node = copyCSIInfo(base)
		nerr := err
		if nerr == nil {
			var info *structs.CSINodeInfo
			info, nerr = fetchNodeInfo(ctx, p.client)
			if nerr == nil {
				node.NodeInfo = info
			}
		}
		setHealth(node, nerr)
	}

	p.mu.Lock()
	changed := csiInfoChanged(p.controller, ctrl) || csiInfoChanged(p.node, node)
	// An unhealthy plugin keeps its last known description: what it was is
	// still the best account of what it is.
	keepKnown(ctrl, p.controller)
	keepKnown(node, p.node)
	p.controller, p.node = ctrl, node
	p.mu.Unlock()

	if changed {
		if err := errors.Join(healthErr(ctrl), healthErr(node)); err != nil {
			logger.Warn("csi plugin unhealthy", "error", err)
		} else {
			logger.Info("csi plugin healthy")
		}
	}
	return changed
}

func fetchNodeInfo(ctx context.Context, c *csiPluginClient) (*structs.CSINodeInfo, error) {
	info, err := c.NodeGetInfo(ctx)
	if err != nil {
		return nil, err
	}
	caps, err := c.NodeGetCapabilities(ctx)
	if err != nil {
		return nil, err
	}
	out := &structs.CSINodeInfo{
		ID:                      info.GetNodeId(),
		MaxVolumes:              info.GetMaxVolumesPerNode(),
		RequiresNodeStageVolume: nodeRequiresStage(caps),
	}
	if segs := info.GetAccessibleTopology().GetSegments(); len(segs) > 0 {
		out.AccessibleTopology = &structs.CSITopology{Segments: segs}
	}
	return out, nil
}

func setHealth(info *structs.CSIInfo, err error) {
	if err != nil {
		info.Healthy = false
		info.HealthDescription = err.Error()
		return
	}
	info.Healthy = true
	info.HealthDescription = "healthy"
}

func healthErr(info *structs.CSIInfo) error {
	if info == nil || info.Healthy {
		return nil
	}
	return errors.New(info.HealthDescription)
}

// keepKnown fills what a failed fingerprint could not learn from the last
// one.
func keepKnown(next, prev *structs.CSIInfo) {
	if next == nil || prev == nil || next.Healthy {
		return
	}
	if next.Provider == "" {
		next.Provider, next.ProviderVersion = prev.Provider, prev.ProviderVersion
		next.RequiresControllerPlugin = prev.RequiresControllerPlugin
	}
	if next.ControllerInfo == nil {
		next.ControllerInfo = prev.ControllerInfo
	}
	if next.NodeInfo == nil {
		next.NodeInfo = prev.NodeInfo
	}
}

// csiInfoChanged reports whether next differs from prev in anything but
// the update time and the wording of its health description.
func csiInfoChanged(prev, next *structs.CSIInfo) bool {
	if prev == nil || next == nil {
		return prev != next
	}
	if prev.Healthy != next.Healthy {
		return true
	}
	if !next.Healthy {
		// An unhealthy fingerprint keeps the old description; only its
		// health is news.
		return false
	}
	a, b := *prev, *next
	a.UpdateTime, b.UpdateTime = time.Time{}, time.Time{}
	a.HealthDescription, b.HealthDescription = "", ""
	return !reflect.DeepEqual(a, b)
}

func copyCSIInfo(i *structs.CSIInfo) *structs.CSIInfo {
	if i == nil {
		return nil
	}
	c := *i
	if i.ControllerInfo != nil {
		x := *i.ControllerInfo
		c.ControllerInfo = &x
	}
	if i.NodeInfo != nil {
		x := *i.NodeInfo
		c.NodeInfo = &x
	}
	return &c
}

// shutdown stops fingerprinting, fails queued controller calls and waits,
// up to ctx, for calls already running on a lane. Safe to call twice.
func (m *csiManager) shutdown(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true
	// Taken, so that RemovePlugin and a second shutdown close nothing twice.
	plugins := m.plugins
	m.plugins = map[string]*csiManagedPlugin{}
	m.mu.Unlock()
	m.cancel()

	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("csi plugin manager shutdown: %w", ctx.Err())
	}
	var errs []error
	for id, p := range plugins {
		if err := p.client.close(); err != nil {
			errs = append(errs, fmt.Errorf("csi plugin %q: close: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// SetMinServerVersion records the oldest server build a heartbeat answer
// reported, and logs when it changes.
func (m *csiManager) SetMinServerVersion(v string) {
	if old := m.minServer.Swap(&v); old != nil && *old == v {
		return
	}
	min, err := upgrade.Parse(v)
	m.logger.Info("the servers' oldest build changed", "min_server_version", v,
		"lane_term_required", err == nil && upgrade.LaneTermRequired.Enabled(min),
		"controller_concurrency", err == nil && upgrade.ControllerConcurrency.Enabled(min))
	// A lane's limit may have changed: let each look at its queue again.
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.plugins {
		if p.lane != nil {
			p.lane.poke()
		}
	}
}

// MinServerVersion is the oldest server build last reported, "" if none
// was.
func (m *csiManager) MinServerVersion() string {
	if v := m.minServer.Load(); v != nil {
		return *v
	}
	return ""
}

// destructiveCalls are the controller calls a server sends only through
// its lanes, stamped with their term (nomad's onController).
var destructiveCalls = map[string]bool{
	"ControllerPublishVolume": true, "ControllerUnpublishVolume": true,
	"CreateVolume": true, "DeleteVolume": true, "ControllerExpandVolume": true,
	"CreateSnapshot": true, "DeleteSnapshot": true,
}

// termlessAdmitted decides a controller call that carries no leader term.
// Servers before upgrade.LaneTermRequired sent none, and could not be
// fenced; while one may still be in the cluster (minServer older, or not
// reported), such a call runs. Once every server sends terms, a
// destructive call without one can only come from a server that should
// not be sending it, and is refused as a stale term's is. Calls that
// change nothing run outside the lanes, without a term, and always run.
func termlessAdmitted(pluginID, method, minServer string) error {
	if !destructiveCalls[method] {
		return nil
	}
	min, err := upgrade.Parse(minServer)
	if err != nil || !upgrade.LaneTermRequired.Enabled(min) {
		return nil
	}
	return fmt.Errorf("%w: csi %s for plugin %q carries no leader term, but every server runs %s or newer (%s); not run",
		structs.ErrStaleLeaderTerm, method, pluginID, min, upgrade.LaneTermRequired.Name)
}
