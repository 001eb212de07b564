package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/roamhq/roam/client/taskenv"
	"github.com/roamhq/roam/structs"
)

// ErrShutdown is returned by calls made after Shutdown.
var ErrShutdown = errors.New("client shut down")

// Client is one client agent.
type Client struct {
	config  *Config
	logger  hclog.Logger
	id      *identity
	drivers *taskDrivers

	// mu guards the fields below it.
	mu sync.Mutex
	// servers are the addresses to try, configured first, then learned.
	servers []string
	// registeredVars are the interpolation variables of the node as last
	// registered (package taskenv).
	registeredVars map[string]string
	// next is the index in servers of the next server to dial.
	next int
	conn *serverConn
	// localIP is this host's address as seen on the server connection.
	localIP      string
	heartbeatTTL time.Duration
	registered   bool
	// lastContact is when a heartbeat last succeeded; freeClaimsAfter is
	// the servers' window from then until they may free this node's
	// claims; outageStopped is set once outageWatch has stopped the
	// claim holders for the current outage.
	lastContact     time.Time
	freeClaimsAfter time.Duration
	outageStopped   bool
	// contactFromDisk is set while lastContact is the one recorded before
	// this client started (no heartbeat has succeeded since): the outage
	// may have begun before the restart (see outageWatch).
	contactFromDisk bool

	// registeredCh is closed once the node has registered for the first time.
	registeredCh   chan struct{}
	registeredOnce sync.Once

	// rpcServer serves the calls servers make to this client (RegisterRPC).
	rpcServer *structs.RPCServer

	// csi runs the CSI plugins; csiVolumes mounts their volumes.
	csi        *csiManager
	csiVolumes *csiVolumeManager
	// nodeUpdateCh (capacity 1) asks the heartbeat loop to register again
	// at once, with a freshly built node: a CSI plugin's health changed.
	nodeUpdateCh chan struct{}

	// db is the local state DB; allocs runs the node's allocations.
	db     *stateDB
	allocs *allocManager

	shutdownCtx    context.Context
	shutdownCancel context.CancelFunc
	shutdownOnce   sync.Once
	wg             sync.WaitGroup
}

// NewClient starts a client: it loads or creates the node's identity and
// starts registering and heartbeating in the background.
func NewClient(config *Config) (*Client, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config = config.copy()
	// Created traversable but not listable, so that a task run as another
	// user reaches its own directory under alloc/ while the identity and
	// state (in client/, 0700) stay out of its reach. A data dir that
	// exists keeps the mode its operator gave it.
	if err := os.MkdirAll(config.DataDir, 0o711); err != nil {
		return nil, fmt.Errorf("client: create data dir: %w", err)
	}
	id, err := loadIdentity(config.DataDir)
	if err != nil {
		return nil, err
	}
	if config.NodeName == "" {
		config.NodeName = id.NodeID[:8]
	}
	db, movedTo, damage, err := openStateDBRecovering(config.DataDir)
	if err != nil {
		return nil, err
	}
	if damage != nil {
		config.Logger.Named("client").Error("state db was damaged; moved it aside and started with an empty one. "+
			"Allocations the servers list for this node are left alone with their claims; stop them once their tasks are known gone",
			"moved_to", movedTo, "error", damage)
	}
	drivers, err := newTaskDrivers(config, config.Logger.Named("client"))
	if err != nil {
		db.close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		config:         config,
		drivers:        drivers,
		logger:         config.Logger.Named("client"),
		id:             id,
		servers:        append([]string(nil), config.Servers...),
		registeredCh:   make(chan struct{}),
		shutdownCtx:    ctx,
		shutdownCancel: cancel,
		db:             db,
		nodeUpdateCh:   make(chan struct{}, 1),
	}
	if rec, err := db.contact(); err != nil {
		c.logger.Warn("could not read when the servers were last reached; an outage that began before this start is counted from now",
			"error", err)
		c.lastContact, c.contactFromDisk = time.Now(), true
	} else if !rec.Sent.IsZero() {
		c.lastContact, c.freeClaimsAfter, c.contactFromDisk = rec.Sent, rec.FreeClaimsAfter, true
	}
	if c.rpcServer, err = newClientRPCServer(c); err != nil {
		cancel()
		db.close()
		return nil, err
	}
	if err := c.setupCSI(); err != nil {
		cancel()
		db.close()
		return nil, err
	}
	// An explicitly configured hook wins; otherwise the CSI volume manager
	// mounts group volumes, through plugins configured on this host or
	// run by its tasks.
	volumeHook := config.VolumeHook
	if volumeHook == nil {
		volumeHook = c.csiVolumes
	}
	c.allocs = newAllocManager(allocManagerConfig{
		NodeID:          id.NodeID,
		DataDir:         config.DataDir,
		Datacenter:      config.Datacenter,
		NodeVars:        c.nodeVars,
		RPC:             c,
		DB:              db,
		Drivers:         drivers,
		VolumeHook:      volumeHook,
		CSI:             c.csi,
		Logger:          c.logger,
		Registered:      c.registeredCh,
		MaxQueryTime:    structs.DefaultBlockingQueryWait,
		UpdateInterval:  allocUpdateInterval,
		MinRetryBackoff: config.MinRetryBackoff,
		MaxRetryBackoff: config.MaxRetryBackoff,
		StateReset:      damage != nil,
	})
	guard, err := newClusterGuard(config.DataDir, c.logger, c.allocs.hasAllocs)
	if err != nil {
		cancel()
		db.close()
		return nil, err
	}
	c.allocs.cfg.HoldFor = guard.hold
	// Restore first: tasks that survived a restart are re-attached before
	// the servers are asked anything.
	c.allocs.start()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.heartbeatLoop()
	}()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.outageWatch()
	}()
	c.logger.Info("client started", "node_id", id.NodeID, "name", config.NodeName, "servers", config.Servers)
	return c, nil
}

// NodeID returns this node's ID.
func (c *Client) NodeID() string { return c.id.NodeID }

// SecretID returns this node's secret, which authenticates its RPCs.
func (c *Client) SecretID() string { return c.id.SecretID }

// Registered is closed once the node has registered with the servers.
func (c *Client) Registered() <-chan struct{} { return c.registeredCh }

// Servers returns the server addresses the client knows, in trial order.
func (c *Client) Servers() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.servers...)
}

// RPC calls a server on this node's behalf: the node's secret is the
// token. Retryable failures (no leader, server unreachable or gone
// mid-call) are retried with jittered backoff, failing over to the next
// server, until RPCRetryTimeout. Every RPC the client makes today is
// idempotent, so a call that may have run is safe to send again.
func (c *Client) RPC(method string, args, reply any) error {
	return c.RPCContext(context.Background(), method, args, reply)
}

// RPCContext is RPC for a caller that may go away (an HTTP request): the
// call, and its retries, end as soon as ctx does, and a blocking query
// the server is holding for it ends with it (see serverConn.call).
func (c *Client) RPCContext(ctx context.Context, method string, args, reply any) error {
	setAuth(args, c.config.Region, c.id.SecretID)
	return c.rpcRetrying(ctx, method, args, reply)
}

// ForwardContext passes on a call made by someone else (the agent's HTTP
// API): the caller's own token goes with it, or none, never this node's
// secret, so a request with no token through a client agent is nobody,
// not the node.
func (c *Client) ForwardContext(ctx context.Context, method string, args, reply any) error {
	setAuth(args, c.config.Region, "")
	return c.rpcRetrying(ctx, method, args, reply)
}

// claimStillMoving says whether a retryable error is about the claim, not
// about the server that answered: keep the connection.
func claimStillMoving(err error) bool {
	err = structs.FromRPCError(err)
	return errors.Is(err, structs.ErrClaimInProgress) || errors.Is(err, structs.ErrStaleLeaderTerm)
}

// rpcRetrying sends a call whose auth is already filled in, retrying as
// RPC describes.
func (c *Client) rpcRetrying(ctx context.Context, method string, args, reply any) error {
	timeout := structs.RPCCallTimeout(args)

	deadline := time.Now().Add(c.config.RPCRetryTimeout)
	backoff := c.config.MinRetryBackoff
	for attempt := 1; ; attempt++ {
		conn, err := c.getConn()
		if err == nil {
			err = conn.call(ctx, method, args, reply, timeout)
			if errors.Is(err, errConnLost) || (structs.IsRetryable(err) && !claimStillMoving(err)) {
				// A server that cannot reach a leader (say, the minority
				// side of a partition) is as good as gone: try the next.
				// A claim in progress, or a controller call refused as a
				// deposed leader's, is not this server's fault, and
				// dropping the connection would cut the servers' calls to
				// this node that the claim may be waiting on.
				c.dropConn(conn)
			}
		}
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrShutdown) || ctx.Err() != nil ||
			!retryableCall(err) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: gave up after %d attempts: %w", method, attempt, err)
		}
		c.logger.Debug("rpc failed, retrying", "method", method, "attempt", attempt, "error", err)
		wait := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-time.After(wait):
		case <-c.shutdownCtx.Done():
			return ErrShutdown
		case <-ctx.Done():
			return fmt.Errorf("%s: caller gone while retrying: %w", method, ctx.Err())
		}
		backoff = min(backoff*2, c.config.MaxRetryBackoff)
	}
}

// setAuth fills in region and token on requests that carry them.
func setAuth(args any, region, token string) {
	if a, ok := args.(interface{ SetAuth(region, token string) }); ok {
		a.SetAuth(region, token)
	}
}

type dialError struct{ err error }

func (e *dialError) Error() string { return "dial server: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

func isDialError(err error) bool {
	var d *dialError
	return errors.As(err, &d)
}

// getConn returns the current server session, dialing the next server in
// the list if there is none.
func (c *Client) getConn() (*serverConn, error) {
	c.mu.Lock()
	if c.shutdownCtx.Err() != nil {
		c.mu.Unlock()
		return nil, ErrShutdown
	}
	if c.conn != nil {
		conn := c.conn
		c.mu.Unlock()
		return conn, nil
	}
	addr := c.servers[c.next%len(c.servers)]
	c.next = (c.next + 1) % len(c.servers)
	c.mu.Unlock()

	conn, err := dialServer(addr, c.config.DialSource, c.config.DialTimeout, c.config.TLS, c.logger)
	if err != nil {
		return nil, &dialError{fmt.Errorf("%s: %w", addr, err)}
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.shutdownCtx.Err() != nil {
		conn.close()
		return nil, ErrShutdown
	}
	if c.conn != nil { // another caller won the race
		conn.close()
		return c.conn, nil
	}
	c.conn = conn
	c.serveServerStreamsLocked(conn)
	if host, _, err := net.SplitHostPort(conn.conn.LocalAddr().String()); err == nil {
		c.localIP = host
	}
	c.logger.Info("connected to server", "address", addr)
	return conn, nil
}

// dropConn forgets a broken session so the next call fails over.
func (c *Client) dropConn(conn *serverConn) {
	c.mu.Lock()
	if c.conn == conn {
		c.conn = nil
	}
	c.mu.Unlock()
	conn.close()
}

// learnServers adds servers the cluster told us about.
func (c *Client) learnServers(servers []*structs.NodeServerInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	known := make(map[string]bool, len(c.servers))
	for _, s := range c.servers {
		known[s] = true
	}
	for _, s := range servers {
		if s.RPCAdvertiseAddr != "" && !known[s.RPCAdvertiseAddr] {
			c.servers = append(c.servers, s.RPCAdvertiseAddr)
			known[s.RPCAdvertiseAddr] = true
		}
	}
}

// heartbeatLoop registers the node, then heartbeats at half the TTL the
// server hands back. A server that has forgotten the node gets a fresh
// registration.
func (c *Client) heartbeatLoop() {
	// reregister is set when the node changed (nodeUpdateCh) and the
	// servers have not yet seen the change.
	reregister := false
	for {
		var (
			resp structs.NodeUpdateResponse
			err  error
		)
		c.mu.Lock()
		registered := c.registered
		c.mu.Unlock()
		// The servers armed the node's timer at some moment after this
		// one: counting the outage from here errs on the safe side.
		sent := time.Now()
		if !registered || reregister {
			err = c.register(&resp)
			if err == nil {
				reregister = false
			}
		} else {
			err = c.updateStatus(&resp)
			if errors.Is(err, structs.ErrUnknownNode) {
				c.logger.Warn("server does not know this node; registering again")
				c.mu.Lock()
				c.registered = false
				c.mu.Unlock()
				continue
			}
		}

		next := c.config.MinRetryBackoff * 4
		if err != nil {
			if errors.Is(err, ErrShutdown) {
				return
			}
			c.logger.Error("heartbeat failed", "error", err)
		} else {
			c.heartbeatDone(sent, &resp)
			if resp.HeartbeatTTL > 0 {
				next = resp.HeartbeatTTL / 2
			}
		}
		select {
		case <-time.After(next):
		case <-c.nodeUpdateCh:
			reregister = true
		case <-c.shutdownCtx.Done():
			return
		}
	}
}

// updateStatus sends one heartbeat.
func (c *Client) updateStatus(resp *structs.NodeUpdateResponse) error {
	return c.RPC("Node.UpdateStatus", &structs.NodeUpdateStatusRequest{
		NodeID:        c.id.NodeID,
		Status:        structs.NodeStatusReady,
		CSILeaderTerm: c.csi.LeaderTerm(),
	}, resp)
}

// heartbeatDone takes in the answer to a heartbeat (or registration) sent
// at sent.
func (c *Client) heartbeatDone(sent time.Time, resp *structs.NodeUpdateResponse) {
	c.learnServers(resp.Servers)
	if !c.noteContact(sent, resp) {
		return // a later heartbeat's answer came first
	}
	if err := c.db.putContact(serverContact{Sent: sent, FreeClaimsAfter: resp.FreeClaimsAfter}); err != nil {
		c.logger.Warn("could not record the heartbeat; a restart during an outage would count it from an older one", "error", err)
	}
	c.mu.Lock()
	c.heartbeatTTL = resp.HeartbeatTTL
	c.mu.Unlock()
}

// renewLease heartbeats now, outside the heartbeat loop, for a leader's
// controller call whose lease is near its end (csiManagerConfig.Renew).
// It returns when the servers answered or ctx ended; an answer that comes
// later still counts when it comes.
func (c *Client) renewLease(ctx context.Context) error {
	c.mu.Lock()
	registered := c.registered
	c.mu.Unlock()
	if !registered {
		return errors.New("node not registered yet")
	}
	done := make(chan error, 1)
	go func() {
		sent := time.Now()
		var resp structs.NodeUpdateResponse
		err := c.updateStatus(&resp)
		if err == nil {
			c.heartbeatDone(sent, &resp)
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// triggerNodeUpdate makes the heartbeat loop register the node again at
// once, so the servers see a change (a CSI plugin's health) without
// waiting for the next heartbeat. Never blocks.
func (c *Client) triggerNodeUpdate() {
	select {
	case c.nodeUpdateCh <- struct{}{}:
	default: // one already pending; it will build the node afresh
	}
}

func (c *Client) register(resp *structs.NodeUpdateResponse) error {
	// Dial first so the node records the address the server sees.
	if _, err := c.getConn(); err != nil && !isDialError(err) {
		return err
	}
	c.mu.Lock()
	node := c.buildNode()
	c.registeredVars = taskenv.NodeVars(node)
	c.mu.Unlock()
	if err := c.RPC("Node.Register", &structs.NodeRegisterRequest{Node: node, IntroToken: c.config.IntroToken, CSILeaderTerm: c.csi.LeaderTerm()}, resp); err != nil {
		return fmt.Errorf("register node: %w", err)
	}
	c.csi.SetMinServerVersion(resp.MinServerVersion)
	c.mu.Lock()
	c.registered = true
	c.mu.Unlock()
	c.registeredOnce.Do(func() { close(c.registeredCh) })
	c.logger.Info("node registered", "node_id", node.ID, "heartbeat_ttl", resp.HeartbeatTTL)
	return nil
}

// nodeVars are the interpolation variables of the node as last
// registered; allocations start only once it is.
func (c *Client) nodeVars() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.registeredVars
}

// allocUpdateInterval is how often allocation status updates are batched
// to the servers; a terminal status goes out at once.
const allocUpdateInterval = 200 * time.Millisecond

// KillAllTasks kills every running task and waits, up to ctx, for them to
// die. It is for ephemeral clients (dev mode), whose data dir goes away
// with them; a normal Shutdown leaves tasks running to be re-attached.
func (c *Client) KillAllTasks(ctx context.Context) error {
	return c.allocs.killAll(ctx)
}

// Shutdown stops heartbeating, stops the alloc runners' goroutines and
// closes the server session and the state DB. Tasks keep running: a
// restarted client on the same data dir re-attaches to them. The node is
// not deregistered: the servers mark it down when its TTL runs out, and a
// restarted client comes back as the same node. Safe to call twice.
func (c *Client) Shutdown(ctx context.Context) error {
	var err error
	c.shutdownOnce.Do(func() {
		c.shutdownCancel()
		c.mu.Lock()
		if c.conn != nil {
			c.conn.close()
			c.conn = nil
		}
		c.mu.Unlock()
		if aerr := c.allocs.shutdown(ctx); aerr != nil {
			err = fmt.Errorf("client shutdown: %w", aerr)
			return
		}
		if cerr := c.csi.shutdown(ctx); cerr != nil {
			err = fmt.Errorf("client shutdown: %w", cerr)
			return
		}
		done := make(chan struct{})
		go func() { c.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			err = fmt.Errorf("client shutdown: %w", ctx.Err())
			return
		}
		// Only once nothing can write to it any more.
		if cerr := c.db.close(); cerr != nil {
			err = fmt.Errorf("client shutdown: close state db: %w", cerr)
		}
	})
	return err
}
