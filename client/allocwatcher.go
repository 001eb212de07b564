package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/roamhq/roam/structs"
)

// rpcer is the one thing the allocation machinery needs from the client: a
// call to the servers on the node's behalf. Client implements it; tests use
// an in-memory fake.
type rpcer interface {
	RPC(method string, args, reply any) error
}

var _ rpcer = (*Client)(nil)

// allocManagerConfig is what an allocManager needs.
type allocManagerConfig struct {
	NodeID  string
	DataDir string
	// Datacenter is the node's.
	Datacenter string
	// NodeVars are the node's ${node.*}, ${attr.*} and ${meta.*} for
	// interpolation in task config and env; nil has none.
	NodeVars func() map[string]string
	// TemplateCheckInterval is how often running tasks' templates are
	// rendered again to find changes (0: DefaultTemplateCheckInterval).
	TemplateCheckInterval time.Duration
	RPC                   rpcer
	DB                    *stateDB
	Drivers               *taskDrivers
	// VolumeHook mounts group volumes; nil means volumes are unsupported.
	VolumeHook VolumeHook
	// CSI takes the CSI plugin tasks the node runs; nil ignores them.
	CSI    csiPluginHost
	Logger hclog.Logger
	// Registered is closed once the node is registered; the watcher waits
	// for it before its first query.
	Registered <-chan struct{}
	// MaxQueryTime bounds each blocking Node.GetClientAllocs.
	MaxQueryTime time.Duration
	// UpdateInterval is how often status updates are batched to the servers.
	UpdateInterval time.Duration
	// StateReset is set when the state DB was found damaged and replaced
	// by an empty one: the allocations the servers list for this node in
	// the first answer may have tasks running that this client no longer
	// knows of, so they are held (see allocManager.held).
	StateReset bool
	// HoldFor, if set, is asked about the cluster ID of every allocation
	// list; true leaves the list unreconciled (see clusterGuard).
	HoldFor func(clusterID string) bool
	// MinRetryBackoff and MaxRetryBackoff bound the waits after a failed
	// query.
	MinRetryBackoff time.Duration
	MaxRetryBackoff time.Duration
}

// allocManager owns the node's alloc runners: it restores them from the
// state DB on start, then keeps them in line with the servers' view of the
// node's allocations.
type allocManager struct {
	cfg     allocManagerConfig
	logger  hclog.Logger
	updater *allocUpdater

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu guards runners and killing.
	mu      sync.Mutex
	runners map[string]*allocRunner
	// killing is set once killAll begins: the servers may place
	// replacements of the allocations it kills here before the client
	// stops, and a runner started then would outlive the client.
	killing bool

	shutdownOnce sync.Once
	shutdownErr  error

	// held are allocations that were running before the state DB was
	// lost. Starting one again would run a second copy of its tasks beside
	// the first (whose executors outlived the client), both on its
	// volumes; reporting it stopped would release its claims while those
	// tasks may still write. So it is left alone, claims and all, for the
	// operator. Set by the first reconcile after a reset; used only by the
	// watch goroutine.
	held        map[string]bool
	heldDecided bool
}

func newAllocManager(cfg allocManagerConfig) *allocManager {
	ctx, cancel := context.WithCancel(context.Background())
	m := &allocManager{
		cfg:     cfg,
		logger:  cfg.Logger.Named("allocs"),
		ctx:     ctx,
		cancel:  cancel,
		runners: make(map[string]*allocRunner),
	}
	m.updater = newAllocUpdater(cfg.RPC, cfg.UpdateInterval, m.logger)
	return m
}

// start restores allocations from the state DB (re-attaching to their
// tasks) and starts watching the servers.
func (m *allocManager) start() {
	restored, errs := m.cfg.DB.loadAllocs()
	for _, err := range errs {
		m.logger.Error("skipping unreadable allocation in state db", "error", err)
	}
	for _, ra := range restored {
		m.logger.Info("restoring allocation", "alloc_id", ra.Alloc.ID, "tasks", len(ra.Tasks), "handles", len(ra.Handles))
		m.startRunner(ra.Alloc, ra)
	}
	m.wg.Add(2)
	go func() {
		defer m.wg.Done()
		m.updater.run(m.ctx, m.cfg.Registered)
	}()
	go func() {
		defer m.wg.Done()
		m.watch()
	}()
}

// shutdown stops every goroutine without killing tasks. Safe to call twice.
func (m *allocManager) shutdown(ctx context.Context) error {
	m.shutdownOnce.Do(func() {
		m.cancel()
		done := make(chan struct{})
		go func() { m.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			m.shutdownErr = fmt.Errorf("alloc runners did not stop: %w", ctx.Err())
		}
	})
	return m.shutdownErr
}

func (m *allocManager) nodeVars() map[string]string {
	if m.cfg.NodeVars == nil {
		return nil
	}
	return m.cfg.NodeVars()
}

// startRunner starts a runner for alloc, or none (nil) once killAll has
// begun.
func (m *allocManager) startRunner(alloc *structs.Allocation, restored *restoredAlloc) *allocRunner {
	ar := newAllocRunner(allocRunnerConfig{
		alloc:         alloc,
		dataDir:       m.cfg.DataDir,
		datacenter:    m.cfg.Datacenter,
		nodeVars:      m.nodeVars(),
		templateEvery: cmp.Or(m.cfg.TemplateCheckInterval, DefaultTemplateCheckInterval),
		drivers:       m.cfg.Drivers,
		db:            m.cfg.DB,
		hook:          m.cfg.VolumeHook,
		logger:        m.logger,
		report:        m.updater.update,
		restored:      restored,
		csi:           m.cfg.CSI,
	})
	m.mu.Lock()
	if m.killing {
		// Checked with the insertion, under the lock killAll takes its
		// list with: no runner starts that killAll does not see.
		m.mu.Unlock()
		return nil
	}
	m.runners[alloc.ID] = ar
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		ar.run(m.ctx)
	}()
	return ar
}

func (m *allocManager) getRunner(allocID string) *allocRunner {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.runners[allocID]
}

// watch waits for registration, then follows Node.GetClientAllocs.
func (m *allocManager) watch() {
	select {
	case <-m.cfg.Registered:
	case <-m.ctx.Done():
		return
	}
	var index uint64
	backoff := m.cfg.MinRetryBackoff
	held := false
	for m.ctx.Err() == nil {
		req := &structs.NodeSpecificRequest{
			NodeID:       m.cfg.NodeID,
			QueryOptions: structs.QueryOptions{MinQueryIndex: index, MaxQueryTime: m.cfg.MaxQueryTime},
		}
		var resp structs.NodeClientAllocsResponse
		err := m.cfg.RPC.RPC("Node.GetClientAllocs", req, &resp)
		if m.ctx.Err() != nil || errors.Is(err, ErrShutdown) {
			return
		}
		if err != nil || resp.Index == 0 {
			if err != nil {
				m.logger.Error("failed to fetch allocations", "error", err)
			}
			// The next answer may come from other servers: rebuilt on
			// empty disks, their index is below ours, and a blocking
			// query from ours would wait its full time before the
			// cluster guard saw whose servers they are.
			index = 0
			if !m.sleep(backoff) {
				return
			}
			backoff = min(backoff*2, m.cfg.MaxRetryBackoff)
			continue
		}
		backoff = m.cfg.MinRetryBackoff
		if m.cfg.HoldFor != nil && m.cfg.HoldFor(resp.ClusterID) {
			// Asked again from scratch after a pause: the list to act
			// on comes from the other cluster's restored state, whose
			// index may be anything.
			held = true
			index = 0
			if !m.sleep(m.cfg.MaxRetryBackoff) {
				return
			}
			continue
		}
		if held {
			// What was reported while another cluster answered went to
			// servers that did not know the allocations: say it again.
			held = false
			m.reportAll()
		}
		// An index that went backwards (servers restored from a snapshot)
		// restarts the query from scratch rather than waiting forever.
		index = resp.Index
		m.reconcile(resp.Allocs)
	}
}

// sleep waits d, jittered, or until shutdown; false means shutdown.
func (m *allocManager) sleep(d time.Duration) bool {
	wait := d/2 + rand.N(d/2+1)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-m.ctx.Done():
		return false
	}
}

// reconcile brings the runners in line with the servers' allocations for
// this node: new runnable ones start, stopped ones are killed, and ones
// the servers no longer have are killed and garbage collected.
func (m *allocManager) reconcile(allocs []*structs.Allocation) {
	seen := make(map[string]bool, len(allocs))
	sort.Slice(allocs, func(i, j int) bool { return allocs[i].ID < allocs[j].ID })
	if m.cfg.StateReset && !m.heldDecided {
		m.heldDecided = true
		m.held = make(map[string]bool)
		for _, alloc := range allocs {
			if alloc == nil || alloc.DesiredStatus != structs.AllocDesiredStatusRun || alloc.ClientTerminalStatus() {
				continue
			}
			if m.getRunner(alloc.ID) != nil {
				continue
			}
			m.held[alloc.ID] = true
			m.logger.Warn("allocation was placed here before the state db was lost; not starting it again and leaving its claims in place",
				"alloc_id", alloc.ID, "name", alloc.Name, "client_status", alloc.ClientStatus)
		}
	}
	for _, alloc := range allocs {
		if alloc == nil || (alloc.NodeID != "" && alloc.NodeID != m.cfg.NodeID) {
			continue
		}
		seen[alloc.ID] = true
		ar := m.getRunner(alloc.ID)
		if ar != nil {
			if alloc.AllocModifyIndex != ar.Alloc().AllocModifyIndex || alloc.DesiredStatus != ar.Alloc().DesiredStatus {
				ar.update(alloc)
			}
			continue
		}
		if alloc.DesiredStatus != structs.AllocDesiredStatusRun || alloc.ClientTerminalStatus() || m.held[alloc.ID] {
			continue
		}
		if m.isKilling() {
			continue
		}
		m.logger.Info("starting allocation", "alloc_id", alloc.ID, "name", alloc.Name)
		if err := m.cfg.DB.putAlloc(alloc); err != nil {
			// Run it anyway; only a restart would lose track of it.
			m.logger.Error("failed to persist allocation", "alloc_id", alloc.ID, "error", err)
		}
		m.startRunner(alloc, nil)
	}

	m.mu.Lock()
	var gone []*allocRunner
	for id, ar := range m.runners {
		if !seen[id] {
			gone = append(gone, ar)
		}
	}
	m.mu.Unlock()
	for _, ar := range gone {
		id := ar.id
		ar.markDestroy(func() {
			m.mu.Lock()
			if m.runners[id] == ar {
				delete(m.runners, id)
			}
			m.mu.Unlock()
		})
	}
}

// reportAll sends every allocation's current status again.
func (m *allocManager) reportAll() {
	m.mu.Lock()
	runners := make([]*allocRunner, 0, len(m.runners))
	for _, ar := range m.runners {
		runners = append(runners, ar)
	}
	m.mu.Unlock()
	for _, ar := range runners {
		ar.reportCurrent()
	}
}

func (m *allocManager) isKilling() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.killing
}

// hasAllocs reports whether the client holds any allocation, running or
// finished.
func (m *allocManager) hasAllocs() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.runners) > 0
}

// killAll kills every task of every allocation and waits, up to ctx, until
// they are all dead. Only an ephemeral client (dev mode) does this: a
// normal shutdown leaves tasks running for the next client to re-attach.
func (m *allocManager) killAll(ctx context.Context) error {
	m.mu.Lock()
	m.killing = true
	runners := make([]*allocRunner, 0, len(m.runners))
	for _, ar := range m.runners {
		runners = append(runners, ar)
	}
	m.mu.Unlock()
	for _, ar := range runners {
		ar.stop("client is ephemeral and shutting down")
		ar.killPoststop("client is ephemeral and shutting down")
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		alive := 0
		for _, ar := range runners {
			if !ar.allDead() {
				alive++
			}
		}
		if alive == 0 {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("%d allocations still running: %w", alive, ctx.Err())
		}
	}
}
