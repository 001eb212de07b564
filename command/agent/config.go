package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/roamhq/roam/client"
	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/internal/tlsutil"
	"github.com/roamhq/roam/nomad"
	"github.com/roamhq/roam/structs"
)

// Config is the agent's configuration: HCL files in the shape of Nomad's
// agent config, then command-line flags on top. Unknown attributes and
// blocks are errors that name the file, line and attribute.
type Config struct {
	DataDir    string `hcl:"data_dir,optional"`
	BindAddr   string `hcl:"bind_addr,optional"`
	Name       string `hcl:"name,optional"`
	Region     string `hcl:"region,optional"`
	Datacenter string `hcl:"datacenter,optional"`
	LogLevel   string `hcl:"log_level,optional"`
	// LeaveOnTerminate makes a server leave the Raft configuration when it
	// shuts down (after handing leadership over, if it led).
	LeaveOnTerminate bool `hcl:"leave_on_terminate,optional"`
	// InsecureBind lets an agent without TLS bind a non-loopback address:
	// its RPC and HTTP ports then take anyone on the network at their
	// word (see docs/trust.md). Without it such an agent refuses to start.
	InsecureBind bool `hcl:"insecure_bind,optional"`
	// EnableDebug serves Go's profiles at /debug/pprof/ on the HTTP port
	// (Nomad's option); with ACLs on, only to a token with agent:write.
	EnableDebug bool          `hcl:"enable_debug,optional"`
	Ports       *Ports        `hcl:"ports,block"`
	Advertise   *Advertise    `hcl:"advertise,block"`
	Server      *ServerConfig `hcl:"server,block"`
	Client      *ClientConfig `hcl:"client,block"`
	Limits      *Limits       `hcl:"limits,block"`
	TLS         *TLSConfig    `hcl:"tls,block"`
	ACL         *ACLConfig    `hcl:"acl,block"`
	// Plugins configure task drivers: plugin "raw_exec" { config { ... } }.
	Plugins []*PluginConfig `hcl:"plugin,block"`

	// DevMode runs server and client in one process with in-memory Raft.
	DevMode bool
	// DevCSIPlugin makes a dev agent with both halves run the built-in
	// hostpath CSI plugin as a system job, started from this agent's own
	// executable (`roam plugin csi-hostpath`). `roam agent -dev` sets it;
	// a program that embeds the agent and is not roam (a test binary)
	// leaves it off. Not settable from a config file.
	DevCSIPlugin bool
	// RaftTimers, if set, replaces the server's Raft heartbeat and
	// election timeouts and leader lease; raft_multiplier then does not
	// scale them. A lone server waits one to two heartbeat timeouts for
	// an election it wins at once, so a program that starts many
	// single-server agents (a test binary) shortens them; in a cluster,
	// timers shorter than the network and the machines' load allow make
	// leaders step down. Not settable from a config file.
	RaftTimers *RaftTimers
}

// RaftTimers are a server's Raft timers (see Config.RaftTimers).
type RaftTimers struct {
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
}

// minRaftTimer is the shortest timer Raft accepts.
const minRaftTimer = 5 * time.Millisecond

// validate names the first timer Raft would refuse.
func (r *RaftTimers) validate() error {
	switch {
	case r.HeartbeatTimeout < minRaftTimer:
		return fmt.Errorf("config: raft heartbeat timeout = %s, must be at least %s", r.HeartbeatTimeout, minRaftTimer)
	case r.ElectionTimeout < r.HeartbeatTimeout:
		return fmt.Errorf("config: raft election timeout = %s, must be at least the heartbeat timeout (%s)", r.ElectionTimeout, r.HeartbeatTimeout)
	case r.LeaderLeaseTimeout < minRaftTimer:
		return fmt.Errorf("config: raft leader lease timeout = %s, must be at least %s", r.LeaderLeaseTimeout, minRaftTimer)
	case r.LeaderLeaseTimeout > r.HeartbeatTimeout:
		return fmt.Errorf("config: raft leader lease timeout = %s, must not exceed the heartbeat timeout (%s)", r.LeaderLeaseTimeout, r.HeartbeatTimeout)
	}
	return nil
}

// ACLConfig turns ACLs on (docs/acl.md). Every agent of a cluster, servers
// and clients, should have the same setting.
type ACLConfig struct {
	Enabled bool `hcl:"enabled,optional"`
	// TokenTTL bounds how long a resolved token is cached (a duration);
	// writes to tokens or policies empty the cache anyway.
	TokenTTL string `hcl:"token_ttl,optional"`
}

// aclEnabled reports whether the config turns ACLs on.
func (c *Config) aclEnabled() bool { return c.ACL != nil && c.ACL.Enabled }

// Ports are the agent's listening ports.
type Ports struct {
	HTTP int `hcl:"http,optional"`
	RPC  int `hcl:"rpc,optional"`
}

// Advertise are the addresses other agents use to reach this one.
type Advertise struct {
	HTTP string `hcl:"http,optional"`
	RPC  string `hcl:"rpc,optional"`
}

// TLSConfig is the tls block, in the shape of Nomad's: http and rpc turn
// TLS on for each port; the files are PEM.
type TLSConfig struct {
	HTTP                 bool   `hcl:"http,optional"`
	RPC                  bool   `hcl:"rpc,optional"`
	CAFile               string `hcl:"ca_file,optional"`
	CertFile             string `hcl:"cert_file,optional"`
	KeyFile              string `hcl:"key_file,optional"`
	VerifyServerHostname bool   `hcl:"verify_server_hostname,optional"`
	VerifyHTTPSClient    bool   `hcl:"verify_https_client,optional"`
}

// tlsConfig is the tls block as tlsutil takes it; zero when there is none.
func (c *Config) tlsConfig() tlsutil.Config {
	if c.TLS == nil {
		return tlsutil.Config{}
	}
	return tlsutil.Config{
		HTTP:                 c.TLS.HTTP,
		RPC:                  c.TLS.RPC,
		CAFile:               c.TLS.CAFile,
		CertFile:             c.TLS.CertFile,
		KeyFile:              c.TLS.KeyFile,
		VerifyServerHostname: c.TLS.VerifyServerHostname,
		VerifyHTTPSClient:    c.TLS.VerifyHTTPSClient,
		Region:               c.Region,
	}
}

// ServerConfig is the server block.
type ServerConfig struct {
	Enabled         bool        `hcl:"enabled,optional"`
	BootstrapExpect int         `hcl:"bootstrap_expect,optional"`
	ServerJoin      *ServerJoin `hcl:"server_join,block"`
	RaftMultiplier  int         `hcl:"raft_multiplier,optional"`
	// Durations, as Go duration strings ("10s").
	HeartbeatGrace       string `hcl:"heartbeat_grace,optional"`
	MinHeartbeatTTL      string `hcl:"min_heartbeat_ttl,optional"`
	FailoverHeartbeatTTL string `hcl:"failover_heartbeat_ttl,optional"`
	// LeaveDrainTimeout bounds how long a departing leader waits for its
	// in-flight controller calls before handing leadership over.
	LeaveDrainTimeout string `hcl:"leave_drain_timeout,optional"`
	// MaxRPCFrameBytes bounds one RPC request.
	MaxRPCFrameBytes int `hcl:"max_rpc_frame_bytes,optional"`
	// DeadServerCleanupAfter removes a server unreachable this long from
	// the Raft configuration ("0" turns it off; default "24h").
	DeadServerCleanupAfter string `hcl:"dead_server_cleanup_after,optional"`
	// CSINodeDetachTimeout bounds the server's ClientCSI.NodeDetachVolume
	// call to a client; it must exceed the clients' csi_node_call_timeout.
	CSINodeDetachTimeout string `hcl:"csi_node_detach_timeout,optional"`
	// OperatorToken is the token with an operator's authority (for now:
	// deregistering any node). Unset, only a node deregisters itself.
	OperatorToken string `hcl:"operator_token,optional"`
	// ClientIntroTokens, when set, are the tokens a new node must show
	// (its client intro_token) to register.
	ClientIntroTokens []string `hcl:"client_intro_tokens,optional"`
	// EventBufferSize is how many Raft indexes' events the server keeps
	// for /v1/event/stream (nomad.DefaultEventBufferSize when 0, at most
	// maxEventBufferSize).
	EventBufferSize int `hcl:"event_buffer_size,optional"`
}

// maxEventBufferSize bounds server.event_buffer_size.
const maxEventBufferSize = 1 << 20

// ServerJoin is the server_join block.
type ServerJoin struct {
	RetryJoin     []string `hcl:"retry_join,optional"`
	RetryInterval string   `hcl:"retry_interval,optional"`
}

// ClientConfig is the client block.
type ClientConfig struct {
	Enabled   bool              `hcl:"enabled,optional"`
	Servers   []string          `hcl:"servers,optional"`
	NodeClass string            `hcl:"node_class,optional"`
	Meta      map[string]string `hcl:"meta,optional"`
	// CSIPlugins are CSI plugins already running on the host:
	// csi_plugin "ID" { type = "node" socket = "/path" }.
	CSIPlugins []*CSIPluginConfig `hcl:"csi_plugin,block"`
	// CSINodeCallTimeout bounds each node plugin call the client makes
	// (stage, publish, unpublish, unstage) and a server's whole
	// NodeDetachVolume request, as a Go duration string.
	CSINodeCallTimeout string `hcl:"csi_node_call_timeout,optional"`
	// StopOnClientAfter is how long the client goes without reaching any
	// server before it kills its allocations that hold CSI volumes and
	// unpublishes them ("0s" never does: unsafe). It must nest inside the
	// servers' window; see validateStopWindow and the README.
	StopOnClientAfter string `hcl:"stop_on_client_after,optional"`
	// IntroToken is this node's introduction credential, shown when it
	// registers for the first time.
	IntroToken string `hcl:"intro_token,optional"`
	// MinDynamicPort and MaxDynamicPort bound the ports the scheduler picks
	// for dynamic port labels on this node (Nomad's 20000-32000 unset).
	MinDynamicPort int `hcl:"min_dynamic_port,optional"`
	MaxDynamicPort int `hcl:"max_dynamic_port,optional"`
	// ChrootEnv is what exec tasks see of the host, read-only: host path =
	// path inside the task. Unset, Nomad's default list.
	ChrootEnv map[string]string `hcl:"chroot_env,optional"`
	// Options are Nomad's client options; only "user.denylist" (accounts
	// exec tasks may not run as, comma-separated; default "root") is known.
	Options map[string]string `hcl:"options,optional"`
}

// PluginConfig is a plugin "NAME" { config { ... } } block, for
// raw_exec or exec.
type PluginConfig struct {
	Name   string              `hcl:"name,label"`
	Config *PluginConfigValues `hcl:"config,block"`
}

// PluginConfigValues is a plugin's config block.
type PluginConfigValues struct {
	// Enabled turns the driver on or off; raw_exec is off by default
	// outside -dev, exec on wherever the host can isolate tasks.
	Enabled *bool `hcl:"enabled,optional"`
	// DefaultUser is the account a task that names no user runs as;
	// unset, such a task runs as the agent's user.
	DefaultUser string `hcl:"default_user,optional"`
}

// CSIPluginConfig is a client's csi_plugin block.
type CSIPluginConfig struct {
	ID string `hcl:"id,label"`
	// Type is controller, node or monolith.
	Type string `hcl:"type"`
	// Socket is the absolute path of the plugin's unix socket.
	Socket string `hcl:"socket"`
	// ControllerConcurrency is how many destructive controller calls the
	// plugin accepts at once (default 1).
	ControllerConcurrency *int `hcl:"controller_concurrency,optional"`
}

// DefaultConfig is the configuration before any file or flag.
func DefaultConfig() *Config {
	return &Config{
		// Loopback until the operator says otherwise: an agent without TLS
		// must not be reachable from the network by default.
		BindAddr:   "127.0.0.1",
		Region:     "global",
		Datacenter: "dc1",
		LogLevel:   "INFO",
		Ports:      &Ports{HTTP: 4646, RPC: 4647},
		Advertise:  &Advertise{},
		Server:     &ServerConfig{ServerJoin: &ServerJoin{}},
		Client:     &ClientConfig{},
		Limits:     DefaultLimits(),
	}
}

// DevConfig is DefaultConfig for `roam agent -dev`: server and client in
// one process on the loopback address, Raft in memory.
func DevConfig() *Config {
	c := DefaultConfig()
	c.DevMode = true
	c.BindAddr = "127.0.0.1"
	c.LogLevel = "DEBUG"
	c.Server.Enabled = true
	c.Server.BootstrapExpect = 1
	c.Client.Enabled = true
	on := true
	c.Plugins = []*PluginConfig{{Name: "raw_exec", Config: &PluginConfigValues{Enabled: &on}}}
	return c
}

// TestingT is the part of testing.TB that TestConfig uses.
type TestingT interface {
	Name() string
	TempDir() string
}

// TestConfig returns a dev agent config for tests: named for the test,
// bound to 127.0.0.1 on ports the kernel chooses, its data dir in
// t.TempDir(). Its server bootstraps alone, with RaftTimers short enough
// that it leads within tens of milliseconds rather than the one to two
// seconds of the LAN timers; a lone voter is its own quorum, so it never
// loses its lease. A test that joins it to other servers sets RaftTimers
// back to nil.
func TestConfig(t TestingT) *Config {
	c := DevConfig()
	c.Name = strings.ReplaceAll(t.Name(), "/", "-")
	c.BindAddr = "127.0.0.1"
	c.Ports = &Ports{HTTP: 0, RPC: 0}
	c.DataDir = t.TempDir()
	c.LogLevel = "INFO"
	c.RaftTimers = &RaftTimers{
		HeartbeatTimeout:   20 * time.Millisecond,
		ElectionTimeout:    20 * time.Millisecond,
		LeaderLeaseTimeout: 20 * time.Millisecond,
	}
	return c
}

// LoadConfigFile parses one HCL file. Errors name file:line and the reason.
func LoadConfigFile(path string) (*Config, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return ParseConfig(path, src)
}

// ParseConfig parses HCL source; filename is used in error messages.
func ParseConfig(filename string, src []byte) (*Config, error) {
	parser := hclparse.NewParser()
	file, diags := parser.ParseHCL(src, filename)
	if diags.HasErrors() {
		return nil, diagError(diags)
	}
	var c Config
	if diags := gohcl.DecodeBody(file.Body, nil, &c); diags.HasErrors() {
		return nil, diagError(diags)
	}
	if diags := c.validateDurations(file.Body); diags.HasErrors() {
		return nil, diagError(diags)
	}
	return &c, nil
}

// diagError renders HCL diagnostics as "file:line,col: summary; detail".
func diagError(diags hcl.Diagnostics) error {
	var msgs []string
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		pos := ""
		if d.Subject != nil {
			pos = fmt.Sprintf("%s:%d,%d: ", d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column)
		}
		msg := pos + d.Summary
		if d.Detail != "" {
			msg += "; " + d.Detail
		}
		msgs = append(msgs, msg)
	}
	return errors.New(strings.Join(msgs, "\n"))
}

// validateDurations checks the duration strings, reporting a bad one at
// its place in the file.
func (c *Config) validateDurations(body hcl.Body) hcl.Diagnostics {
	check := func(value string, positive bool, path ...string) *hcl.Diagnostic {
		if value == "" {
			return nil
		}
		d, err := time.ParseDuration(value)
		if err == nil && d >= 0 && (!positive || d > 0) {
			return nil
		}
		return &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Invalid duration",
			Detail:   fmt.Sprintf("%s = %q is not a valid duration (examples: \"500ms\", \"10s\", \"2m\")", strings.Join(path, "."), value),
			Subject:  attrRange(body, path...),
		}
	}
	var checks []*hcl.Diagnostic
	if s := c.Server; s != nil {
		checks = append(checks,
			check(s.HeartbeatGrace, false, "server", "heartbeat_grace"),
			check(s.MinHeartbeatTTL, true, "server", "min_heartbeat_ttl"),
			check(s.FailoverHeartbeatTTL, true, "server", "failover_heartbeat_ttl"),
			check(s.LeaveDrainTimeout, false, "server", "leave_drain_timeout"),
			check(s.CSINodeDetachTimeout, true, "server", "csi_node_detach_timeout"),
			check(s.DeadServerCleanupAfter, false, "server", "dead_server_cleanup_after"),
		)
		if j := s.ServerJoin; j != nil {
			checks = append(checks, check(j.RetryInterval, true, "server", "server_join", "retry_interval"))
		}
	}
	if a := c.ACL; a != nil {
		checks = append(checks, check(a.TokenTTL, true, "acl", "token_ttl"))
	}
	if cl := c.Client; cl != nil {
		checks = append(checks,
			check(cl.CSINodeCallTimeout, true, "client", "csi_node_call_timeout"),
			check(cl.StopOnClientAfter, false, "client", "stop_on_client_after"),
		)
	}
	var diags hcl.Diagnostics
	for _, d := range checks {
		if d != nil {
			diags = append(diags, d)
		}
	}
	return diags
}

// attrRange finds where the attribute at path (block names, then the
// attribute) is written, or nil if the body is not native HCL syntax.
func attrRange(body hcl.Body, path ...string) *hcl.Range {
	b, ok := body.(*hclsyntax.Body)
	if !ok || len(path) == 0 {
		return nil
	}
	for _, name := range path[:len(path)-1] {
		var next *hclsyntax.Body
		for _, blk := range b.Blocks {
			if blk.Type == name {
				next = blk.Body
			}
		}
		if next == nil {
			return nil
		}
		b = next
	}
	if attr, ok := b.Attributes[path[len(path)-1]]; ok {
		r := attr.SrcRange
		return &r
	}
	return nil
}

// Merge returns c with every value set in o laid over it.
func (c *Config) Merge(o *Config) *Config {
	r := *c
	setStr(&r.DataDir, o.DataDir)
	setStr(&r.BindAddr, o.BindAddr)
	setStr(&r.Name, o.Name)
	setStr(&r.Region, o.Region)
	setStr(&r.Datacenter, o.Datacenter)
	setStr(&r.LogLevel, o.LogLevel)
	r.DevMode = r.DevMode || o.DevMode
	r.DevCSIPlugin = r.DevCSIPlugin || o.DevCSIPlugin
	if o.RaftTimers != nil {
		t := *o.RaftTimers
		r.RaftTimers = &t
	}
	r.LeaveOnTerminate = r.LeaveOnTerminate || o.LeaveOnTerminate
	r.InsecureBind = r.InsecureBind || o.InsecureBind
	r.EnableDebug = r.EnableDebug || o.EnableDebug
	r.Plugins = append(append([]*PluginConfig(nil), r.Plugins...), o.Plugins...)
	if o.ACL != nil {
		a := ACLConfig{}
		if r.ACL != nil {
			a = *r.ACL
		}
		a.Enabled = a.Enabled || o.ACL.Enabled
		setStr(&a.TokenTTL, o.ACL.TokenTTL)
		r.ACL = &a
	}
	if o.Ports != nil {
		p := *r.Ports
		setInt(&p.HTTP, o.Ports.HTTP)
		setInt(&p.RPC, o.Ports.RPC)
		r.Ports = &p
	}
	if o.Advertise != nil {
		a := *r.Advertise
		setStr(&a.HTTP, o.Advertise.HTTP)
		setStr(&a.RPC, o.Advertise.RPC)
		r.Advertise = &a
	}
	if o.Server != nil {
		s := *r.Server
		s.Enabled = s.Enabled || o.Server.Enabled
		setInt(&s.BootstrapExpect, o.Server.BootstrapExpect)
		setInt(&s.RaftMultiplier, o.Server.RaftMultiplier)
		setInt(&s.MaxRPCFrameBytes, o.Server.MaxRPCFrameBytes)
		setStr(&s.HeartbeatGrace, o.Server.HeartbeatGrace)
		setStr(&s.MinHeartbeatTTL, o.Server.MinHeartbeatTTL)
		setStr(&s.FailoverHeartbeatTTL, o.Server.FailoverHeartbeatTTL)
		setStr(&s.LeaveDrainTimeout, o.Server.LeaveDrainTimeout)
		setStr(&s.CSINodeDetachTimeout, o.Server.CSINodeDetachTimeout)
		setStr(&s.DeadServerCleanupAfter, o.Server.DeadServerCleanupAfter)
		setStr(&s.OperatorToken, o.Server.OperatorToken)
		s.ClientIntroTokens = append(append([]string(nil), s.ClientIntroTokens...), o.Server.ClientIntroTokens...)
		if o.Server.ServerJoin != nil {
			j := ServerJoin{}
			if s.ServerJoin != nil {
				j = *s.ServerJoin
			}
			j.RetryJoin = append(append([]string(nil), j.RetryJoin...), o.Server.ServerJoin.RetryJoin...)
			setStr(&j.RetryInterval, o.Server.ServerJoin.RetryInterval)
			s.ServerJoin = &j
		}
		r.Server = &s
	}
	if o.Limits != nil {
		base := r.Limits
		if base == nil {
			base = DefaultLimits()
		}
		r.Limits = base.merge(o.Limits)
	}
	if o.TLS != nil {
		t := TLSConfig{}
		if r.TLS != nil {
			t = *r.TLS
		}
		t.HTTP = t.HTTP || o.TLS.HTTP
		t.RPC = t.RPC || o.TLS.RPC
		t.VerifyServerHostname = t.VerifyServerHostname || o.TLS.VerifyServerHostname
		t.VerifyHTTPSClient = t.VerifyHTTPSClient || o.TLS.VerifyHTTPSClient
		setStr(&t.CAFile, o.TLS.CAFile)
		setStr(&t.CertFile, o.TLS.CertFile)
		setStr(&t.KeyFile, o.TLS.KeyFile)
		r.TLS = &t
	}
	if o.Client != nil {
		cl := *r.Client
		cl.Enabled = cl.Enabled || o.Client.Enabled
		cl.Servers = append(append([]string(nil), cl.Servers...), o.Client.Servers...)
		setStr(&cl.NodeClass, o.Client.NodeClass)
		setStr(&cl.CSINodeCallTimeout, o.Client.CSINodeCallTimeout)
		setStr(&cl.StopOnClientAfter, o.Client.StopOnClientAfter)
		setStr(&cl.IntroToken, o.Client.IntroToken)
		cl.CSIPlugins = append(append([]*CSIPluginConfig(nil), cl.CSIPlugins...), o.Client.CSIPlugins...)
		setInt(&cl.MinDynamicPort, o.Client.MinDynamicPort)
		setInt(&cl.MaxDynamicPort, o.Client.MaxDynamicPort)
		cl.Meta = mergeMap(cl.Meta, o.Client.Meta)
		cl.Options = mergeMap(cl.Options, o.Client.Options)
		if o.Client.ChrootEnv != nil {
			// A chroot_env is the whole list the tasks see, not additions.
			cl.ChrootEnv = o.Client.ChrootEnv
		}
		r.Client = &cl
	}
	return &r
}

// mergeMap is base with over's keys set over it; base is not changed.
func mergeMap(base, over map[string]string) map[string]string {
	if over == nil {
		return base
	}
	m := make(map[string]string, len(base)+len(over))
	for k, v := range base {
		m[k] = v
	}
	for k, v := range over {
		m[k] = v
	}
	return m
}

func setStr(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}

func setInt(dst *int, v int) {
	if v != 0 {
		*dst = v
	}
}

// Validate checks the merged configuration.
func (c *Config) Validate() error {
	switch {
	case !c.Server.Enabled && !c.Client.Enabled:
		return errors.New("config: at least one of server or client must be enabled")
	case c.DataDir == "" && !c.DevMode:
		return errors.New("config: data_dir is required unless running with -dev")
	case net.ParseIP(c.BindAddr) == nil:
		return fmt.Errorf("config: bind_addr = %q is not an IP address", c.BindAddr)
	case c.Ports.HTTP < 0 || c.Ports.HTTP > 65535:
		return fmt.Errorf("config: ports.http = %d is out of range", c.Ports.HTTP)
	case c.Ports.RPC < 0 || c.Ports.RPC > 65535:
		return fmt.Errorf("config: ports.rpc = %d is out of range", c.Ports.RPC)
	case c.Server.Enabled && c.Server.BootstrapExpect < 0:
		return fmt.Errorf("config: server.bootstrap_expect = %d must not be negative", c.Server.BootstrapExpect)
	case c.Client.Enabled && !c.Server.Enabled && len(c.Client.Servers) == 0:
		return errors.New("config: a client without a local server needs client.servers")
	}
	switch strings.ToUpper(c.LogLevel) {
	case "TRACE", "DEBUG", "INFO", "WARN", "ERROR":
	default:
		return fmt.Errorf("config: log_level = %q, want one of TRACE, DEBUG, INFO, WARN, ERROR", c.LogLevel)
	}
	if c.RaftTimers != nil {
		if err := c.RaftTimers.validate(); err != nil {
			return err
		}
	}
	if c.Limits != nil {
		if err := c.Limits.validate(); err != nil {
			return err
		}
	}
	// Validated even when no listener is on: a verify_ setting alone is
	// a mistake to name.
	tc := c.tlsConfig()
	if err := tc.Validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if err := c.validateTrust(); err != nil {
		return err
	}
	for _, p := range c.Client.CSIPlugins {
		if n := p.ControllerConcurrency; n != nil && !laneadmit.Valid(*n) {
			return fmt.Errorf("config: client.csi_plugin %q: controller_concurrency = %d must be from %d to %d",
				p.ID, *n, laneadmit.MinLimit, laneadmit.MaxLimit)
		}
	}
	if err := c.validateNodeTimeouts(); err != nil {
		return err
	}
	return c.validateStopWindow()
}

// validateStopWindow checks, for an agent that is both server and client,
// that a client cut off from the servers has stopped its claim-holding
// tasks before the servers may free their claims:
//
//	stop_on_client_after + kill timeout + client.StopMargin < min(min_heartbeat_ttl, failover_heartbeat_ttl) + heartbeat_grace
//
// with the default kill timeout; a client-only agent learns the servers'
// window from its heartbeats and checks it against its tasks' own kill
// timeouts at run time (client.StopWindow).
func (c *Config) validateStopWindow() error {
	if !c.Server.Enabled || !c.Client.Enabled {
		return nil
	}
	stop := parseDurationOr(c.Client.StopOnClientAfter, client.DefaultConfig().StopOnClientAfter)
	if stop == 0 {
		return nil // disabled; the client warns at start
	}
	sc := nomad.DefaultConfig()
	sc.MinHeartbeatTTL = parseDurationOr(c.Server.MinHeartbeatTTL, sc.MinHeartbeatTTL)
	sc.FailoverHeartbeatTTL = parseDurationOr(c.Server.FailoverHeartbeatTTL, sc.FailoverHeartbeatTTL)
	sc.HeartbeatGrace = parseDurationOr(c.Server.HeartbeatGrace, sc.HeartbeatGrace)
	free := sc.FreeClaimsAfter()
	if _, _, fits := client.StopWindow(stop, free, structs.DefaultKillTimeout); !fits {
		return fmt.Errorf("config: client.stop_on_client_after = %s + kill timeout %s + margin %s must be less than "+
			"the servers' claim window min(min_heartbeat_ttl, failover_heartbeat_ttl) + heartbeat_grace = %s",
			stop, structs.DefaultKillTimeout, client.StopMargin, free)
	}
	return nil
}

// validateNodeTimeouts checks, for an agent that is both server and client,
// that the server waits longer for a node detach than the client lets the
// plugin work on it: the client must have time to answer with its own
// error. Agents that run only one side cannot see the other's setting; the
// README states the rule for them.
func (c *Config) validateNodeTimeouts() error {
	if !c.Server.Enabled || !c.Client.Enabled {
		return nil
	}
	server := parseDurationOr(c.Server.CSINodeDetachTimeout, nomad.DefaultConfig().CSINodeDetachTimeout)
	node := parseDurationOr(c.Client.CSINodeCallTimeout, client.DefaultConfig().CSINodeCallTimeout)
	if server <= node {
		return fmt.Errorf("config: server.csi_node_detach_timeout = %s must exceed client.csi_node_call_timeout = %s", server, node)
	}
	return nil
}

// rpcAddr is the address the RPC listener binds.
func (c *Config) rpcAddr() string {
	return net.JoinHostPort(c.BindAddr, strconv.Itoa(c.Ports.RPC))
}

// httpAddr is the address the HTTP listener binds.
func (c *Config) httpAddr() string {
	return net.JoinHostPort(c.BindAddr, strconv.Itoa(c.Ports.HTTP))
}

func parseDurationOr(v string, def time.Duration) time.Duration {
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return def // validated at parse time
	}
	return d
}
