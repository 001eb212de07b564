package nomad

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	metrics "github.com/hashicorp/go-metrics"
	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/yamux"
	"github.com/roamhq/roam/internal/connlimit"
	"github.com/roamhq/roam/internal/fsutil"
	"github.com/roamhq/roam/internal/ratelog"
	"github.com/roamhq/roam/nomad/csiclaim"
	"github.com/roamhq/roam/nomad/raftlog"
	"github.com/roamhq/roam/nomad/raftmeta"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// moveDataDirAside is what to do about a data dir whose Raft state cannot
// be read.
const moveDataDirAside = "if its snapshots or log are damaged, move the data dir aside " +
	"and start this server empty so it rejoins the cluster"

// ErrServerClosed is returned by calls made after Shutdown.
var ErrServerClosed = errors.New("server closed")

// Server is one Roam server agent.
type Server struct {
	// aclCache holds resolved tokens (see ResolveToken).
	aclCache aclCache
	config   *Config
	logger   hclog.Logger

	// events buffers the event stream (/v1/event/stream).
	events *eventBroker

	listener  net.Listener
	advertise string
	// connLimiter counts the connections open per remote address.
	connLimiter *connlimit.Limiter
	// connLog logs refused and failed connections, rate-limited: a scan
	// of the port must not flood the log.
	connLog *ratelog.Logger
	// raftNetLog rate-limits the Raft transport's own per-connection
	// errors, for the same reason.
	raftNetLog *ratelog.Logger
	rpcServer  *structs.RPCServer
	connPool   *connPool
	// queryCancels holds the blocking queries other servers forwarded here,
	// so that each can be ended when its caller leaves.
	queryCancels *queryCancels

	fsm           *FSM
	commands      *commandIndex // Raft's log store, with where its newest commands are (catchUp)
	raft          *raft.Raft
	raftLayer     *raftLayer
	raftTransport *raftTransport
	wal           *raftwal.WAL // nil in dev mode
	walMeta       *raftmeta.Store
	// raftStable holds Raft's term and vote on disk; nil in dev mode.
	raftStable   *raftlog.Stable
	raftNotifyCh chan bool
	// hasRaftState is true once this server belongs to a Raft
	// configuration, from a previous run or a bootstrap.
	hasRaftState atomicBool
	// staleFloor is the applied index the data dir recorded before this
	// start; staleReadsLocal latches once stale reads may be answered from
	// this server's own state (see staleReadable).
	staleFloor, staleCommitAtStart uint64
	staleReadsLocal                atomicBool

	members    *memberList
	heartbeats *heartbeater
	broker     *evalBroker
	// lanes serialize destructive controller calls per plugin; set only
	// while this server leads, bound to the leader's term.
	lanes atomic.Pointer[controllerLanes]
	// claims are the volume claims this leader is working on now.
	claims claimsInFlight
	// publishAges measures, on this server's clock, how long claims have
	// sat in publishing: for its claim walks and its volume watcher.
	publishAges csiclaim.PublishAges
	// forwarding counts writes being held for a leader or forwarded.
	forwarding inFlight
	// plans carries the workers' plans to the one goroutine that applies
	// them (runPlanApplier), one at a time, so each plan's re-check sees
	// every earlier plan's placements without a lock held across the
	// Raft apply.
	plans chan *pendingPlan

	// leaderEvents carries messages to the leadership owner
	// (runLeadership), the one goroutine that starts and stops the
	// leader's duties; see leadership.go. leaderState is its state as it
	// last published it, for readers.
	leaderEvents chan leaderEvent
	leaderState  atomic.Int32
	// leaderChangeCh holds a channel closed and replaced whenever the
	// observed leader changes or duties open or stop, waking requests that
	// wait for a leader. Only the owner replaces it.
	leaderChangeCh atomic.Pointer[chan struct{}]
	// leadership is the leadership changes this server saw.
	leadership leadershipLog

	shutdownCtx    context.Context
	shutdownCancel context.CancelFunc
	shutdownOnce   sync.Once
	shutdownErr    error
	wg             sync.WaitGroup

	// connsMu guards conns, every accepted connection, closed on shutdown.
	connsMu sync.Mutex
	conns   map[net.Conn]struct{}

	// nodeConns maps node IDs to the client sessions held by this server.
	nodeConns *nodeConns

	// snapshots holds snapshot files between the chunk RPCs that move them.
	snapshots snapshotStaging

	// dataDir keeps the data dir's marker; nil in dev mode.
	dataDir *dataDirState
	// memClusterID holds the cluster ID in dev mode (no data dir).
	memClusterID atomic.Value
	// fatalCh carries the error that makes this server unfit to run on
	// (see Fatal).
	fatalCh chan error
}

// NewServer starts a server: it binds the RPC port, opens Raft on the data
// dir, and begins joining or bootstrapping the cluster.
func NewServer(config *Config) (*Server, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	logger := config.Logger.Named("server")
	if err := loadNodeID(config); err != nil {
		return nil, err
	}

	ln := config.Listener
	if ln == nil {
		var err error
		ln, err = net.Listen("tcp", config.RPCAddr)
		if err != nil {
			return nil, fmt.Errorf("server: listen on %s: %w", config.RPCAddr, err)
		}
	}
	advertise := config.RPCAdvertise
	if advertise == "" {
		advertise = ln.Addr().String()
	}
	if host, _, err := net.SplitHostPort(advertise); err != nil || net.ParseIP(host).IsUnspecified() {
		ln.Close()
		return nil, fmt.Errorf("server: advertise address %q must be a routable host:port", advertise)
	}

	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		config:         config,
		logger:         logger,
		advertise:      advertise,
		connLimiter:    connlimit.New(config.RPCMaxConnsPerClient),
		connLog:        ratelog.New(logger, ratelog.DefaultWindow),
		raftNetLog:     ratelog.New(config.Logger.Named("raft-net"), ratelog.DefaultWindow),
		rpcServer:      structs.NewRPCServer(),
		connPool:       newConnPool(config.RPCHoldTimeout, config.DialSource, config.TLS, config.Dial),
		queryCancels:   newQueryCancels(maxTrackedQueries),
		shutdownCtx:    ctx,
		shutdownCancel: cancel,
		conns:          make(map[net.Conn]struct{}),
		nodeConns:      newNodeConns(),
		fatalCh:        make(chan error, 1),
	}
	s.listener = connlimit.Listen(ln, s.connLimiter, s.refuseOverCap)
	s.members = newMemberList(s.selfMember(), config.MemberFailAfter)
	s.heartbeats = newHeartbeater(s)
	s.broker = newEvalBroker()
	s.plans = make(chan *pendingPlan)
	s.leaderEvents = make(chan leaderEvent)
	changed := make(chan struct{})
	s.leaderChangeCh.Store(&changed)

	fsm, err := NewFSM(config.Logger)
	if err != nil {
		s.abortStart()
		return nil, err
	}
	s.fsm = fsm
	fsm.SetApplyHook(s.onApply)
	s.events = newEventBroker(config.EventBufferSize)
	fsm.SetEventBroker(s.events)
	s.registerEndpoints()
	s.rpcServer.SetAuthorizer(s.authorizeRPC)

	if err := s.setupRaft(); err != nil {
		s.abortStart()
		return nil, err
	}

	s.goTracked(s.acceptLoop)
	s.goTracked(s.runLeadership)
	s.goTracked(s.joinLoop)
	if s.config.RaftTransport == nil {
		s.goTracked(func() { s.keepRaftLinks(s.shutdownCtx) })
	}
	logger.Info("server started", "id", config.NodeID, "name", config.NodeName, "rpc_addr", advertise)
	return s, nil
}

// abortStart releases what a failed NewServer acquired.
func (s *Server) abortStart() {
	s.shutdownCancel()
	s.connLog.Stop()
	s.raftNetLog.Stop()
	s.listener.Close()
	if s.raftTransport != nil {
		s.raftTransport.Close()
	}
	if s.wal != nil {
		s.wal.Close()
	}
	if s.walMeta != nil {
		s.walMeta.Close()
	}
}

// goTracked runs f in a goroutine owned by the server.
func (s *Server) goTracked(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

// loadNodeID reads the server's ID from its data dir, creating it on first
// start, so a restarted server keeps its Raft identity.
func loadNodeID(c *Config) error {
	if c.NodeID != "" {
		return nil
	}
	if c.DevMode || c.DataDir == "" {
		c.NodeID = uuid.NewString()
		return nil
	}
	dir := filepath.Join(c.DataDir, "server")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("server: create data dir: %w", err)
	}
	path := filepath.Join(dir, "node-id")
	buf, err := os.ReadFile(path)
	switch {
	case err == nil:
		id := strings.TrimSpace(string(buf))
		if _, perr := uuid.Parse(id); perr != nil {
			return fmt.Errorf("server: %s holds %q, not a UUID: %w", path, id, perr)
		}
		c.NodeID = id
		return nil
	case errors.Is(err, os.ErrNotExist):
		id := uuid.NewString()
		if err := fsutil.WriteFileAtomic(path, []byte(id+"\n"), 0o600); err != nil {
			return fmt.Errorf("server: persist node id: %w", err)
		}
		c.NodeID = id
		return nil
	default:
		return fmt.Errorf("server: read node id: %w", err)
	}
}

func (s *Server) setupRaft() error {
	rc := s.config.raftConfig()
	s.raftNotifyCh = make(chan bool, 10)
	rc.NotifyCh = s.raftNotifyCh

	s.raftLayer = newRaftLayer(advertiseAddr(s.advertise), s.config.DialSource, s.config.TLS)
	s.raftLayer.dialFn = s.config.Dial
	inner := s.config.RaftTransport
	if inner == nil {
		inner = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream:  s.raftLayer,
			MaxPool: 3,
			Timeout: 10 * time.Second,
			Logger:  &raftNetLogger{Logger: s.config.Logger.Named("raft-net"), limited: s.raftNetLog},
		})
	} else if got := string(inner.LocalAddr()); got != s.advertise {
		return fmt.Errorf("server: raft transport address %q is not the advertised rpc address %q", got, s.advertise)
	}
	s.raftTransport = newRaftTransport(inner, s.vetRaftRPC)

	var (
		logs   raft.LogStore
		stable raft.StableStore
		snaps  raft.SnapshotStore
	)
	if s.config.DevMode {
		store := raft.NewInmemStore()
		logs, stable = store, store
		snaps = raft.NewInmemSnapshotStore()
	} else {
		dd, err := openDataDir(s.config.DataDir, s.config.Region)
		if err != nil {
			return err
		}
		s.dataDir = dd
		dir := filepath.Join(s.config.DataDir, "raft")
		if err := os.MkdirAll(filepath.Join(dir, "wal"), 0o700); err != nil {
			return fmt.Errorf("server: create raft dir: %w", err)
		}
		// The log's metadata holds Raft's term and vote, written on every
		// election with a sync each: raftmeta syncs once per write where
		// raft-wal's default store syncs twice. Owned here, so that a
		// restart in the same process can lock it again.
		s.walMeta = &raftmeta.Store{}
		walDir := filepath.Join(dir, "wal")
		wal, err := raftwal.Open(walDir, raftwal.WithMetaStore(s.walMeta),
			raftwal.WithSegmentSize(raftlog.SegmentSize), raftwal.WithLogger(s.config.Logger.Named("raft-wal")))
		if err != nil {
			s.walMeta.Close()
			return fmt.Errorf("server: open raft log: %w", err)
		}
		s.wal = wal
		// The first append that fails stops the server (see raftlog):
		// the restart reopens the log from disk.
		// So does a term Raft cannot write, once armed (the end of
		// setupRaft), where Raft would panic.
		s.raftStable = raftlog.NewStable(wal, walDir, s.fatal)
		logs, stable = raftlog.New(wal, walDir, s.fatal), s.raftStable
		if raftLogGuardDisabled() {
			s.logger.Warn(EnvDisableRaftLogGuard + "=1: a failed raft log write does not stop this server")
			logs = wal
		}
		fss, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, s.config.Logger.Named("raft-snap"))
		if err != nil {
			return fmt.Errorf("server: open snapshot store: %w", err)
		}
		snaps = fss
		if err := s.dataDir.checkRaft(s.config.DataDir, logs, snaps); err != nil {
			return err
		}
	}

	commands, err := newCommandIndex(logs)
	if err != nil {
		if s.dataDir != nil {
			return fmt.Errorf("%w: read the raft log on %s: %w; %s", ErrDataDirDamaged, s.config.DataDir, err, moveDataDirAside)
		}
		return fmt.Errorf("server: read raft log: %w", err)
	}
	s.commands = commands
	has, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return fmt.Errorf("server: inspect raft state: %w", err)
	}
	s.hasRaftState.Store(has)
	// A server without Raft state has no past of its own to fall behind:
	// its stale reads may lag the cluster, as any server's may.
	s.staleReadsLocal.Store(!has)

	r, err := s.newRaft(rc, commands, stable, snaps)
	if errors.Is(err, structs.ErrRaftLogWrite) {
		return fmt.Errorf("server: start raft: %w", err) // the disk failed a write; the data dir is whole
	}
	if err != nil {
		if s.dataDir != nil {
			return fmt.Errorf("%w: start raft on %s: %w; %s", ErrDataDirDamaged, s.config.DataDir, err, moveDataDirAside)
		}
		return fmt.Errorf("server: start raft: %w", err)
	}
	s.raft = r
	s.staleCommitAtStart = r.CommitIndex()
	if s.dataDir != nil {
		s.staleFloor = s.dataDir.appliedIndex()
		if err := s.dataDir.record(r.AppliedIndex()); err != nil {
			s.logger.Warn("could not write the data dir marker", "error", err)
		}
		s.goTracked(s.recordAppliedLoop)
		walDir := filepath.Join(s.config.DataDir, "raft", "wal")
		s.goTracked(func() { raftlog.WatchSpace(s.shutdownCtx, walDir, dataDirSpaceInterval, s.logger.Named("raft-log")) })
	}
	if !has && s.config.BootstrapExpect == 1 {
		if err := s.bootstrap([]*structs.ServerMember{s.selfMember()}); err != nil {
			return err
		}
	}
	if s.raftStable != nil {
		s.raftStable.Arm()
	}
	return nil
}

// newRaft starts Raft. Raft panics, on this goroutine, when it cannot
// write back the term it read: that panic is an error here, as a failed
// term write is once Raft runs (raftlog.Stable). Any other panic goes on.
func (s *Server) newRaft(rc *raft.Config, logs raft.LogStore, stable raft.StableStore, snaps raft.SnapshotStore) (r *raft.Raft, err error) {
	defer func() {
		if s.raftStable == nil || s.raftStable.TermWriteFailed() == nil {
			return
		}
		if p := recover(); p != nil {
			r, err = nil, s.raftStable.TermWriteFailed()
		}
	}()
	return raft.NewRaft(rc, s.fsm, logs, stable, snaps, s.raftTransport)
}

// bootstrap starts a new cluster with the given servers as voters. Every
// server that bootstraps does so with the same list, which Raft accepts.
func (s *Server) bootstrap(members []*structs.ServerMember) error {
	var cfg raft.Configuration
	for _, m := range members {
		cfg.Servers = append(cfg.Servers, raft.Server{
			Suffrage: raft.Voter,
			ID:       raft.ServerID(m.ID),
			Address:  raft.ServerAddress(m.Addr),
		})
	}
	if err := s.raft.BootstrapCluster(cfg).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		return fmt.Errorf("server: bootstrap: %w", err)
	}
	s.hasRaftState.Store(true)
	s.logger.Info("cluster bootstrapped", "servers", len(members))
	return nil
}

func (s *Server) selfMember() *structs.ServerMember {
	return &structs.ServerMember{
		ID:         s.config.NodeID,
		Name:       s.config.NodeName,
		Addr:       s.advertise,
		Region:     s.config.Region,
		Datacenter: s.config.Datacenter,
		Status:     structs.MemberAlive,
		Voter:      true,
		Tags:       map[string]string{"build": structs.Version, "raft_vsn": "3"},
	}
}

// acceptLoop accepts connections until the listener closes.
func (s *Server) acceptLoop() {
	for {
		conn, err := s.listener.Accept()
		if err != nil {
			if s.shutdownCtx.Err() != nil {
				return
			}
			s.logger.Error("accept failed", "error", err)
			select {
			case <-time.After(50 * time.Millisecond):
			case <-s.shutdownCtx.Done():
				return
			}
			continue
		}
		if !s.trackConn(conn, true) {
			conn.Close()
			return
		}
		go s.handleConn(conn, nil, connPeer{})
	}
}

// trackConn adds or removes c from the connections Shutdown closes. Adding
// fails once shutdown has begun, so no connection outlives it.
func (s *Server) trackConn(c net.Conn, add bool) bool {
	s.connsMu.Lock()
	defer s.connsMu.Unlock()
	if !add {
		delete(s.conns, c)
		return true
	}
	if s.shutdownCtx.Err() != nil {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

// handleConn reads the protocol byte and serves the connection. Inside a
// yamux session (session non-nil) only RPC streams are allowed, and their
// requests learn the session they came on.
func (s *Server) handleConn(conn net.Conn, session *yamux.Session, peer connPeer) {
	inSession := session != nil
	var b [1]byte
	_ = conn.SetReadDeadline(time.Now().Add(s.config.RPCHandshakeTimeout))
	if _, err := conn.Read(b[:]); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			s.connRejected("handshake_timeout", "rpc connection sent no protocol byte in time; closed",
				"remote", conn.RemoteAddr(), "timeout", s.config.RPCHandshakeTimeout, "in_session", inSession)
		}
		s.closeConn(conn)
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	if !s.requireTLSFirst(conn, b[0], peer, inSession) {
		return
	}

	switch {
	case b[0] == structs.RPCNomad:
		if !inSession && !s.requireServerPeer(conn, peer, "rpc outside a client session") {
			return
		}
		codec := newServerCodec(conn, s.config.RPCMaxFrameBytes)
		codec.maxContainers = s.config.RPCMaxFrameContainers
		codec.frameTimeout = s.config.RPCFrameTimeout
		codec.queries = s.queryCancels
		if inSession {
			codec.session = session
			codec.guard = s.methodGuard(peer)
		}
		s.rpcServer.ServeCodec(codec)
		if codec.frameTimedOut() {
			s.connRejected("frame_timeout", "rpc request not received within the frame timeout; connection closed",
				"remote", conn.RemoteAddr(), "timeout", s.config.RPCFrameTimeout, "in_session", inSession)
		}
		s.trackConn(conn, false)
	case b[0] == structs.RPCRaft && !inSession && s.config.RaftTransport == nil:
		if !s.requireServerPeer(conn, peer, "raft") {
			return
		}
		if s.vetRaftConn(conn) != nil {
			s.closeConn(conn)
			return
		}
		first, err := awaitRaftFrame(conn, s.config.RPCFrameTimeout)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				s.connRejected("frame_timeout", "raft frame not received within the frame timeout; connection closed",
					"remote", conn.RemoteAddr(), "timeout", s.config.RPCFrameTimeout)
			}
			s.closeConn(conn)
			return
		}
		s.trackConn(conn, false) // Raft owns it from here
		s.raftLayer.handoff(s.frameGuard(first, &raftScanner{}, "raft"))
	case b[0] == structs.RPCMultiplex && !inSession:
		if !s.requireSessionPeer(conn, peer) {
			return
		}
		s.serveSession(conn, peer)
	case b[0] == structs.RPCTLS && s.config.TLS.RPC() && !peer.tls && !inSession:
		tconn, tpeer, ok := s.upgradeTLS(conn)
		if ok {
			s.handleConn(tconn, nil, tpeer)
		}
	case b[0] == structs.RPCTLS:
		s.connRejected("tls_not_configured", "tls connection refused: tls is not configured here, or already in use on this connection",
			"remote", conn.RemoteAddr(), "in_session", inSession)
		s.closeConn(conn)
	default:
		s.connRejected("bad_protocol", "unknown protocol byte, closing connection",
			"byte", fmt.Sprintf("0x%02x", b[0]), "remote", conn.RemoteAddr(), "in_session", inSession)
		s.closeConn(conn)
	}
}

// frameGuard bounds each frame read from conn by the frame timeout; kind
// names the protocol in the log.
func (s *Server) frameGuard(conn net.Conn, scanner frameScanner, kind string) net.Conn {
	timeout := s.config.RPCFrameTimeout
	if timeout <= 0 {
		return conn
	}
	return newFrameConn(conn, scanner, timeout, func() {
		s.connRejected("frame_timeout", kind+" frame not received within the frame timeout; connection closed",
			"remote", conn.RemoteAddr(), "timeout", timeout)
	})
}

// refuseOverCap closes a connection from an address that has as many
// open as it may.
func (s *Server) refuseOverCap(c net.Conn) {
	_ = c.Close()
	s.connRejected("over_cap", "rpc connection refused: too many open from one address",
		"remote", c.RemoteAddr(), "limit", s.connLimiter.Max())
}

// connRejected counts a connection closed for misbehaving, by reason, and
// logs it rate-limited.
func (s *Server) connRejected(reason, msg string, args ...any) {
	metrics.IncrCounterWithLabels([]string{"rpc", "conn", "rejected"}, 1,
		[]metrics.Label{{Name: "reason", Value: reason}})
	s.connLog.Warn(msg, args...)
}

func (s *Server) closeConn(c net.Conn) {
	c.Close()
	s.trackConn(c, false)
}

// serveSession serves a client's yamux session: each stream it opens is
// one RPC connection.
func (s *Server) serveSession(conn net.Conn, peer connPeer) {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = nil
	cfg.Logger = hclogYamux{s.logger.Named("yamux")}
	session, err := yamux.Server(s.frameGuard(conn, &yamuxScanner{}, "client session"), cfg)
	if err != nil {
		s.logger.Error("yamux session failed", "error", err)
		s.closeConn(conn)
		return
	}
	defer func() {
		session.Close()
		// Only after Close: nodeConns.add relies on a closed session being
		// removed after it is seen closed.
		s.nodeConns.removeSession(session)
		s.trackConn(conn, false)
	}()
	var streams atomic.Int64
	for {
		stream, err := session.Accept()
		if err != nil {
			return
		}
		if streams.Add(1) > maxSessionStreams {
			streams.Add(-1)
			_ = stream.Close()
			s.connRejected("too_many_streams", "rpc stream refused: too many open on one client session",
				"remote", conn.RemoteAddr(), "limit", maxSessionStreams)
			continue
		}
		go func() {
			defer streams.Add(-1)
			s.handleConn(stream, session, peer)
		}()
	}
}

// maxSessionStreams bounds the RPC streams a client may have open at once
// on its session. A client uses one for all its calls; the servers open
// one per call they make to the client.
const maxSessionStreams = 256

// RPC serves an in-process call, with the same forwarding and checks as
// a remote one.
func (s *Server) RPC(method string, args, reply any) error {
	return s.RPCContext(context.Background(), method, args, reply)
}

// RPCContext is RPC for a caller that may go away: a blocking query, or a
// wait for a leader, ends as soon as ctx does. A write already sent to
// Raft is not undone.
func (s *Server) RPCContext(ctx context.Context, method string, args, reply any) error {
	if s.shutdownCtx.Err() != nil {
		return ErrServerClosed
	}
	codec := &inmemCodec{ctx: ctx, method: method, args: args, reply: reply}
	if err := s.rpcServer.ServeRequest(codec); err != nil {
		return err
	}
	return structs.FromRPCError(codec.err)
}

// waitFuture waits for a Raft future, or until the server shuts down: a
// future raced by Raft's own shutdown may never be answered.
func (s *Server) waitFuture(f raft.Future) error {
	return s.waitFutureCtx(s.shutdownCtx, f)
}

// waitFutureCtx is waitFuture that also gives up when ctx ends (the
// future itself goes on).
func (s *Server) waitFutureCtx(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-s.shutdownCtx.Done():
		return raft.ErrRaftShutdown
	case <-ctx.Done():
		return fmt.Errorf("waiting for raft: %w", ctx.Err())
	}
}

// State returns the state store as of now; callers must not mutate what it
// returns.
func (s *Server) State() *state.StateStore { return s.fsm.State() }

// IsLeader reports whether this server leads the cluster.
func (s *Server) IsLeader() bool { return s.raft.State() == raft.Leader }

// Leader returns the leader's RPC address and ID, empty if none is known.
func (s *Server) Leader() (addr, id string) {
	a, i := s.raft.LeaderWithID()
	return string(a), string(i)
}

// Addr returns the server's advertised RPC address.
func (s *Server) Addr() string { return s.advertise }

// ID returns the server's Raft ID.
func (s *Server) ID() string { return s.config.NodeID }

// Config returns the server's configuration; callers must not change it.
func (s *Server) Config() *Config { return s.config }

// Raft returns the Raft instance, for operator and test use.
func (s *Server) Raft() *raft.Raft { return s.raft }

// Shutdown stops the server: it stops accepting, closes every connection,
// shuts Raft down and closes the log. Committed entries are on disk before
// Raft acknowledged them, so nothing committed is lost. Safe to call twice;
// the second call returns the first call's result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() {
		s.logger.Info("server shutting down")
		// A leader finishes its in-flight controller calls and hands over
		// first, so the cluster does not wait out an election.
		h, err := s.handoff(ctx, "", "", false)
		if err == nil && !s.awaitNextTermCommit(ctx, h.LastIndex, lingerAfterHandoff) {
			s.logger.Debug("new leader's first commit not seen before shutting raft down", "waited", lingerAfterHandoff)
		}
		switch {
		case errors.Is(err, structs.ErrNoLeader):
			// A follower has nothing to hand over.
		case errors.Is(err, errNoTransferTarget):
			// Nobody to hand over to, but the calls in flight still
			// finish and reach their checkpoints before Raft stops. The
			// claim is kept: no duty starts again on the way down.
			s.logger.Info("no other voter to hand leadership to; draining before shutdown")
			start := time.Now()
			if cerr := s.claimLeadership(ctx); cerr == nil {
				t, _ := s.stopDuties(ctx)
				s.stopAndDrain(ctx, start, t, nil)
			}
		case err != nil:
			s.logger.Warn("handoff failed; shutting down without it", "error", err)
		}
		// Writes held while this leader drained, or being forwarded by a
		// follower, finish at the leader rather than fail with the
		// connection pool.
		if err == nil || errors.Is(err, structs.ErrNoLeader) {
			fctx, cancel := context.WithTimeout(ctx, s.config.RPCHoldTimeout)
			if n, err := s.forwarding.waitIdle(fctx); err != nil {
				s.logger.Warn("writes still forwarding at shutdown; they get a retryable error", "writes", n)
			}
			cancel()
		}
		if s.config.LeaveOnTerminate && !errors.Is(err, errNoTransferTarget) {
			lctx, cancel := context.WithTimeout(ctx, s.config.RPCHoldTimeout)
			if err := s.leave(lctx); err != nil {
				s.logger.Warn("could not leave the raft configuration", "error", err)
			}
			cancel()
		}
		s.shutdownCancel()
		var errs []error
		if err := s.listener.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("close listener: %w", err))
		}
		s.connsMu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.connsMu.Unlock()
		s.connPool.Shutdown()

		if err := s.raft.Shutdown().Error(); err != nil {
			errs = append(errs, fmt.Errorf("raft shutdown: %w", err))
		}
		if s.dataDir != nil {
			if err := s.dataDir.record(s.raft.AppliedIndex()); err != nil {
				errs = append(errs, err)
			}
		}
		s.raftLayer.Close()
		if err := s.raftTransport.Close(); err != nil {
			errs = append(errs, fmt.Errorf("raft transport close: %w", err))
		}
		// The leadership owner ended the duties' term when the shutdown
		// context was cancelled; their goroutines are in s.wg.
		done := make(chan struct{})
		go func() { s.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("waiting for server goroutines: %w", ctx.Err()))
		}
		s.connLog.Stop()
		s.raftNetLog.Stop()
		if s.wal != nil {
			if err := s.wal.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close raft log: %w", err))
			}
			if err := s.walMeta.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close raft log metadata: %w", err))
			}
		}
		s.shutdownErr = errors.Join(errs...)
	})
	return s.shutdownErr
}
