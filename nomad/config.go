package nomad

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/roamhq/roam/internal/tlsutil"
	"github.com/roamhq/roam/structs"
)

// Config configures a server. DefaultConfig works as is for a single dev
// server; Validate names the first bad value and changes nothing.
type Config struct {
	// EventBufferSize is how many Raft indexes' events the server keeps
	// for event stream subscribers (DefaultEventBufferSize when 0). A
	// subscriber further behind than that is cut off with
	// structs.ErrEventsDropped.
	EventBufferSize int

	// ACLEnabled turns on ACL enforcement on every RPC (docs/acl.md).
	ACLEnabled bool
	// EnableDebug lets Agent.Profile serve this server's profiles while
	// ACLs are off (the agent's enable_debug).
	EnableDebug bool
	// Metrics, when set, returns the agent's latest metrics summary, which
	// Agent.Profile serves as JSON.
	Metrics func() (any, error)
	// ACLTokenTTL bounds how long a resolved token is cached; zero means
	// DefaultACLTokenTTL. Any token or policy write empties the cache.
	ACLTokenTTL time.Duration
	// NodeID is the server's Raft ID; persisted in DataDir when empty.
	NodeID string
	// NodeName is the human name shown by members and peers.
	NodeName   string
	Region     string
	Datacenter string

	// DataDir holds the Raft log, stable store and snapshots. Required
	// unless DevMode is set.
	DataDir string
	// DevMode keeps Raft in memory; nothing survives a restart.
	DevMode bool

	// RPCAddr is where the server listens for RPC, Raft and client sessions.
	RPCAddr string
	// RPCAdvertise is the address other agents dial; defaults to the bound
	// listener address.
	RPCAdvertise string
	// DialSource is the IP outgoing RPC and Raft connections leave from
	// when it is a loopback address (see netutil.Dialer); empty lets the
	// kernel pick.
	DialSource string
	// Listener, if set, is used instead of binding RPCAddr: a listener
	// the caller bound itself, or one on an in-memory network.
	Listener net.Listener
	// Dial, if set, opens every outgoing server connection (RPC
	// forwarding, joins, Raft over the RPC port) instead of a TCP dial
	// from DialSource. With Listener it puts the server on another
	// network, such as internal/memnet in unit tests, where links can be
	// cut. TLS, when on, still wraps what it returns.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// RaftTransport, if set, carries Raft instead of the RPC port (for
	// example raft.InmemTransport in unit tests). Its LocalAddr must be
	// the advertised RPC address, which is the Raft address peers know
	// this server by. The server closes it on shutdown, and still vets
	// every RPC that arrives on it.
	RaftTransport RaftTransport

	// BootstrapExpect is how many servers must know each other before the
	// cluster bootstraps. 1 bootstraps a single server at once.
	BootstrapExpect int
	// RetryJoin are RPC addresses of other servers to contact until joined.
	RetryJoin []string

	// OperatorToken, when set, is the token that carries an operator's
	// authority (deregistering any node). Without it only a node itself
	// may deregister; an empty token is never an operator.
	OperatorToken string
	// ClientIntroTokens, when any is set, are the node introduction
	// credentials a new node must show (its client intro_token) to
	// register. Without them any node may register (an unsecured cluster).
	ClientIntroTokens []string
	// JoinInterval is how often servers probe each other.
	JoinInterval time.Duration
	// MemberFailAfter marks a server failed after this long without an answer.
	MemberFailAfter time.Duration

	// DeadServerCleanupAfter removes a voter from the Raft configuration
	// once it has been unreachable this long, if the cluster stays at a
	// quorum-safe size (see deadServersToRemove). Zero turns it off.
	DeadServerCleanupAfter time.Duration

	// RaftMultiplier scales Raft's LAN timers; 1 is the fastest supported.
	RaftMultiplier int
	// RaftConfig is derived from the multiplier; tests may tune it directly.
	RaftConfig *raft.Config
	// RaftSnapshotThreshold and RaftSnapshotInterval override Raft's
	// snapshot cadence when non-zero.
	RaftSnapshotThreshold uint64
	RaftSnapshotInterval  time.Duration

	// MinHeartbeatTTL is the shortest TTL handed to a client.
	MinHeartbeatTTL time.Duration
	// MaxHeartbeatsPerSecond caps the cluster-wide heartbeat rate; TTLs grow
	// with the node count to respect it.
	MaxHeartbeatsPerSecond float64
	// HeartbeatGrace is added to a TTL before a silent node is marked down.
	HeartbeatGrace time.Duration
	// FailoverHeartbeatTTL is the TTL a new leader gives every known node, so
	// a client that died during a leader change is caught within this bound
	// plus HeartbeatGrace.
	FailoverHeartbeatTTL time.Duration

	// LeaveDrainTimeout bounds how long a leader that is shutting down waits
	// for its in-flight controller calls before it hands leadership over.
	LeaveDrainTimeout time.Duration
	// LeaveOnTerminate removes this server from the Raft configuration when
	// it shuts down, after any handoff. Off by default: a server that only
	// restarts keeps its seat and the quorum size stays as it was.
	LeaveOnTerminate bool

	// DrainClaimGrace bounds how long, past a drain's deadline, a node's
	// system allocations (its CSI plugins) wait for the volume claims that
	// name the node to be released before they are stopped anyway.
	DrainClaimGrace time.Duration

	// CSINodeDetachTimeout bounds one ClientCSI.NodeDetachVolume call, the
	// node-side part of releasing a claim, so that a hung node plugin holds
	// up only its own volumes. It must exceed every client's
	// CSINodeCallTimeout, which bounds the same work on the client: a
	// client then answers with its own error (the plugin did not finish)
	// before the server gives up and knows only that the outcome is unknown.
	CSINodeDetachTimeout time.Duration

	// RPCHoldTimeout is how long a request waits for a leader before
	// failing with ErrNoLeader.
	RPCHoldTimeout time.Duration
	// SnapshotMaxBytes bounds a snapshot file the server saves or takes
	// for restore; zero means DefaultSnapshotMaxBytes.
	SnapshotMaxBytes int64

	// RPCMaxFrameBytes bounds one RPC request (header plus body).
	RPCMaxFrameBytes int
	// RPCHandshakeTimeout bounds the wait for a new connection's first byte.
	RPCHandshakeTimeout time.Duration
	// RPCMaxFrameContainers bounds the maps and arrays of one RPC request,
	// counted before it is decoded: decoding costs far more per map than
	// its one byte on the wire.
	RPCMaxFrameContainers int

	// JobLimits bound what a job may ask for; Job.Register refuses a job
	// over them and the scheduler fails the evaluation of a stored one.
	JobLimits structs.JobLimits
	// RPCFrameTimeout bounds reading one frame once its first byte has
	// arrived: an RPC request, a Raft message (a snapshot's data gets one
	// more timeout per 256 KiB), a frame of a client's yamux session. A
	// connection may idle between frames for as long as it likes. Zero
	// means no bound.
	RPCFrameTimeout time.Duration
	// RPCMaxConnsPerClient bounds the connections open at once from one
	// IP address; one over it is closed at once. Servers' Raft and
	// forwarding pools and a client's one session use a few each. Zero
	// means no bound.
	RPCMaxConnsPerClient int

	// TLS, when it wraps RPC, makes the RPC port take TLS connections
	// only, and makes this server dial other servers with TLS. Nil means
	// plain TCP.
	TLS *tlsutil.Configurator

	Logger hclog.Logger

	// leaderDutyFault, when set (tests only), fails a new leader's duties
	// with the error it returns.
	leaderDutyFault func() error
	// schedulerPassHook, when set (tests only), runs at the start of
	// every scheduler pass; a test blocks in it to stand for a long pass
	// that does not look at its context.
	schedulerPassHook func()
}

// FreeClaimsAfter is the shortest time from a node's last heartbeat to the
// moment the leader may mark it down and free its volume claims: a
// heartbeat arms a timer of at least MinHeartbeatTTL, a new leader arms
// FailoverHeartbeatTTL, and HeartbeatGrace is added to either.
func (c *Config) FreeClaimsAfter() time.Duration {
	return min(c.MinHeartbeatTTL, c.FailoverHeartbeatTTL) + c.HeartbeatGrace
}

// DefaultConfig returns a configuration for a single server bound to
// 127.0.0.1:4647 that keeps its data in memory until DataDir is set.
func DefaultConfig() *Config {
	host, _ := os.Hostname()
	return &Config{
		NodeName:               host,
		Region:                 structs.DefaultRegion,
		Datacenter:             "dc1",
		RPCAddr:                "127.0.0.1:4647",
		BootstrapExpect:        1,
		JoinInterval:           time.Second,
		MemberFailAfter:        5 * time.Second,
		DeadServerCleanupAfter: DefaultDeadServerCleanupAfter,
		RaftMultiplier:         1,
		MinHeartbeatTTL:        10 * time.Second,
		MaxHeartbeatsPerSecond: 50,
		HeartbeatGrace:         10 * time.Second,
		FailoverHeartbeatTTL:   20 * time.Second,
		RPCHoldTimeout:         5 * time.Second,
		LeaveDrainTimeout:      30 * time.Second,
		DrainClaimGrace:        time.Minute,
		CSINodeDetachTimeout:   time.Minute,
		RPCMaxFrameBytes:       4 << 20,
		RPCMaxFrameContainers:  structs.DefaultMsgpackMaxContainers,
		JobLimits:              structs.DefaultJobLimits(),
		RPCHandshakeTimeout:    5 * time.Second,
		RPCFrameTimeout:        30 * time.Second,
		RPCMaxConnsPerClient:   100,
		Logger:                 hclog.NewNullLogger(),
	}
}

// TestingT is the part of testing.TB that TestConfig uses. It is spelled
// out so that this package does not import testing: production code
// never links it.
type TestingT interface {
	Name() string
	TempDir() string
}

// TestConfig returns a configuration with fast timers, a temp data dir and
// a port chosen by the kernel, for tests (t is normally a testing.TB).
func TestConfig(t TestingT) *Config {
	c := DefaultConfig()
	c.NodeName = t.Name()
	c.DataDir = t.TempDir()
	c.RPCAddr = "127.0.0.1:0"
	c.JoinInterval = 50 * time.Millisecond
	c.MemberFailAfter = 500 * time.Millisecond
	c.MinHeartbeatTTL = 500 * time.Millisecond
	c.HeartbeatGrace = 250 * time.Millisecond
	c.FailoverHeartbeatTTL = 500 * time.Millisecond
	c.RPCHoldTimeout = 2 * time.Second
	c.CSINodeDetachTimeout = 5 * time.Second
	c.RaftConfig = testRaftConfig()
	c.Logger = hclog.New(&hclog.LoggerOptions{
		Name:   c.NodeName,
		Level:  testLogLevel(),
		Output: hclog.DefaultOutput,
	})
	return c
}

// testRaftConfig is TestConfig's Raft configuration: fast timers, but with
// room for a loaded 2-core CI machine running -race, where shorter ones
// make the leader of a cluster step down.
func testRaftConfig() *raft.Config {
	rc := raft.DefaultConfig()
	rc.HeartbeatTimeout = 250 * time.Millisecond
	rc.ElectionTimeout = 250 * time.Millisecond
	rc.LeaderLeaseTimeout = 125 * time.Millisecond
	rc.CommitTimeout = 5 * time.Millisecond
	return rc
}

// testLogLevel is Warn unless ROAM_TEST_LOG_LEVEL names another level.
func testLogLevel() hclog.Level {
	if l := hclog.LevelFromString(os.Getenv("ROAM_TEST_LOG_LEVEL")); l != hclog.NoLevel {
		return l
	}
	return hclog.Warn
}

// Validate reports the first invalid value, by name.
func (c *Config) Validate() error {
	switch {
	case c == nil:
		return errors.New("config: missing")
	case c.Region == "":
		return errors.New("config: region must be set")
	case c.Datacenter == "":
		return errors.New("config: datacenter must be set")
	case !c.DevMode && c.DataDir == "":
		return errors.New("config: data_dir is required outside dev mode")
	case c.Listener == nil && c.RPCAddr == "":
		return errors.New("config: rpc address must be set")
	case c.BootstrapExpect < 0:
		return fmt.Errorf("config: bootstrap_expect = %d, must not be negative", c.BootstrapExpect)
	case c.BootstrapExpect == 0 && len(c.RetryJoin) == 0:
		return errors.New("config: bootstrap_expect = 0 needs retry_join addresses to join an existing cluster")
	case c.RaftMultiplier < 1 || c.RaftMultiplier > 10:
		return fmt.Errorf("config: raft_multiplier = %d, must be between 1 and 10", c.RaftMultiplier)
	case c.MinHeartbeatTTL <= 0:
		return fmt.Errorf("config: min heartbeat ttl = %s, must be positive", c.MinHeartbeatTTL)
	case c.MaxHeartbeatsPerSecond <= 0:
		return fmt.Errorf("config: max heartbeats per second = %v, must be positive", c.MaxHeartbeatsPerSecond)
	case c.HeartbeatGrace < 0:
		return fmt.Errorf("config: heartbeat grace = %s, must not be negative", c.HeartbeatGrace)
	case c.FailoverHeartbeatTTL <= 0:
		return fmt.Errorf("config: failover heartbeat ttl = %s, must be positive", c.FailoverHeartbeatTTL)
	case c.DrainClaimGrace < 0:
		return fmt.Errorf("config: drain claim grace = %s, must not be negative", c.DrainClaimGrace)
	case c.CSINodeDetachTimeout <= 0:
		return fmt.Errorf("config: csi node detach timeout = %s, must be positive", c.CSINodeDetachTimeout)
	case c.LeaveDrainTimeout < 0:
		return fmt.Errorf("config: leave drain timeout = %s, must not be negative", c.LeaveDrainTimeout)
	case c.RPCHoldTimeout <= 0:
		return fmt.Errorf("config: rpc hold timeout = %s, must be positive", c.RPCHoldTimeout)
	case c.RPCMaxFrameBytes < 1024:
		return fmt.Errorf("config: rpc max frame bytes = %d, must be at least 1024", c.RPCMaxFrameBytes)
	case c.RPCMaxFrameContainers < 1:
		return fmt.Errorf("config: rpc max frame containers = %d, must be positive", c.RPCMaxFrameContainers)
	case c.JobLimits.Validate() != nil:
		return fmt.Errorf("config: %w", c.JobLimits.Validate())
	case c.RPCHandshakeTimeout <= 0:
		return fmt.Errorf("config: rpc handshake timeout = %s, must be positive", c.RPCHandshakeTimeout)
	case c.RPCFrameTimeout < 0:
		return fmt.Errorf("config: rpc frame timeout = %s, must not be negative", c.RPCFrameTimeout)
	case c.RPCMaxConnsPerClient < 0:
		return fmt.Errorf("config: rpc max conns per client = %d, must not be negative", c.RPCMaxConnsPerClient)
	case c.JoinInterval <= 0:
		return fmt.Errorf("config: join interval = %s, must be positive", c.JoinInterval)
	case c.MemberFailAfter <= c.JoinInterval:
		return fmt.Errorf("config: member fail after = %s, must exceed the join interval %s", c.MemberFailAfter, c.JoinInterval)
	case c.DeadServerCleanupAfter < 0:
		return fmt.Errorf("config: dead server cleanup after = %s, must not be negative", c.DeadServerCleanupAfter)
	case c.DeadServerCleanupAfter > 0 && c.DeadServerCleanupAfter <= c.MemberFailAfter:
		return fmt.Errorf("config: dead server cleanup after = %s, must exceed the member fail time %s", c.DeadServerCleanupAfter, c.MemberFailAfter)
	}
	return nil
}

// raftConfig returns the Raft configuration, scaled by RaftMultiplier unless
// one was given explicitly.
func (c *Config) raftConfig() *raft.Config {
	var rc raft.Config
	if c.RaftConfig != nil {
		rc = *c.RaftConfig
	} else {
		rc = *raft.DefaultConfig()
		m := time.Duration(c.RaftMultiplier)
		rc.HeartbeatTimeout *= m
		rc.ElectionTimeout *= m
		rc.LeaderLeaseTimeout *= m
	}
	if c.RaftSnapshotThreshold > 0 {
		rc.SnapshotThreshold = c.RaftSnapshotThreshold
	}
	if c.RaftSnapshotInterval > 0 {
		rc.SnapshotInterval = c.RaftSnapshotInterval
	}
	rc.LocalID = raft.ServerID(c.NodeID)
	rc.Logger = c.Logger.Named("raft")
	return &rc
}
