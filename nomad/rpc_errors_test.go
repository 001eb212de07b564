package nomad

import (
	"context"
	"errors"
	"fmt"
	"net/rpc"
	"sync/atomic"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// ErrTestRequest names the error errTestService answers with. A write, so
// a follower forwards it to the leader.
type ErrTestRequest struct {
	ID string
	structs.WriteRequest
}

// errTestService answers Fail with the error registered under the
// request's ID, on the leader; calls counts the calls that reached it.
type errTestService struct {
	srv   *Server
	errs  map[string]error
	calls atomic.Int64
}

func (e *errTestService) Fail(args *ErrTestRequest, reply *structs.GenericResponse) error {
	if done, err := e.srv.forward("ErrTest.Fail", args, args, reply); done {
		return err
	}
	e.calls.Add(1)
	return e.errs[args.ID]
}

// sentinelErrors is one error per sentinel, wrapped as handlers do, plus
// errors whose text quotes a sentinel they do not wrap.
func sentinelErrors() map[string]error {
	errs := map[string]error{
		"quotes no leader":           errors.New("mount: device says no cluster leader"),
		"precondition quotes plugin": fmt.Errorf("csi ControllerPublishVolume: %w: provider: csi plugin not on this client", structs.ErrCSIFailedPrecondition),
		"outcome and ctx":            fmt.Errorf("client rpc X: %w: %w", structs.ErrOutcomeUnknown, context.DeadlineExceeded),
	}
	for _, s := range allSentinels {
		errs[s.Error()] = fmt.Errorf("handler on the leader: %w: details", s)
	}
	return errs
}

var allSentinels = []error{
	structs.ErrOutcomeUnknown, structs.ErrClaimInProgress, structs.ErrCSIMaxClaims,
	structs.ErrCSIControllerUnavailable, structs.ErrCSIPluginNotFound, structs.ErrCSIInvalidArgument,
	structs.ErrCSINotFound, structs.ErrCSIFailedPrecondition, structs.ErrCSIResourceExhausted,
	structs.ErrCSIAlreadyExists, structs.ErrCSIUnimplemented, structs.ErrCSIUnavailable, structs.ErrCSIInternal,
	structs.ErrNodeNotConnected, structs.ErrNoLeader, structs.ErrPermissionDenied, structs.ErrUnknownNode,
	structs.ErrUnknownMethod, structs.ErrNotFound, structs.ErrShutdown, structs.ErrWrongRegion,
	structs.ErrAmbiguousPrefix, structs.ErrInvalidRequest,
}

// requireSameMeaning checks that got, received over RPC, means what sent
// meant: the same message and the same sentinels.
func requireSameMeaning(t *testing.T, sent, got error) {
	t.Helper()
	must.Eq(t, sent.Error(), got.Error())
	for _, s := range allSentinels {
		must.Eq(t, errors.Is(sent, s), errors.Is(got, s), must.Sprintf("%q vs %v", sent, s))
	}
	must.Eq(t, structs.IsRetryable(sent), structs.IsRetryable(got), must.Sprint(sent))
	must.Eq(t, structs.ErrorCodes(sent), structs.ErrorCodes(got))
}

func registerErrTest(t *testing.T, s *Server, errs map[string]error) *errTestService {
	t.Helper()
	svc := &errTestService{srv: s, errs: errs}
	must.NoError(t, s.rpcServer.RegisterName("ErrTest", svc))
	return svc
}

// Every sentinel keeps its meaning on each path into a server: a TCP
// connection, a client's yamux session, and the in-memory codec.
func TestRPCErrors_EveryPathIntoServer(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	errs := sentinelErrors()
	registerErrTest(t, s, errs)

	tcp := rpcClientOn(t, rawConn(t, s, structs.RPCNomad))
	_, sessionRPC := rawSession(t, s)
	paths := map[string]func(args *ErrTestRequest) error{
		"tcp": func(args *ErrTestRequest) error {
			return structs.FromRPCError(tcp.Call("ErrTest.Fail", args, &structs.GenericResponse{}))
		},
		"session": func(args *ErrTestRequest) error {
			return structs.FromRPCError(sessionRPC.Call("ErrTest.Fail", args, &structs.GenericResponse{}))
		},
		"in-memory": func(args *ErrTestRequest) error {
			return s.RPC("ErrTest.Fail", args, &structs.GenericResponse{})
		},
	}
	for name, call := range paths {
		t.Run(name, func(t *testing.T) {
			for id, sent := range errs {
				got := call(&ErrTestRequest{ID: id})
				must.Error(t, got)
				requireSameMeaning(t, sent, got)
			}
		})
	}
}

// A follower forwards a write to the leader and relays its error: codes
// survive both hops, so the caller of the follower sees the leader's
// sentinels, and codes this build does not know pass through.
func TestRPCErrors_ForwardedCallKeepsCodes(t *testing.T) {
	t.Parallel()
	servers := testMemCluster(t, 3).servers
	leader := waitForLeaderDuties(t, servers...)
	follower := followers(servers)[0]

	errs := sentinelErrors()
	errs["from a newer leader"] = structs.FromRPCError(rpc.ServerError("\x00roam:from_the_future,invalid_request\x00a newer kind of invalid request"))
	var leaderSvc *errTestService
	for _, s := range servers {
		svc := registerErrTest(t, s, errs)
		if s == leader {
			leaderSvc = svc
		}
	}

	conn := rpcClientOn(t, rawConn(t, follower, structs.RPCNomad))
	for id, sent := range errs {
		if errors.Is(sent, structs.ErrNoLeader) && !errors.Is(sent, structs.ErrOutcomeUnknown) {
			// The follower waits for another leader on these; see
			// TestForwardRetryable.
			continue
		}
		before := leaderSvc.calls.Load()
		got := structs.FromRPCError(conn.Call("ErrTest.Fail", &ErrTestRequest{ID: id}, &structs.GenericResponse{}))
		requireSameMeaning(t, sent, got)
		must.Eq(t, before+1, leaderSvc.calls.Load(), must.Sprintf("%s: the leader ran the call once", id))

		got = follower.RPC("ErrTest.Fail", &ErrTestRequest{ID: id}, &structs.GenericResponse{})
		requireSameMeaning(t, sent, got)
	}
}

// A write whose error says both "no leader" and "outcome unknown" may have
// been applied: the follower must not send it again.
func TestRPCErrors_ForwardedOutcomeUnknownNotResent(t *testing.T) {
	t.Parallel()
	servers := testMemCluster(t, 3).servers
	leader := waitForLeaderDuties(t, servers...)
	follower := followers(servers)[0]
	both := fmt.Errorf("%w: raft apply: %w", structs.ErrOutcomeUnknown, structs.ErrNoLeader)
	errs := map[string]error{"both": both}
	var leaderSvc *errTestService
	for _, s := range servers {
		svc := registerErrTest(t, s, errs)
		if s == leader {
			leaderSvc = svc
		}
	}
	err := follower.RPC("ErrTest.Fail", &ErrTestRequest{ID: "both"}, &structs.GenericResponse{})
	must.ErrorIs(t, err, structs.ErrOutcomeUnknown)
	must.Eq(t, both.Error(), err.Error())
	must.Eq(t, int64(1), leaderSvc.calls.Load())
}

func TestForwardRetryable(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("%w: 127.0.0.1:1: refused", errDial), true},
		{fmt.Errorf("%w: not applied", structs.ErrNoLeader), true},
		{fmt.Errorf("%w: %w", structs.ErrNoLeader, errConnLost), false},
		{fmt.Errorf("%w: %w", structs.ErrNoLeader, context.DeadlineExceeded), false},
		{fmt.Errorf("%w: %w", structs.ErrOutcomeUnknown, structs.ErrNoLeader), false},
		{structs.ErrOutcomeUnknown, false},
		{structs.ErrInvalidRequest, false},
		{nil, false},
	}
	for _, tc := range cases {
		must.Eq(t, tc.want, forwardRetryable(tc.err), must.Sprint(tc.err))
		// The same decision for the error as it arrives from the leader.
		if tc.err != nil {
			wire := structs.FromRPCError(rpc.ServerError(structs.EncodeRPCError(tc.err)))
			if !errors.Is(tc.err, errDial) && !errors.Is(tc.err, errConnLost) && !errors.Is(tc.err, context.DeadlineExceeded) {
				must.Eq(t, tc.want, forwardRetryable(wire), must.Sprint(tc.err))
			}
		}
	}
}

// failingClientService is a client-side service answering with the error
// registered under its argument.
type failingClientService struct{ errs map[string]error }

func (f *failingClientService) Fail(id string, reply *string) error { return f.errs[id] }

// A server-to-client call's error keeps its meaning on the direct path
// (the server holding the session) and when relayed by ClientRPC.Forward.
func TestRPCErrors_ClientRPCKeepsCodes(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	leader := waitForLeader(t, servers...)
	follower := followers(servers)[0]

	c := testAgentClient(t, follower.Addr())
	errs := sentinelErrors()
	must.NoError(t, c.RegisterRPC("Failing", &failingClientService{errs: errs}))
	waitNodeSession(t, follower, c.NodeID(), true)
	_, ok := leader.nodeSession(c.NodeID())
	must.False(t, ok)

	for name, s := range map[string]*Server{"direct": follower, "relayed": leader} {
		t.Run(name, func(t *testing.T) {
			for id, sent := range errs {
				var out string
				got := s.clientRPC(testCtx(t), c.NodeID(), "Failing.Fail", id, &out)
				must.Error(t, got)
				requireSameMeaning(t, sent, got)
			}
		})
	}
}
