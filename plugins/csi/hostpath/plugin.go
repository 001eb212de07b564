package hostpath

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// PluginName is the name GetPluginInfo reports.
const PluginName = "hostpath.csi.roam.dev"

// Version is the vendor version GetPluginInfo reports.
var Version = "0.1.0"

var (
	// ErrStarted is returned by Start on a plugin that was already started.
	ErrStarted = errors.New("plugin already started")
	// ErrStopped is returned by Start and Serve on a plugin that was stopped.
	ErrStopped = errors.New("plugin stopped")
)

// Plugin is one hostpath CSI plugin process: a gRPC server on a unix socket
// serving the services its Mode selects.
type Plugin struct {
	cfg     Config
	logger  hclog.Logger
	sock    string
	store   *store
	tracker *overlapTracker // nil unless the controller service is served
	calls   *callLog
	server  *grpc.Server

	// mu guards the lifecycle fields below.
	mu       sync.Mutex
	started  bool
	stopping bool
	serveErr chan error    // receives grpc.Server.Serve's result
	stopped  chan struct{} // closed once the server has fully stopped
	stopErr  error
	// quit is closed when Stop begins, ending calls hung by a fault.
	quit chan struct{}

	stopOnce sync.Once
}

// New validates cfg and prepares a plugin: it creates the state dir and, for
// modes that serve the controller, the overlap and calls files. It does not
// listen yet; see Start and Serve.
func New(cfg *Config) (*Plugin, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := *cfg
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	sock, _ := socketPath(c.Endpoint)
	// Node publish links point into the state dir, so they must not depend
	// on the working directory.
	stateDir, err := filepath.Abs(c.StateDir)
	if err != nil {
		return nil, fmt.Errorf("resolving state dir: %w", err)
	}
	c.StateDir = stateDir
	if c.TargetRoot != "" {
		c.TargetRoot = filepath.Clean(c.TargetRoot)
	}
	logger := c.Logger.Named("csi-hostpath").With("plugin_node_id", c.NodeID, "mode", string(c.Mode))
	st, err := newStore(c.StateDir)
	if err != nil {
		return nil, err
	}
	p := &Plugin{
		cfg:     c,
		logger:  logger,
		sock:    sock,
		store:   st,
		stopped: make(chan struct{}),
		quit:    make(chan struct{}),
	}
	if c.Mode.servesController() {
		if p.tracker, err = newOverlapTracker(c.StateDir, c.NodeID, logger); err != nil {
			return nil, err
		}
	}
	if p.calls, err = openCallLog(CallLogFile(c.StateDir, c.NodeID), DefaultCallLogLimit, logger); err != nil {
		return nil, err
	}
	p.server = grpc.NewServer(
		grpc.UnaryInterceptor(p.intercept),
		// Stop and GracefulStop return only once every handler has
		// returned, so nothing touches the state dir after Stop.
		grpc.WaitForHandlers(true),
	)
	csi.RegisterIdentityServer(p.server, &identityServer{p: p})
	if c.Mode.servesController() {
		csi.RegisterControllerServer(p.server, &controllerServer{p: p})
	}
	if c.Mode.servesNode() {
		csi.RegisterNodeServer(p.server, &nodeServer{p: p})
	}
	return p, nil
}

// Endpoint is the unix:// address the plugin serves on.
func (p *Plugin) Endpoint() string { return "unix://" + p.sock }

// Overlaps is the number of destructive controller calls that started while
// another was in flight in this process (including counts carried over from
// the overlap file at start). Always zero in node mode.
func (p *Plugin) Overlaps() int64 {
	if p.tracker == nil {
		return 0
	}
	return p.tracker.overlapCount()
}

// Calls returns how many destructive controller calls of each method reached
// this plugin. Empty in node mode.
func (p *Plugin) Calls() map[string]int64 {
	if p.tracker == nil {
		return map[string]int64{}
	}
	return p.tracker.callCounts()
}

// Start registers the node (node and monolith modes), removes a stale socket
// file, listens on the socket and serves in the background.
func (p *Plugin) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.stopping:
		return ErrStopped
	case p.started:
		return ErrStarted
	}
	if p.cfg.Mode.servesNode() {
		if err := p.registerNode(); err != nil {
			return err
		}
	}
	lis, err := listenUnix(p.sock)
	if err != nil {
		return err
	}
	p.started = true
	p.serveErr = make(chan error, 1)
	go func() { p.serveErr <- p.server.Serve(lis) }()
	p.logger.Info("serving CSI plugin", "endpoint", p.Endpoint(), "state_dir", p.cfg.StateDir,
		"publish_latency", p.cfg.PublishLatency, "max_volumes_per_node", p.cfg.MaxVolumesPerNode)
	return nil
}

// Serve starts the plugin unless Start already did, and blocks until ctx is
// done, then stops it gracefully, letting in-flight calls finish. It returns
// early with an error if the server fails on its own.
func (p *Plugin) Serve(ctx context.Context) error {
	if err := p.Start(); err != nil && !errors.Is(err, ErrStarted) {
		return err
	}
	select {
	case <-ctx.Done():
		return p.Stop(context.Background())
	case err := <-p.serveErr:
		// Put the result back for Stop, which waits on it too.
		p.serveErr <- err
		stopErr := p.Stop(context.Background())
		if err != nil {
			return fmt.Errorf("serving CSI plugin: %w", err)
		}
		return stopErr
	}
}

// Stop stops accepting connections and waits for in-flight calls to finish.
// If ctx ends first, it cancels the calls still running, waits for them to
// return, and returns ctx.Err(). Safe to call more than once and before
// Start.
func (p *Plugin) Stop(ctx context.Context) error {
	p.mu.Lock()
	started := p.started
	p.stopping = true
	p.mu.Unlock()
	if !started {
		return p.calls.close()
	}
	p.stopOnce.Do(func() {
		close(p.quit)
		go func() {
			p.server.GracefulStop()
			err := <-p.serveErr
			if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				p.stopErr = fmt.Errorf("serving CSI plugin: %w", err)
			}
			if rmErr := removeSocket(p.sock); rmErr != nil && p.stopErr == nil {
				p.stopErr = rmErr
			}
			// No handler runs any more (WaitForHandlers), so nothing
			// records a call after this.
			if clErr := p.calls.close(); clErr != nil && p.stopErr == nil {
				p.stopErr = clErr
			}
			p.logger.Info("stopped CSI plugin")
			close(p.stopped)
		}()
	})
	select {
	case <-p.stopped:
		return p.stopErr
	case <-ctx.Done():
		p.server.Stop()
		<-p.stopped
		return ctx.Err()
	}
}

// GracefulStop stops the plugin and waits, without a deadline, for in-flight
// calls to finish.
func (p *Plugin) GracefulStop() {
	if err := p.Stop(context.Background()); err != nil {
		p.logger.Error("stopping CSI plugin", "error", err)
	}
}

// registerNode records this node and its volume limit in the shared state,
// keeping whatever is already attached to it.
func (p *Plugin) registerNode() error {
	err := p.store.update(func(st *state) error {
		n := st.Nodes[p.cfg.NodeID]
		if n == nil {
			n = &node{ID: p.cfg.NodeID}
			n.fillMaps()
			st.Nodes[p.cfg.NodeID] = n
		}
		n.MaxVolumes = p.cfg.MaxVolumesPerNode
		n.Zone = p.cfg.Zone
		n.RegisteredAt = time.Now().UTC()
		return nil
	})
	if err != nil {
		return fmt.Errorf("registering node %q: %w", p.cfg.NodeID, err)
	}
	return nil
}

// intercept counts destructive controller calls for the overlap detector
// around the whole call, translates plain errors into INTERNAL, records
// volume calls in the call log, and logs.
func (p *Plugin) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	if method, ok := destructiveMethods[info.FullMethod]; ok && p.tracker != nil {
		done := p.tracker.start(method)
		defer done()
	}
	resp, err := handler(ctx, req)
	if err != nil {
		if _, ok := status.FromError(err); !ok {
			err = status.Error(codes.Internal, err.Error())
		}
		p.logger.Debug("CSI call failed", "method", info.FullMethod, "duration", time.Since(start), "error", err)
	} else {
		p.logger.Trace("CSI call", "method", info.FullMethod, "duration", time.Since(start))
	}
	if method, ok := loggedMethod(info.FullMethod); ok {
		volID, nodeID := callTarget(info.FullMethod, p.cfg.NodeID, req, resp)
		r := CallRecord{
			Method: method, VolumeID: volID, NodeID: nodeID,
			StartUnixNano: start.UnixNano(), EndUnixNano: time.Now().UnixNano(),
		}
		if err != nil {
			r.Error = err.Error()
		}
		p.calls.record(r)
	}
	return resp, err
}

// listenUnix listens on path, removing a stale socket left by an earlier
// process first. It refuses to remove anything that is not a socket.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating socket dir: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("socket path %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	return lis, nil
}

func removeSocket(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing socket: %w", err)
	}
	return nil
}
