// Package agent wires a Roam agent together: a server, a client, or both,
// and the HTTP API in front of them.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	metrics "github.com/hashicorp/go-metrics"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/roamhq/roam/client"
	"github.com/roamhq/roam/internal/tlsutil"
	"github.com/roamhq/roam/nomad"
)

// Agent is a running roam agent.
type Agent struct {
	config *Config
	logger hclog.Logger

	// aclCache holds tokens a client-only agent resolved (see resolveACL).
	aclCache clientACLCache

	server *nomad.Server
	client *client.Client
	http   *HTTPServer
	// tls is the loaded TLS material, nil when the tls block enables
	// nothing; Reload reads it again.
	tls *tlsutil.Configurator

	metrics *metrics.InmemSink
	// promRegistry gathers what the Prometheus sink records.
	promRegistry *prometheus.Registry

	// tempDir is the dev-mode data dir, removed on shutdown.
	tempDir string

	// bgCancel stops the agent's background work (the dev plugin job's
	// registration); wg tracks it.
	bgCancel context.CancelFunc
	wg       sync.WaitGroup

	shutdownOnce sync.Once
	shutdownErr  error
}

// NewAgent starts the parts of the agent that config enables. On error
// nothing is left running.
func NewAgent(config *Config, logOutput io.Writer) (a *Agent, err error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	logger := hclog.New(&hclog.LoggerOptions{
		Name:   "agent",
		Level:  hclog.LevelFromString(config.LogLevel),
		Output: logOutput,
	})
	a = &Agent{config: config, logger: logger}
	// "return nil, err" sets a to nil before this runs: keep our own.
	started := a
	defer func() {
		if err != nil {
			_ = started.Shutdown(context.Background())
		}
	}()

	if err := a.setupMetrics(); err != nil {
		return nil, err
	}
	if config.DataDir == "" && config.DevMode {
		dir, err := os.MkdirTemp("", "roam-dev-")
		if err != nil {
			return nil, fmt.Errorf("agent: create dev data dir: %w", err)
		}
		a.tempDir = dir
		config.DataDir = dir
	}

	if a.tls, err = tlsutil.NewConfigurator(config.tlsConfig()); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if a.tls.RPC() && !a.tls.VerifyServerHostname() {
		logger.Warn("tls.verify_server_hostname is off: any certificate the CA signed may speak raft, join and call server-only rpcs; turn it on")
	}

	// Bind HTTP first: its address goes into the node's registration.
	httpLn, err := net.Listen("tcp", config.httpAddr())
	if err != nil {
		return nil, fmt.Errorf("agent: listen for http on %s: %w", config.httpAddr(), err)
	}
	httpAdvertise := config.Advertise.HTTP
	if httpAdvertise == "" {
		httpAdvertise = advertiseFor(httpLn.Addr())
	}

	if config.Server.Enabled {
		if err := a.setupServer(); err != nil {
			httpLn.Close()
			return nil, err
		}
	}
	if config.Client.Enabled {
		if err := a.setupClient(httpAdvertise); err != nil {
			httpLn.Close()
			return nil, err
		}
	}
	a.http = NewHTTPServer(a, httpLn, logger.Named("http"))
	if a.wantDevCSIPlugin() {
		var bgCtx context.Context
		bgCtx, a.bgCancel = context.WithCancel(context.Background())
		a.startDevCSIPlugin(bgCtx, a.client)
	}
	logger.Info("agent started", "http_addr", httpLn.Addr().String(),
		"server", config.Server.Enabled, "client", config.Client.Enabled, "dev", config.DevMode)
	return a, nil
}

func (a *Agent) setupMetrics() error {
	a.metrics = metrics.NewInmemSink(10*time.Second, time.Minute)
	cfg := metrics.DefaultConfig(metricsService)
	cfg.EnableHostname = false
	cfg.EnableRuntimeMetrics = true
	sinks := metrics.FanoutSink{a.metrics}
	if prom, reg, err := newPrometheusSink(); err == nil {
		sinks = append(sinks, prom)
		a.promRegistry = reg
	} else {
		a.logger.Warn("prometheus metrics disabled", "error", err)
	}
	_, err := metrics.NewGlobal(cfg, sinks)
	return err
}

// advertiseFor turns a bound address into one others can dial: a wildcard
// bind advertises the loopback address.
func advertiseFor(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

func (a *Agent) setupServer() error {
	c := a.config
	sc := nomad.DefaultConfig()
	sc.NodeName = c.Name
	if sc.NodeName == "" {
		sc.NodeName, _ = os.Hostname()
	}
	sc.Region = c.Region
	sc.Datacenter = c.Datacenter
	sc.DevMode = c.DevMode
	if !c.DevMode {
		sc.DataDir = c.DataDir
	}
	sc.RPCAddr = c.rpcAddr()
	sc.BootstrapExpect = c.Server.BootstrapExpect
	if c.Server.ServerJoin != nil {
		sc.RetryJoin = c.Server.ServerJoin.RetryJoin
		sc.JoinInterval = parseDurationOr(c.Server.ServerJoin.RetryInterval, sc.JoinInterval)
		if sc.MemberFailAfter <= sc.JoinInterval {
			sc.MemberFailAfter = 5 * sc.JoinInterval
		}
	}
	if c.Server.RaftMultiplier != 0 {
		sc.RaftMultiplier = c.Server.RaftMultiplier
	}
	if t := c.RaftTimers; t != nil {
		rc := raft.DefaultConfig()
		rc.HeartbeatTimeout = t.HeartbeatTimeout
		rc.ElectionTimeout = t.ElectionTimeout
		rc.LeaderLeaseTimeout = t.LeaderLeaseTimeout
		sc.RaftConfig = rc
	}
	if c.Server.MaxRPCFrameBytes != 0 {
		sc.RPCMaxFrameBytes = c.Server.MaxRPCFrameBytes
	}
	if n := c.Server.EventBufferSize; n < 0 || n > maxEventBufferSize {
		return fmt.Errorf("server.event_buffer_size %d is outside 0..%d", n, maxEventBufferSize)
	}
	sc.EventBufferSize = c.Server.EventBufferSize
	if c.Limits != nil {
		sc.JobLimits = c.Limits.jobLimits()
	}
	sc.HeartbeatGrace = parseDurationOr(c.Server.HeartbeatGrace, sc.HeartbeatGrace)
	sc.MinHeartbeatTTL = parseDurationOr(c.Server.MinHeartbeatTTL, sc.MinHeartbeatTTL)
	sc.FailoverHeartbeatTTL = parseDurationOr(c.Server.FailoverHeartbeatTTL, sc.FailoverHeartbeatTTL)
	sc.LeaveDrainTimeout = parseDurationOr(c.Server.LeaveDrainTimeout, sc.LeaveDrainTimeout)
	sc.CSINodeDetachTimeout = parseDurationOr(c.Server.CSINodeDetachTimeout, sc.CSINodeDetachTimeout)
	sc.DeadServerCleanupAfter = parseDurationOr(c.Server.DeadServerCleanupAfter, sc.DeadServerCleanupAfter)
	sc.LeaveOnTerminate = c.LeaveOnTerminate
	sc.OperatorToken = c.Server.OperatorToken
	sc.ClientIntroTokens = c.Server.ClientIntroTokens
	sc.ACLEnabled = c.aclEnabled()
	sc.EnableDebug = c.EnableDebug
	if sink := a.metrics; sink != nil {
		sc.Metrics = func() (any, error) { return sink.DisplayMetrics(nil, nil) }
	}
	if c.ACL != nil {
		sc.ACLTokenTTL = parseDurationOr(c.ACL.TokenTTL, 0)
	}
	limits := c.limits()
	sc.RPCMaxConnsPerClient = limits.RPCMaxConnsPerClient
	sc.RPCHandshakeTimeout = parseDurationOr(limits.RPCHandshakeTimeout, sc.RPCHandshakeTimeout)
	sc.RPCFrameTimeout = parseDurationOr(limits.RPCFrameTimeout, sc.RPCFrameTimeout)
	sc.Logger = a.logger.ResetNamed("")
	sc.TLS = a.tls
	sc.DialSource = c.BindAddr

	ln, err := net.Listen("tcp", sc.RPCAddr)
	if err != nil {
		return fmt.Errorf("agent: listen for rpc on %s: %w", sc.RPCAddr, err)
	}
	sc.Listener = ln
	sc.RPCAdvertise = c.Advertise.RPC
	if sc.RPCAdvertise == "" {
		sc.RPCAdvertise = advertiseFor(ln.Addr())
	}
	srv, err := nomad.NewServer(sc)
	if err != nil {
		ln.Close()
		return err
	}
	a.server = srv
	return nil
}

func (a *Agent) setupClient(httpAdvertise string) error {
	cc, err := a.clientConfig(httpAdvertise)
	if err != nil {
		return err
	}
	cl, err := client.NewClient(cc)
	if err != nil {
		return err
	}
	a.client = cl
	return nil
}

// clientConfig maps the agent's configuration onto the client's.
func (a *Agent) clientConfig(httpAdvertise string) (*client.Config, error) {
	c := a.config
	cc := client.DefaultConfig()
	cc.DataDir = c.DataDir
	cc.NodeName = a.memberName()
	cc.Region = c.Region
	cc.Datacenter = c.Datacenter
	cc.NodeClass = c.Client.NodeClass
	cc.Meta = c.Client.Meta
	cc.HTTPAddr = httpAdvertise
	cc.Servers = c.Client.Servers
	cc.CSINodeCallTimeout = parseDurationOr(c.Client.CSINodeCallTimeout, cc.CSINodeCallTimeout)
	cc.DisableRawExec = !c.rawExecEnabled()
	cc.RawExecDefaultUser = c.rawExecDefaultUser()
	cc.DisableExec = !c.execEnabled()
	cc.ChrootEnv = c.Client.ChrootEnv
	cc.UserDenylist = c.userDenylist()
	cc.MinDynamicPort, cc.MaxDynamicPort = c.Client.MinDynamicPort, c.Client.MaxDynamicPort
	cc.IntroToken = c.Client.IntroToken
	if len(cc.Servers) == 0 && a.server != nil {
		cc.Servers = []string{a.server.Addr()}
	}
	for _, p := range c.Client.CSIPlugins {
		if cc.CSIPlugins == nil {
			cc.CSIPlugins = map[string]*client.CSIPluginConfig{}
		}
		if _, dup := cc.CSIPlugins[p.ID]; dup {
			return nil, fmt.Errorf("client: csi_plugin %q is configured twice", p.ID)
		}
		cc.CSIPlugins[p.ID] = &client.CSIPluginConfig{ID: p.ID, Type: p.Type, Socket: p.Socket}
		if p.ControllerConcurrency != nil {
			cc.CSIPlugins[p.ID].ControllerConcurrency = *p.ControllerConcurrency
		}
	}
	cc.Logger = a.logger.ResetNamed("")
	cc.TLS = a.tls
	cc.DialSource = c.BindAddr
	cc.StopOnClientAfter = parseDurationOr(c.Client.StopOnClientAfter, cc.StopOnClientAfter)
	return cc, nil
}

// errNoRPC means the agent has neither a server nor a client to call with.
var errNoRPC = errors.New("agent has neither a server nor a client")

// RPC calls the cluster: through the local server when there is one
// (which forwards to the leader as needed), else through the client.
func (a *Agent) RPC(method string, args, reply any) error {
	return a.RPCContext(context.Background(), method, args, reply)
}

// RPCContext is RPC for a caller that may go away: a blocking query it
// starts ends as soon as ctx does.
func (a *Agent) RPCContext(ctx context.Context, method string, args, reply any) error {
	switch {
	case a.server != nil:
		return a.server.RPCContext(ctx, method, args, reply)
	case a.client != nil:
		// The caller's token, never the node's secret.
		return a.client.ForwardContext(ctx, method, args, reply)
	}
	return errNoRPC
}

// callerRPC is RPCContext on behalf of an HTTP caller: through a client,
// the caller's token goes as is, and no token stays anonymous (see
// client.ForwardContext).
func (a *Agent) callerRPC(ctx context.Context, method string, args, reply any) error {
	if a.server == nil && a.client != nil {
		return a.client.ForwardContext(ctx, method, args, reply)
	}
	return a.RPCContext(ctx, method, args, reply)
}

// Server returns the agent's server, or nil.
func (a *Agent) Server() *nomad.Server { return a.server }

// Client returns the agent's client, or nil.
func (a *Agent) Client() *client.Client { return a.client }

// Config returns the agent's configuration.
func (a *Agent) Config() *Config { return a.config }

// HTTPAddr returns the address the HTTP API listens on.
func (a *Agent) HTTPAddr() string { return a.http.Addr() }

// HTTPScheme is https when the HTTP API serves TLS, else http.
func (a *Agent) HTTPScheme() string {
	if a.tls.HTTP() {
		return "https"
	}
	return "http"
}

// ReloadTLS reads the TLS certificate, key and CA files again (on
// SIGHUP). Connections made from then on use them; open ones keep what
// they were made with. An agent without TLS has nothing to reload.
func (a *Agent) ReloadTLS() error {
	if a.tls == nil {
		return nil
	}
	if err := a.tls.Reload(); err != nil {
		a.logger.Error("tls reload failed; the certificates loaded before stay in use", "error", err)
		return err
	}
	a.logger.Info("tls certificates reloaded", "cert_file", a.config.TLS.CertFile, "expires", a.tls.LeafExpiry())
	return nil
}

// Fatal delivers an error that makes the agent unfit to go on (its
// server's data dir belongs to another cluster); nil without a server.
func (a *Agent) Fatal() <-chan error {
	if a.server == nil {
		return nil
	}
	return a.server.Fatal()
}

// InmemMetrics returns the in-memory metrics sink behind /v1/metrics.
func (a *Agent) InmemMetrics() *metrics.InmemSink { return a.metrics }

// Shutdown stops the HTTP API, then the client, then the server. Safe to
// call twice; returns every error met on the way.
func (a *Agent) Shutdown(ctx context.Context) error {
	a.shutdownOnce.Do(func() {
		var errs []error
		if a.bgCancel != nil {
			a.bgCancel()
		}
		a.wg.Wait()
		if a.http != nil {
			if err := a.http.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("http: %w", err))
			}
		}
		if a.client != nil && a.config.DevMode {
			// Dev mode is ephemeral: its tasks (the CSI plugin job among
			// them) must not outlive the data dir removed below.
			kctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			if err := a.client.KillAllTasks(kctx); err != nil {
				errs = append(errs, fmt.Errorf("client: kill dev tasks: %w", err))
			}
			cancel()
		}
		if a.client != nil {
			if err := a.client.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("client: %w", err))
			}
		}
		if a.server != nil {
			if err := a.server.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("server: %w", err))
			}
		}
		if a.promRegistry != nil && a.config.DataDir != "" && !a.config.DevMode {
			if err := writeExitMetrics(a.promRegistry, a.config.DataDir); err != nil {
				errs = append(errs, err)
			}
		}
		if a.tempDir != "" {
			if err := os.RemoveAll(a.tempDir); err != nil {
				errs = append(errs, fmt.Errorf("remove dev data dir: %w", err))
			}
		}
		a.shutdownErr = errors.Join(errs...)
		a.logger.Info("agent stopped")
	})
	return a.shutdownErr
}

// memberName is the agent's name as shown in members lists.
func (a *Agent) memberName() string {
	if a.config.Name != "" {
		return a.config.Name
	}
	host, _ := os.Hostname()
	return host
}

// portOf returns the numeric port of a host:port string, 0 if none.
func portOf(addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(p))
	return n
}
