package nomad

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/rpc"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/yamux"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/client"
	"github.com/roamhq/roam/structs"
)

// testAgentClient starts a real client agent pointed at servers and shuts
// it down when the test ends, before the servers.
func testAgentClient(t *testing.T, servers ...string) *client.Client {
	t.Helper()
	c, err := client.NewClient(client.TestConfig(t, servers...))
	must.NoError(t, err)
	t.Cleanup(func() { _ = c.Shutdown(context.Background()) })
	return c
}

// waitNodeSession waits until s holds (want) or does not hold a session for
// nodeID.
func waitNodeSession(t *testing.T, s *Server, nodeID string, want bool) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool {
			_, ok := s.nodeSession(nodeID)
			return ok == want
		}),
		wait.Timeout(10*time.Second),
		wait.Gap(10*time.Millisecond),
	), must.Sprintf("server %s: session for node %s present = %v", s.ID(), nodeID, !want))
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestClientRPC_PingConnectedNode(t *testing.T) {
	s := testServer(t, nil)
	waitForLeaderDuties(t, s)
	c := testAgentClient(t, s.Addr())
	waitNodeSession(t, s, c.NodeID(), true)

	var resp structs.ClientStatusPingResponse
	must.NoError(t, s.clientRPC(testCtx(t), c.NodeID(), "ClientStatus.Ping", &structs.GenericRequest{}, &resp))
	must.Eq(t, c.NodeID(), resp.NodeID)

	// The client's own handler errors come back mapped.
	err := s.clientRPC(testCtx(t), c.NodeID(), "ClientStatus.Nope", &structs.GenericRequest{}, &resp)
	must.ErrorIs(t, err, structs.ErrUnknownMethod)
	must.False(t, errors.Is(err, structs.ErrNodeNotConnected))

	// A service registered later is served too.
	must.NoError(t, c.RegisterRPC("Echo", &echoService{}))
	var out string
	must.NoError(t, s.clientRPC(testCtx(t), c.NodeID(), "Echo.Say", "hello", &out))
	must.Eq(t, "hello", out)
}

type echoService struct{}

func (e *echoService) Say(args string, reply *string) error { *reply = args; return nil }

func (e *echoService) Fail(args string, reply *string) error {
	return fmt.Errorf("boom: %w", structs.ErrNotFound)
}

func TestClientRPC_ForwardedToServerHoldingSession(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	leader := waitForLeader(t, servers...)
	follower := followers(servers)[0]

	c := testAgentClient(t, follower.Addr())
	must.NoError(t, c.RegisterRPC("Echo", &echoService{}))
	waitNodeSession(t, follower, c.NodeID(), true)
	_, ok := leader.nodeSession(c.NodeID())
	must.False(t, ok)

	var resp structs.ClientStatusPingResponse
	must.NoError(t, leader.clientRPC(testCtx(t), c.NodeID(), "ClientStatus.Ping", &structs.GenericRequest{}, &resp))
	must.Eq(t, c.NodeID(), resp.NodeID)

	var out string
	must.NoError(t, leader.clientRPC(testCtx(t), c.NodeID(), "Echo.Say", "via follower", &out))
	must.Eq(t, "via follower", out)

	// A handler error survives the relay as its sentinel.
	err := leader.clientRPC(testCtx(t), c.NodeID(), "Echo.Fail", "x", &out)
	must.ErrorIs(t, err, structs.ErrNotFound)
	must.False(t, errors.Is(err, structs.ErrNodeNotConnected))

	// An expired caller deadline ends the call.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = leader.clientRPC(ctx, c.NodeID(), "Echo.Say", "late", &out)
	must.ErrorIs(t, err, context.Canceled)
}

func TestClientRPC_UnknownNode(t *testing.T) {
	t.Parallel()
	servers := testMemCluster(t, 3).servers
	leader := waitForLeader(t, servers...)
	var resp structs.ClientStatusPingResponse
	err := leader.clientRPC(testCtx(t), "00000000-0000-0000-0000-000000000000", "ClientStatus.Ping", &structs.GenericRequest{}, &resp)
	must.ErrorIs(t, err, structs.ErrNodeNotConnected)
	must.False(t, structs.IsRetryable(err))
}

func TestClientRPC_ClientShutdownRemovesSession(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	leader := waitForLeader(t, servers...)
	follower := followers(servers)[0]

	c := testAgentClient(t, follower.Addr())
	nodeID := c.NodeID()
	waitNodeSession(t, follower, nodeID, true)
	must.NoError(t, c.Shutdown(context.Background()))
	waitNodeSession(t, follower, nodeID, false)

	var resp structs.ClientStatusPingResponse
	for _, s := range []*Server{follower, leader} {
		err := s.clientRPC(testCtx(t), nodeID, "ClientStatus.Ping", &structs.GenericRequest{}, &resp)
		must.ErrorIs(t, err, structs.ErrNodeNotConnected)
	}
}

// rawSession opens a yamux session to s as a client would and returns an
// RPC client on its first stream.
func rawSession(t *testing.T, s *Server) (*yamux.Session, *rpc.Client) {
	t.Helper()
	conn, err := net.Dial("tcp", s.Addr())
	must.NoError(t, err)
	_, err = conn.Write([]byte{structs.RPCMultiplex})
	must.NoError(t, err)
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = nil
	cfg.Logger = hclogYamux{hclog.NewNullLogger()}
	session, err := yamux.Client(conn, cfg)
	must.NoError(t, err)
	t.Cleanup(func() { session.Close() })
	stream, err := session.Open()
	must.NoError(t, err)
	_, err = stream.Write([]byte{structs.RPCNomad})
	must.NoError(t, err)
	rc := rpc.NewClientWithCodec(structs.NewClientCodec(stream))
	t.Cleanup(func() { rc.Close() })
	return session, rc
}

func TestClientRPC_SessionRecordedOnlyAfterAuth(t *testing.T) {
	s := testServer(t, nil)
	waitForLeaderDuties(t, s)
	node := testNode("auth")
	registerNode(t, s, node)

	session, rc := rawSession(t, s)
	var resp structs.NodeUpdateResponse
	err := rc.Call("Node.UpdateStatus", &structs.NodeUpdateStatusRequest{
		NodeID:       node.ID,
		Status:       structs.NodeStatusReady,
		WriteRequest: structs.WriteRequest{AuthToken: "not-the-secret"},
	}, &resp)
	must.ErrorIs(t, structs.FromRPCError(err), structs.ErrPermissionDenied)
	_, ok := s.nodeSession(node.ID)
	must.False(t, ok)

	// Registering a known node with another secret is refused too.
	impostor := node.Copy()
	impostor.SecretID = "another-secret"
	err = rc.Call("Node.Register", &structs.NodeRegisterRequest{Node: impostor}, &resp)
	must.ErrorIs(t, structs.FromRPCError(err), structs.ErrPermissionDenied)
	_, ok = s.nodeSession(node.ID)
	must.False(t, ok)

	// The node's own secret records this very session.
	must.NoError(t, rc.Call("Node.UpdateStatus", &structs.NodeUpdateStatusRequest{
		NodeID:       node.ID,
		Status:       structs.NodeStatusReady,
		WriteRequest: structs.WriteRequest{AuthToken: node.SecretID},
	}, &resp))
	got, ok := s.nodeSession(node.ID)
	must.True(t, ok)
	must.Eq(t, session.LocalAddr().String(), got.RemoteAddr().String())

	// A node may not use the server to reach other nodes.
	var fwd structs.ClientRPCForwardResponse
	err = rc.Call("ClientRPC.Forward", &structs.ClientRPCForwardRequest{NodeID: node.ID, Method: "ClientStatus.Ping"}, &fwd)
	must.ErrorIs(t, structs.FromRPCError(err), structs.ErrPermissionDenied)

	// Closing the session forgets it.
	must.NoError(t, session.Close())
	waitNodeSession(t, s, node.ID, false)
}

func TestClientRPC_HasNodeConn(t *testing.T) {
	s := testServer(t, nil)
	waitForLeaderDuties(t, s)
	c := testAgentClient(t, s.Addr())
	waitNodeSession(t, s, c.NodeID(), true)

	var resp structs.NodeConnQueryResponse
	must.NoError(t, s.RPC("Status.HasNodeConn", &structs.NodeSpecificRequest{NodeID: c.NodeID()}, &resp))
	must.True(t, resp.Connected)
	must.False(t, resp.Established.IsZero())

	resp = structs.NodeConnQueryResponse{}
	must.NoError(t, s.RPC("Status.HasNodeConn", &structs.NodeSpecificRequest{NodeID: "nope"}, &resp))
	must.False(t, resp.Connected)

	var fwd structs.ClientRPCForwardResponse
	err := s.RPC("ClientRPC.Forward", &structs.ClientRPCForwardRequest{NodeID: "nope", Method: "ClientStatus.Ping"}, &fwd)
	must.ErrorIs(t, err, structs.ErrNodeNotConnected)
}

// blockingEcho answers only once released, after saying it started.
type blockingEcho struct {
	started chan struct{}
	release chan struct{}
}

func (e *blockingEcho) Hold(args string, reply *string) error {
	close(e.started)
	<-e.release
	*reply = args
	return nil
}

// A call cut short after it reached the client (here: the server relaying
// it shuts down mid-call) has an unknown outcome: a retryable error, not
// "not connected", which would send a controller call to the next node
// while this one may still be running.
func TestClientRPC_RelayLostMidCallIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	leader := waitForLeaderDuties(t, servers...)
	relay := followers(servers)[0]
	c := testAgentClient(t, relay.Addr())
	svc := &blockingEcho{started: make(chan struct{}), release: make(chan struct{})}
	must.NoError(t, c.RegisterRPC("Slow", svc))
	waitNodeSession(t, relay, c.NodeID(), true)
	t.Cleanup(func() { close(svc.release) })

	done := make(chan error, 1)
	go func() {
		var out string
		done <- leader.clientRPC(testCtx(t), c.NodeID(), "Slow.Hold", "x", &out)
	}()
	<-svc.started
	go func() { _ = relay.Shutdown(context.Background()) }()
	err := <-done
	must.ErrorIs(t, err, structs.ErrOutcomeUnknown)
	must.True(t, structs.IsRetryable(err))
	must.False(t, errors.Is(err, structs.ErrNodeNotConnected), must.Sprint(err))
	must.False(t, controllerUnavailable(err), must.Sprint("an unknown outcome must not move on to the next controller"))
}

// A server that never answers (cut off by a partition, say) must not hold
// up a relayed call once another server has said it holds the node's
// session: before, every relayed call waited the whole hold timeout for
// the silent server, one call at a time in the plugin's lane.
func TestPickNodeServer_SilentServerDoesNotHoldTheCall(t *testing.T) {
	s := &Server{logger: hclog.NewNullLogger()}
	established := time.Now()
	query := func(ctx context.Context, addr string) (structs.NodeConnQueryResponse, error) {
		switch addr {
		case "holder":
			return structs.NodeConnQueryResponse{Connected: true, Established: established}, nil
		case "other":
			return structs.NodeConnQueryResponse{}, nil
		default: // "silent": answers only when given up on
			<-ctx.Done()
			return structs.NodeConnQueryResponse{}, ctx.Err()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		addr string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		addr, err := s.pickNodeServer(ctx, "n1", []string{"silent", "holder", "other"}, 50*time.Millisecond, query)
		done <- result{addr, err}
	}()
	select {
	case r := <-done:
		must.NoError(t, r.err)
		must.Eq(t, "holder", r.addr)
	case <-time.After(10 * time.Second):
		t.Fatal("pickNodeServer waited for the silent server although another holds the session")
	}
}

// Within the grace, the newest session still wins: a client that moved
// leaves a dying session on its old server, which may answer first.
func TestPickNodeServer_NewestSessionWins(t *testing.T) {
	s := &Server{logger: hclog.NewNullLogger()}
	old, moved := time.Now().Add(-time.Minute), time.Now()
	oldAnswered := make(chan struct{})
	query := func(ctx context.Context, addr string) (structs.NodeConnQueryResponse, error) {
		if addr == "old" {
			defer close(oldAnswered)
			return structs.NodeConnQueryResponse{Connected: true, Established: old}, nil
		}
		<-oldAnswered // the newer session's server answers second
		return structs.NodeConnQueryResponse{Connected: true, Established: moved}, nil
	}
	addr, err := s.pickNodeServer(context.Background(), "n1", []string{"new", "old"}, 10*time.Second, query)
	must.NoError(t, err)
	must.Eq(t, "new", addr)
}

// No server holding the session is "not connected", naming a server that
// failed to answer; a caller's deadline ends the wait.
func TestPickNodeServer_NoneHoldsIt(t *testing.T) {
	s := &Server{logger: hclog.NewNullLogger()}
	query := func(ctx context.Context, addr string) (structs.NodeConnQueryResponse, error) {
		switch addr {
		case "down":
			return structs.NodeConnQueryResponse{}, errors.New("dial refused")
		case "silent":
			<-ctx.Done()
			return structs.NodeConnQueryResponse{}, ctx.Err()
		}
		return structs.NodeConnQueryResponse{}, nil
	}
	_, err := s.pickNodeServer(context.Background(), "n1", []string{"down", "other"}, time.Second, query)
	must.ErrorIs(t, err, structs.ErrNodeNotConnected)
	must.StrContains(t, err.Error(), "dial refused")

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = s.pickNodeServer(ctx, "n1", []string{"silent", "other"}, time.Second, query)
	must.ErrorIs(t, err, context.DeadlineExceeded)

	// A caller already gone hears that, not "not connected", even when
	// there is no other server to ask.
	done, stop := context.WithCancel(context.Background())
	stop()
	_, err = s.pickNodeServer(done, "n1", nil, time.Second, query)
	must.ErrorIs(t, err, context.Canceled)
	must.False(t, errors.Is(err, structs.ErrNodeNotConnected), must.Sprint(err))
}
