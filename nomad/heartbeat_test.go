package nomad

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/nomad/heartbeatlag"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// registerNodeRetry registers n through s as a client agent does: a
// retryable error (no leader yet, or the leader's duties not started) is
// tried again, anything else fails the test.
func registerNodeRetry(t *testing.T, s *Server, n *structs.Node) *structs.NodeUpdateResponse {
	t.Helper()
	var resp structs.NodeUpdateResponse
	var fatal error
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			resp = structs.NodeUpdateResponse{}
			err := s.RPC("Node.Register", &structs.NodeRegisterRequest{Node: n.Copy()}, &resp)
			if err != nil && !structs.IsRetryable(err) {
				fatal = err
				return nil
			}
			return err
		}),
		wait.Timeout(10*time.Second),
		wait.Gap(10*time.Millisecond),
	))
	must.NoError(t, fatal)
	return &resp
}

// withLongHeartbeats gives nodes TTLs far longer than any test, so no
// timer writes to state, or is mid-write when the test's servers shut down.
func withLongHeartbeats(c *Config) {
	c.MinHeartbeatTTL = time.Minute
	c.FailoverHeartbeatTTL = time.Minute
}

// withSteadyRaft lengthens Raft's timers for tests about something other
// than elections. With the test defaults (250 ms), a loaded -race run can
// let a follower time out mid-test and take leadership, or contest the
// first election just as the test starts.
func withSteadyRaft(c *Config) {
	c.RaftConfig.HeartbeatTimeout = time.Second
	c.RaftConfig.ElectionTimeout = time.Second
	c.RaftConfig.LeaderLeaseTimeout = 500 * time.Millisecond
}

// waitForLeaderDuties waits for a leader, as waitForLeader does, and then
// until it has started its leader duties. Raft reports leadership before
// establishLeadership's barrier has been applied; until then writes that
// arm heartbeat timers fail, and a shutdown can hang on that barrier.
func waitForLeaderDuties(t *testing.T, servers ...*Server) *Server {
	t.Helper()
	leader := waitForLeader(t, servers...)
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(leader.heartbeats.running),
		wait.Timeout(10*time.Second),
		wait.Gap(5*time.Millisecond),
	), must.Sprint("leader never started its duties"))
	return leader
}

// heartbeat sends one Node.UpdateStatus for n, authenticated as n.
func heartbeat(s *Server, n *structs.Node, status string) (*structs.NodeUpdateResponse, error) {
	var resp structs.NodeUpdateResponse
	err := s.RPC("Node.UpdateStatus", &structs.NodeUpdateStatusRequest{
		NodeID:       n.ID,
		Status:       status,
		WriteRequest: structs.WriteRequest{AuthToken: n.SecretID},
	}, &resp)
	return &resp, err
}

// nodeStatusIs returns a condition that holds once s's state shows the
// node with the given status.
func nodeStatusIs(s *Server, nodeID, status string) func() error {
	return func() error {
		n, err := s.State().NodeByID(nil, nodeID)
		if err != nil {
			return err
		}
		if n == nil {
			return fmt.Errorf("node %s not in state", nodeID)
		}
		if n.Status != status {
			return fmt.Errorf("node %s is %q, want %q", nodeID, n.Status, status)
		}
		return nil
	}
}

func mustGetNode(t *testing.T, s *Server, id string) *structs.Node {
	t.Helper()
	n, err := s.State().NodeByID(nil, id)
	must.NoError(t, err)
	must.NotNil(t, n, must.Sprintf("node %s not in state", id))
	return n
}

func nodeTableIndex(t *testing.T, s *Server) uint64 {
	t.Helper()
	idx, err := s.State().Index(state.TableNodes)
	must.NoError(t, err)
	return idx
}

func TestHeartbeat_MissedHeartbeatMarksNodeDown(t *testing.T) {
	t.Parallel()
	srv := testServer(t, nil)
	cfg := srv.Config()
	waitForLeaderDuties(t, srv)

	node := testNode("hb")
	reg := registerNodeRetry(t, srv, node)
	must.Positive(t, reg.HeartbeatTTL)
	must.Eq(t, srv.Addr(), reg.LeaderRPCAddr)
	must.SliceNotEmpty(t, reg.Servers)
	must.Eq(t, structs.NodeStatusReady, mustGetNode(t, srv, node.ID).Status)

	hb, err := heartbeat(srv, node, structs.NodeStatusReady)
	must.NoError(t, err)
	must.Positive(t, hb.HeartbeatTTL)
	must.GreaterEq(t, cfg.MinHeartbeatTTL, hb.HeartbeatTTL)
	// A heartbeat that changes nothing writes nothing: it reports the
	// node's own index.
	must.Eq(t, reg.Index, hb.Index)

	// Silence: the node is marked down within its TTL plus the grace.
	bound := hb.HeartbeatTTL + cfg.HeartbeatGrace + time.Second
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(nodeStatusIs(srv, node.ID, structs.NodeStatusDown)),
		wait.Timeout(bound),
		wait.Gap(10*time.Millisecond),
	), must.Sprintf("node not marked down within TTL %s + grace %s + 1s", hb.HeartbeatTTL, cfg.HeartbeatGrace))
	down := mustGetNode(t, srv, node.ID)
	must.Greater(t, reg.Index, down.ModifyIndex)

	// The node comes back with its next heartbeat.
	back, err := heartbeat(srv, node, structs.NodeStatusReady)
	must.NoError(t, err)
	must.Positive(t, back.HeartbeatTTL)
	must.Greater(t, down.ModifyIndex, back.Index)
	ready := mustGetNode(t, srv, node.ID)
	must.Eq(t, structs.NodeStatusReady, ready.Status)
	must.Eq(t, back.Index, ready.ModifyIndex)
	must.Eq(t, down.CreateIndex, ready.CreateIndex)

	// Leave with no timer armed, so none fires while the server shuts down.
	_, err = heartbeat(srv, node, structs.NodeStatusDown)
	must.NoError(t, err)
}

func TestHeartbeat_RegularHeartbeatsKeepNodeReady(t *testing.T) {
	t.Parallel()
	srv := testServer(t, nil)
	cfg := srv.Config()
	waitForLeaderDuties(t, srv)

	node := testNode("steady")
	reg := registerNodeRetry(t, srv, node)

	// A client heartbeating well inside its TTL, as a client agent does.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		ticker := time.NewTicker(cfg.MinHeartbeatTTL / 5)
		defer ticker.Stop()
		for {
			select {
			case <-ticker.C:
				if _, err := heartbeat(srv, node, structs.NodeStatusReady); err != nil {
					done <- err
					return
				}
			case <-ctx.Done():
				done <- nil
				return
			}
		}
	}()
	t.Cleanup(cancel)

	// For several TTLs plus grace, the node is never marked down: its
	// ModifyIndex stays that of the registration.
	must.Wait(t, wait.ContinualSuccess(
		wait.ErrorFunc(func() error {
			n := mustGetNode(t, srv, node.ID)
			if n.Status != structs.NodeStatusReady || n.ModifyIndex != reg.Index {
				return fmt.Errorf("node changed: status %q at index %d", n.Status, n.ModifyIndex)
			}
			return nil
		}),
		wait.Timeout(2*(cfg.MinHeartbeatTTL+cfg.HeartbeatGrace)),
		wait.Gap(20*time.Millisecond),
	))
	cancel()
	must.NoError(t, <-done)

	// Leave with no timer armed, so none fires while the server shuts down.
	_, err := heartbeat(srv, node, structs.NodeStatusDown)
	must.NoError(t, err)
}

func TestHeartbeat_ClientReportsDown(t *testing.T) {
	t.Parallel()
	srv := testServer(t, nil)
	cfg := srv.Config()
	waitForLeaderDuties(t, srv)

	node := testNode("leaving")
	registerNodeRetry(t, srv, node)
	resp, err := heartbeat(srv, node, structs.NodeStatusDown)
	must.NoError(t, err)
	// A node that says it is down gets no TTL: nothing is waiting for it.
	must.Zero(t, resp.HeartbeatTTL)
	downAt := mustGetNode(t, srv, node.ID)
	must.Eq(t, structs.NodeStatusDown, downAt.Status)

	// Its timer is gone, so nothing writes to it again after the TTL and
	// grace it would have had.
	must.Wait(t, wait.ContinualSuccess(
		wait.ErrorFunc(func() error {
			if n := mustGetNode(t, srv, node.ID); n.ModifyIndex != downAt.ModifyIndex {
				return fmt.Errorf("node written again at %d", n.ModifyIndex)
			}
			return nil
		}),
		wait.Timeout(cfg.MinHeartbeatTTL+cfg.HeartbeatGrace+200*time.Millisecond),
		wait.Gap(20*time.Millisecond),
	))
}

func TestHeartbeat_UpdateStatusRejected(t *testing.T) {
	// A long TTL keeps timers from writing while state is compared.
	srv := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, srv)

	node := testNode("target")
	other := testNode("other")
	registerNodeRetry(t, srv, node)
	registerNodeRetry(t, srv, other)

	cases := []struct {
		name    string
		req     structs.NodeUpdateStatusRequest
		wantErr error
	}{
		{
			name:    "wrong token",
			req:     structs.NodeUpdateStatusRequest{NodeID: node.ID, Status: structs.NodeStatusDown, WriteRequest: structs.WriteRequest{AuthToken: "not-the-secret"}},
			wantErr: structs.ErrPermissionDenied,
		},
		{
			name:    "no token",
			req:     structs.NodeUpdateStatusRequest{NodeID: node.ID, Status: structs.NodeStatusDown},
			wantErr: structs.ErrPermissionDenied,
		},
		{
			name:    "another node's secret",
			req:     structs.NodeUpdateStatusRequest{NodeID: node.ID, Status: structs.NodeStatusDown, WriteRequest: structs.WriteRequest{AuthToken: other.SecretID}},
			wantErr: structs.ErrPermissionDenied,
		},
		{
			name:    "unknown node",
			req:     structs.NodeUpdateStatusRequest{NodeID: "00000000-0000-0000-0000-000000000000", Status: structs.NodeStatusDown, WriteRequest: structs.WriteRequest{AuthToken: node.SecretID}},
			wantErr: structs.ErrUnknownNode,
		},
		{
			name:    "invalid status",
			req:     structs.NodeUpdateStatusRequest{NodeID: node.ID, Status: "bogus", WriteRequest: structs.WriteRequest{AuthToken: node.SecretID}},
			wantErr: structs.ErrInvalidRequest,
		},
		{
			name:    "empty status",
			req:     structs.NodeUpdateStatusRequest{NodeID: node.ID, WriteRequest: structs.WriteRequest{AuthToken: node.SecretID}},
			wantErr: structs.ErrInvalidRequest,
		},
		{
			name:    "missing node id",
			req:     structs.NodeUpdateStatusRequest{Status: structs.NodeStatusDown, WriteRequest: structs.WriteRequest{AuthToken: node.SecretID}},
			wantErr: structs.ErrInvalidRequest,
		},
		{
			name:    "wrong region",
			req:     structs.NodeUpdateStatusRequest{NodeID: node.ID, Status: structs.NodeStatusDown, WriteRequest: structs.WriteRequest{Region: "elsewhere", AuthToken: node.SecretID}},
			wantErr: structs.ErrWrongRegion,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := mustGetNode(t, srv, node.ID)
			beforeIndex := nodeTableIndex(t, srv)

			var resp structs.NodeUpdateResponse
			err := srv.RPC("Node.UpdateStatus", &tc.req, &resp)
			must.Error(t, err)
			must.True(t, errors.Is(err, tc.wantErr), must.Sprintf("got %v, want %v", err, tc.wantErr))

			after := mustGetNode(t, srv, node.ID)
			must.Eq(t, before.ModifyIndex, after.ModifyIndex)
			must.Eq(t, before.Status, after.Status)
			must.Eq(t, beforeIndex, nodeTableIndex(t, srv))
		})
	}

	// The node itself may still heartbeat.
	_, err := heartbeat(srv, node, structs.NodeStatusReady)
	must.NoError(t, err)
}

func TestHeartbeat_RegisterRejected(t *testing.T) {
	srv := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, srv)

	node := testNode("owner")
	other := testNode("other")
	first := registerNodeRetry(t, srv, node)
	registerNodeRetry(t, srv, other)

	cases := []struct {
		name    string
		node    func() *structs.Node
		wantErr error
	}{
		{
			name: "existing id with another secret",
			node: func() *structs.Node {
				n := node.Copy()
				n.SecretID = "impostor-secret"
				n.Name = "impostor"
				return n
			},
			wantErr: structs.ErrPermissionDenied,
		},
		{
			name: "new id with another node's secret",
			node: func() *structs.Node {
				n := testNode("thief")
				n.SecretID = node.SecretID
				return n
			},
			wantErr: structs.ErrPermissionDenied,
		},
		{
			name: "missing secret",
			node: func() *structs.Node {
				n := node.Copy()
				n.SecretID = ""
				return n
			},
			wantErr: structs.ErrInvalidRequest,
		},
		{
			name: "invalid status",
			node: func() *structs.Node {
				n := node.Copy()
				n.Status = "bogus"
				return n
			},
			wantErr: structs.ErrInvalidRequest,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nodesBefore, err := srv.State().Nodes(nil)
			must.NoError(t, err)
			beforeIndex := nodeTableIndex(t, srv)

			var resp structs.NodeUpdateResponse
			err = srv.RPC("Node.Register", &structs.NodeRegisterRequest{Node: tc.node()}, &resp)
			must.Error(t, err)
			must.True(t, errors.Is(err, tc.wantErr), must.Sprintf("got %v, want %v", err, tc.wantErr))

			nodesAfter, err := srv.State().Nodes(nil)
			must.NoError(t, err)
			must.Eq(t, nodesBefore, nodesAfter)
			must.Eq(t, beforeIndex, nodeTableIndex(t, srv))
		})
	}

	// The owner re-registers with its own secret: accepted, same node.
	// (CreateIndex is read back rather than taken from the first reply: a
	// first attempt may have committed and still answered ErrNoLeader.)
	before := mustGetNode(t, srv, node.ID)
	again := node.Copy()
	again.Name = "owner-renamed"
	resp := registerNodeRetry(t, srv, again)
	must.Greater(t, first.Index, resp.Index)
	got := mustGetNode(t, srv, node.ID)
	must.Eq(t, "owner-renamed", got.Name)
	must.Eq(t, before.CreateIndex, got.CreateIndex)
	must.Eq(t, node.SecretID, got.SecretID)
}

func TestHeartbeat_NewLeaderMarksSilentNodeDown(t *testing.T) {
	t.Parallel()
	// Regular TTLs far longer than the test: only the failover TTL a new
	// leader arms can mark the node down in time.
	servers := testMemClusterWith(t, 3, func(c *Config) { c.MinHeartbeatTTL = time.Minute }).servers
	leader := waitForLeaderDuties(t, servers...)
	cfg := leader.Config()
	must.Less(t, cfg.MinHeartbeatTTL, cfg.FailoverHeartbeatTTL)

	silent := testNode("silent")
	reg := registerNodeRetry(t, leader, silent)
	must.Greater(t, cfg.FailoverHeartbeatTTL, reg.HeartbeatTTL)
	must.Eq(t, structs.NodeStatusReady, mustGetNode(t, leader, silent.ID).Status)

	must.NoError(t, leader.Shutdown(context.Background()))
	var rest []*Server
	for _, s := range servers {
		if s != leader {
			rest = append(rest, s)
		}
	}
	// The bound runs from when the last leader took over: a leader that
	// loses leadership in turn (this happens on a loaded machine) takes its
	// timers with it, and the next one re-arms them. Only a failure while
	// the same leader held on in the same term fails the test.
	bound := cfg.FailoverHeartbeatTTL + cfg.HeartbeatGrace + time.Second
	var newLeader *Server
	for attempt := 1; ; attempt++ {
		newLeader = waitForLeaderDuties(t, rest...)
		must.NotEq(t, leader.ID(), newLeader.ID())
		term := newLeader.Raft().Stats()["term"]
		err := wait.InitialSuccess(
			wait.ErrorFunc(nodeStatusIs(newLeader, silent.ID, structs.NodeStatusDown)),
			wait.Timeout(bound),
			wait.Gap(10*time.Millisecond),
		).Run()
		if err == nil {
			break
		}
		if newLeader.IsLeader() && newLeader.Raft().Stats()["term"] == term {
			t.Fatalf("leader %s did not mark the node down within failover TTL %s + grace %s + 1s: %v",
				newLeader.ID(), cfg.FailoverHeartbeatTTL, cfg.HeartbeatGrace, err)
		}
		must.Less(t, 3, attempt, must.Sprint("leadership kept moving"))
		t.Logf("leadership moved during the wait (attempt %d); the bound restarts", attempt)
	}
	down := mustGetNode(t, newLeader, silent.ID)
	must.Greater(t, reg.Index, down.ModifyIndex)

	// The node heartbeats again through the follower, which forwards to
	// the new leader, and is ready again.
	follower := followers(rest)[0]
	back, err := heartbeat(follower, silent, structs.NodeStatusReady)
	must.NoError(t, err)
	must.Positive(t, back.HeartbeatTTL)
	must.NotEq(t, "", back.LeaderRPCAddr)
	must.NotEq(t, leader.Addr(), back.LeaderRPCAddr)
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(nodeStatusIs(follower, silent.ID, structs.NodeStatusReady)),
		wait.Timeout(5*time.Second),
		wait.Gap(10*time.Millisecond),
	))
}

// After the duties open, a new leader arms the failover TTL for every
// known node, but a node that heartbeated in the meantime keeps the timer
// its heartbeat set, and a term that has ended arms nothing.
func TestHeartbeat_ArmKnownAfterDuties(t *testing.T) {
	s := testServer(t, nil)
	waitForLeaderDuties(t, s)
	early, late := testNode("early"), testNode("late")
	registerNodeRetry(t, s, early)
	registerNodeRetry(t, s, late)

	h := s.heartbeats
	timerOf := func(id string) *nodeTimer {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.timers[id]
	}
	h.mu.Lock()
	ctx := h.ctx
	h.mu.Unlock()
	// late has no timer yet (as if the new leader had not armed it);
	// early heartbeated, and has its own.
	h.clear(late.ID)
	heartbeatTimer := timerOf(early.ID)
	must.NotNil(t, heartbeatTimer)

	// A term that has ended arms nothing.
	must.NoError(t, h.armKnown(context.Background()))
	must.Nil(t, timerOf(late.ID), must.Sprint("a stale term armed a timer"))

	must.NoError(t, h.armKnown(ctx))
	must.NotNil(t, timerOf(late.ID), must.Sprint("known node left without a timer"))
	// Pointer identity: timers compare deeply equal.
	must.True(t, heartbeatTimer == timerOf(early.ID), must.Sprint("the heartbeat's timer was replaced by the failover TTL"))
}

// lagConfig gives TTLs long enough that a heartbeat can be sent late
// (after its TTL, inside the grace) on purpose, with room either side.
func lagConfig(c *Config) {
	c.MinHeartbeatTTL = time.Second
	c.HeartbeatGrace = time.Second
	c.FailoverHeartbeatTTL = time.Second
}

// heartbeatEvery heartbeats n until ctx ends, each heartbeat after(ttl)
// after the answer to the one before.
func heartbeatEvery(ctx context.Context, s *Server, n *structs.Node, first time.Duration, after func(ttl time.Duration) time.Duration, errs chan<- error) {
	next := first
	for {
		timer := time.NewTimer(next)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		resp, err := heartbeat(s, n, structs.NodeStatusReady)
		if err != nil {
			errs <- err
			return
		}
		next = after(resp.HeartbeatTTL)
	}
}

// A leader whose heartbeats arrive late, many of them, is behind: a node
// whose timer runs out then is not marked down at once but has its TTL
// extended, heartbeatlag.MaxExtensions times at most, and is marked down
// after that if it stays silent. The late nodes are never marked down.
func TestHeartbeat_BehindLeaderExtendsBeforeMarkingDown(t *testing.T) {
	t.Parallel()
	srv := testServer(t, lagConfig)
	cfg := srv.Config()
	waitForLeaderDuties(t, srv)

	silent := testNode("silent")
	late := make([]*structs.Node, 2*heartbeatlag.MinLate)
	for i := range late {
		late[i] = testNode(fmt.Sprintf("late-%d", i))
		registerNodeRetry(t, srv, late[i])
	}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, len(late))
	var wg sync.WaitGroup
	for _, n := range late {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Half way through the grace: late, yet in time.
			heartbeatEvery(ctx, srv, n, 0, func(ttl time.Duration) time.Duration { return ttl + cfg.HeartbeatGrace/2 }, errs)
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	registerNodeRetry(t, srv, silent)

	// Its timer runs out while the others' heartbeats come late: extended.
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return srv.heartbeats.extensions.Load() >= 1 }),
		wait.Timeout(4*(cfg.MinHeartbeatTTL+cfg.HeartbeatGrace)),
		wait.Gap(10*time.Millisecond),
	), must.Sprint("no TTL was extended while the leader was behind"))
	must.NoError(t, nodeStatusIs(srv, silent.ID, structs.NodeStatusReady)())

	// Still silent after every extension: marked down after all.
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(nodeStatusIs(srv, silent.ID, structs.NodeStatusDown)),
		wait.Timeout(time.Duration(heartbeatlag.MaxExtensions+3)*(cfg.FailoverHeartbeatTTL+cfg.HeartbeatGrace)),
		wait.Gap(20*time.Millisecond),
	))
	must.LessEq(t, int64(heartbeatlag.MaxExtensions), srv.heartbeats.extensions.Load())
	for _, n := range late {
		must.NoError(t, nodeStatusIs(srv, n.ID, structs.NodeStatusReady)(), must.Sprint("a late node was marked down"))
	}
	select {
	case err := <-errs:
		t.Fatalf("heartbeat: %v", err)
	default:
	}
}

// A zone outage is not a slow leader: the other nodes heartbeat on time,
// so the silent ones are marked down within their TTL and grace, with no
// extension.
func TestHeartbeat_ZoneOutageIsNotALateLeader(t *testing.T) {
	t.Parallel()
	srv := testServer(t, lagConfig)
	cfg := srv.Config()
	waitForLeaderDuties(t, srv)

	live := make([]*structs.Node, 2*heartbeatlag.MinLate)
	for i := range live {
		live[i] = testNode(fmt.Sprintf("live-%d", i))
		registerNodeRetry(t, srv, live[i])
	}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, len(live))
	var wg sync.WaitGroup
	for _, n := range live {
		wg.Add(1)
		go func() {
			defer wg.Done()
			heartbeatEvery(ctx, srv, n, 0, func(ttl time.Duration) time.Duration { return ttl / 2 }, errs)
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	zone := make([]*structs.Node, 5)
	for i := range zone {
		zone[i] = testNode(fmt.Sprintf("zone-%d", i))
		registerNodeRetry(t, srv, zone[i])
	}
	bound := cfg.MinHeartbeatTTL*5/4 + cfg.HeartbeatGrace + time.Second
	for _, n := range zone {
		must.Wait(t, wait.InitialSuccess(
			wait.ErrorFunc(nodeStatusIs(srv, n.ID, structs.NodeStatusDown)),
			wait.Timeout(bound),
			wait.Gap(10*time.Millisecond),
		), must.Sprintf("node %s of the lost zone not down within %s", n.Name, bound))
	}
	must.Eq(t, int64(0), srv.heartbeats.extensions.Load())
	for _, n := range live {
		must.NoError(t, nodeStatusIs(srv, n.ID, structs.NodeStatusReady)())
	}
	select {
	case err := <-errs:
		t.Fatalf("heartbeat: %v", err)
	default:
	}
}
