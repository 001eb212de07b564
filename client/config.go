package client

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/internal/tlsutil"
	"github.com/roamhq/roam/structs"
)

// Config configures a client.
type Config struct {
	// DataDir keeps the node's identity across restarts. Required.
	DataDir    string
	NodeName   string
	Region     string
	Datacenter string
	NodeClass  string
	Meta       map[string]string
	// HTTPAddr is the agent's advertised HTTP address, recorded on the node.
	HTTPAddr string

	// Servers are RPC addresses of servers to try, in order.
	Servers []string

	// RPCRetryTimeout bounds how long RPC keeps retrying retryable errors
	// (no leader, server unreachable) before giving up.
	RPCRetryTimeout time.Duration
	// MinRetryBackoff and MaxRetryBackoff bound the jittered waits between
	// attempts.
	MinRetryBackoff time.Duration
	MaxRetryBackoff time.Duration
	// DialTimeout bounds one connection attempt.
	DialTimeout time.Duration
	// StopOnClientAfter is how long the client goes without reaching any
	// server (no successful heartbeat) before it kills its allocations
	// that hold CSI volumes and unpublishes their volumes, so that they
	// stop writing before the servers declare the node down and hand the
	// volumes to someone else. Zero never stops them: unsafe, and logged
	// as such. See StopWindow for how it must nest in the servers' window.
	StopOnClientAfter time.Duration
	// DialSource is the IP connections to servers leave from when it is a
	// loopback address (see netutil.Dialer); empty lets the kernel pick.
	DialSource string
	// TLS, when it wraps RPC, makes the client dial servers with TLS and
	// present its certificate. Nil means plain TCP.
	TLS *tlsutil.Configurator

	// DisableRawExec turns the raw_exec driver off: the node does not
	// offer it and starts no task with it. The agent sets it unless its
	// config enables raw_exec (or runs -dev); the library default is on so
	// that tests which build a client directly run tasks.
	DisableRawExec bool
	// RawExecDefaultUser is the account a raw_exec task that names no user
	// runs as; empty means the client's own.
	RawExecDefaultUser string
	// DisableExec turns the exec driver off. Otherwise the node offers it
	// when the host can isolate tasks (root, namespaces, the memory, cpu
	// and pids cgroup controllers), and lists the reason when not.
	DisableExec bool
	// ChrootEnv is what exec tasks see of the host, read-only, host path
	// to path inside the task; nil means Nomad's default list.
	ChrootEnv map[string]string
	// ExecPidsLimit caps the processes of an exec task; 0 means the
	// driver's default.
	ExecPidsLimit int64
	// UserDenylist are accounts exec tasks may not run as.
	UserDenylist []string
	// MinDynamicPort and MaxDynamicPort are the range dynamic ports are
	// picked from on this node; zero means Nomad's 20000-32000.
	MinDynamicPort int
	MaxDynamicPort int
	// CgroupParent is where exec tasks' cgroups are made; empty means
	// /roam.
	CgroupParent string
	// IntroToken is the node introduction credential shown when this node
	// registers for the first time; servers that name client intro tokens
	// refuse a new node without one of them.
	IntroToken string

	// ExecutorPath is the binary the raw_exec driver runs as
	// `<path> executor <spec>` to supervise a task; empty means this
	// process's own executable (the roam binary).
	ExecutorPath string
	// VolumeHook mounts group volumes before tasks start; nil means an
	// allocation that requests volumes fails.
	VolumeHook VolumeHook

	// CSIPlugins are the CSI plugins already running on this host, by
	// plugin ID (the agent's client { csi_plugin "ID" { ... } } blocks).
	CSIPlugins map[string]*CSIPluginConfig
	// CSIFingerprintInterval is how often each CSI plugin is fingerprinted.
	CSIFingerprintInterval time.Duration
	// CSIControllerCallTimeout bounds one controller call on the client.
	// The server's cancellation does not cut a call short, this does.
	CSIControllerCallTimeout time.Duration
	// CSIControllerWait is how long a volume claim keeps retrying while the
	// servers find no reachable controller for its plugin (a controller's
	// node reconnecting after a server restart, or failing over), before
	// the allocation fails for good.
	CSIControllerWait time.Duration
	// CSINodeCallTimeout bounds each node plugin call the client makes on
	// its own (NodeStageVolume, NodePublishVolume, NodeUnpublishVolume,
	// NodeUnstageVolume and the capability checks around them) and the
	// whole of a server's ClientCSI.NodeDetachVolume request, so that a
	// hung node plugin holds up only its own volumes. A call past it fails
	// with an error wrapping structs.ErrCSIUnavailable: it may be retried
	// and may or may not have taken effect. The servers'
	// CSINodeDetachTimeout must be longer, so the answer reaches them.
	CSINodeCallTimeout time.Duration

	Logger hclog.Logger
}

// CSI plugin types: which services of the plugin this client uses.
const (
	CSIPluginTypeController = "controller"
	CSIPluginTypeNode       = "node"
	CSIPluginTypeMonolith   = "monolith"
)

// CSIPluginConfig is one CSI plugin the client talks to.
type CSIPluginConfig struct {
	// ID is the plugin ID volumes name.
	ID string
	// Type is CSIPluginTypeController, CSIPluginTypeNode or
	// CSIPluginTypeMonolith.
	Type string
	// Socket is the absolute path of the plugin's unix socket.
	Socket string
	// AllocID is the allocation of the plugin task that serves it; empty
	// for a plugin run outside Roam. The servers list it as the plugin's.
	AllocID string
	// ControllerConcurrency is how many destructive controller calls the
	// plugin accepts at once, never two on one volume nor two
	// publish/unpublish calls for one node; 0 means 1.
	ControllerConcurrency int
}

// dynamicPorts is the node's dynamic port range.
func (c *Config) dynamicPorts() (lo, hi int) {
	lo, hi = c.MinDynamicPort, c.MaxDynamicPort
	if lo == 0 {
		lo = structs.DefaultMinDynamicPort
	}
	if hi == 0 {
		hi = structs.DefaultMaxDynamicPort
	}
	return lo, hi
}

// Validate names the first bad value.
func (p *CSIPluginConfig) Validate() error {
	switch {
	case p == nil:
		return errors.New("csi plugin config is nil")
	case p.ID == "":
		return errors.New("csi plugin: id is required")
	case structs.ValidateID(structs.IDKindPlugin, p.ID) != nil:
		// The ID names this client's directories for the plugin's volumes.
		return fmt.Errorf("csi plugin: %w", structs.ValidateID(structs.IDKindPlugin, p.ID))
	case p.Type != CSIPluginTypeController && p.Type != CSIPluginTypeNode && p.Type != CSIPluginTypeMonolith:
		return fmt.Errorf("csi plugin %q: type = %q, want controller, node or monolith", p.ID, p.Type)
	case p.Socket == "":
		return fmt.Errorf("csi plugin %q: socket is required", p.ID)
	case p.ControllerConcurrency != 0 && !laneadmit.Valid(p.ControllerConcurrency):
		return fmt.Errorf("csi plugin %q: controller_concurrency = %d must be from %d to %d",
			p.ID, p.ControllerConcurrency, laneadmit.MinLimit, laneadmit.MaxLimit)
	case p.ControllerConcurrency != 0 && !p.hasController():
		return fmt.Errorf("csi plugin %q: controller_concurrency is for a controller or monolith plugin, not type %q", p.ID, p.Type)
	}
	return nil
}

// concurrency is the plugin's controller_concurrency, 1 when unset.
func (p *CSIPluginConfig) concurrency() int {
	return max(laneadmit.MinLimit, p.ControllerConcurrency)
}

func (p *CSIPluginConfig) hasController() bool {
	return p.Type == CSIPluginTypeController || p.Type == CSIPluginTypeMonolith
}

func (p *CSIPluginConfig) hasNode() bool {
	return p.Type == CSIPluginTypeNode || p.Type == CSIPluginTypeMonolith
}

// DefaultConfig returns a client configuration with production timers;
// DataDir and Servers must still be set.
func DefaultConfig() *Config {
	return &Config{
		Region:          structs.DefaultRegion,
		Datacenter:      "dc1",
		RPCRetryTimeout: 30 * time.Second,
		MinRetryBackoff: 50 * time.Millisecond,
		MaxRetryBackoff: 2 * time.Second,
		DialTimeout:     5 * time.Second,

		CSIFingerprintInterval:   30 * time.Second,
		CSIControllerCallTimeout: 2 * time.Minute,
		CSIControllerWait:        time.Minute,
		// Under the servers' default node detach timeout (1m), with room
		// for the answer to get back to them.
		CSINodeCallTimeout: 50 * time.Second,
		// With the default kill timeout (5s) and StopMargin, inside the
		// servers' default window of 20s (see StopWindow).
		StopOnClientAfter: 10 * time.Second,

		Logger: hclog.NewNullLogger(),
	}
}

// TestingT is the part of testing.TB that TestConfig uses, spelled out so
// that this package does not import testing.
type TestingT interface {
	Name() string
	TempDir() string
}

// TestConfig returns a client configuration for tests: its own temp data
// dir, fast retries, warnings logged under the test's name, pointed at
// servers (RPC addresses).
func TestConfig(t TestingT, servers ...string) *Config {
	c := DefaultConfig()
	c.DataDir = t.TempDir()
	c.Servers = servers
	c.RPCRetryTimeout = 10 * time.Second
	c.MinRetryBackoff = 10 * time.Millisecond
	c.MaxRetryBackoff = 200 * time.Millisecond
	c.DialTimeout = time.Second
	c.Logger = hclog.New(&hclog.LoggerOptions{
		Name:   t.Name(),
		Level:  hclog.Warn,
		Output: hclog.DefaultOutput,
	})
	return c
}

// Validate names the first bad value.
func (c *Config) Validate() error {
	switch {
	case c.DataDir == "":
		return errors.New("client config: data_dir is required")
	case len(c.Servers) == 0:
		return errors.New("client config: at least one server address is required")
	case c.Datacenter == "":
		return errors.New("client config: datacenter must be set")
	case c.RPCRetryTimeout <= 0:
		return fmt.Errorf("client config: rpc retry timeout = %s, must be positive", c.RPCRetryTimeout)
	case c.MinRetryBackoff <= 0 || c.MaxRetryBackoff < c.MinRetryBackoff:
		return fmt.Errorf("client config: retry backoff %s..%s is not a valid range", c.MinRetryBackoff, c.MaxRetryBackoff)
	case c.DialTimeout <= 0:
		return fmt.Errorf("client config: dial timeout = %s, must be positive", c.DialTimeout)
	case c.CSIFingerprintInterval <= 0:
		return fmt.Errorf("client config: csi fingerprint interval = %s, must be positive", c.CSIFingerprintInterval)
	case c.CSIControllerCallTimeout <= 0:
		return fmt.Errorf("client config: csi controller call timeout = %s, must be positive", c.CSIControllerCallTimeout)
	case c.CSIControllerWait < 0:
		return fmt.Errorf("client config: csi controller wait = %s, must not be negative", c.CSIControllerWait)
	case c.CSINodeCallTimeout <= 0:
		return fmt.Errorf("client config: csi node call timeout = %s, must be positive", c.CSINodeCallTimeout)
	case c.StopOnClientAfter < 0:
		return fmt.Errorf("client config: stop_on_client_after = %s, must not be negative (0 disables it)", c.StopOnClientAfter)
	}
	if lo, hi := c.dynamicPorts(); lo < 1 || hi > 65535 || lo > hi {
		return fmt.Errorf("client config: dynamic port range %d-%d must be within 1-65535, low to high", lo, hi)
	}
	// The servers refuse a node whose name breaks the ID rule: say so at
	// start rather than in a registration retried forever.
	if c.NodeName != "" {
		if err := structs.ValidateID(structs.IDKindNodeName, c.NodeName); err != nil {
			return fmt.Errorf("client config: %w", err)
		}
	}
	for id, p := range c.CSIPlugins {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("client config: %w", err)
		}
		if p.ID != id {
			return fmt.Errorf("client config: csi plugin keyed %q has id %q", id, p.ID)
		}
	}
	return nil
}

// copy returns a copy the client may fill defaults into without changing
// the caller's value.
func (c *Config) copy() *Config {
	n := *c
	n.Servers = append([]string(nil), c.Servers...)
	if c.Meta != nil {
		n.Meta = make(map[string]string, len(c.Meta))
		for k, v := range c.Meta {
			n.Meta[k] = v
		}
	}
	if c.CSIPlugins != nil {
		n.CSIPlugins = make(map[string]*CSIPluginConfig, len(c.CSIPlugins))
		for k, v := range c.CSIPlugins {
			p := *v
			n.CSIPlugins[k] = &p
		}
	}
	return &n
}
