package agent

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/rpc"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
)

// overRPC is err as a server's handler error reaches the HTTP agent: coded
// on the wire, decoded by the agent's RPC path.
func overRPC(err error) error {
	return structs.FromRPCError(rpc.ServerError(structs.EncodeRPCError(err)))
}

// Every sentinel of structs has its own answer: a new sentinel without one
// fails here instead of reaching callers as a bare 500, as
// ErrClaimInProgress and ErrStaleLeaderTerm once did. It answers the same
// as a local error and after an RPC hop.
func TestHTTP_EverySentinelHasAStatus(t *testing.T) {
	sentinels := structs.Sentinels()
	must.SliceNotEmpty(t, sentinels)
	for _, sentinel := range sentinels {
		t.Run(sentinel.Error(), func(t *testing.T) {
			want, ok := sentinelAnswers[sentinel]
			must.True(t, ok, must.Sprintf("no HTTP answer for sentinel %q in sentinelAnswers", sentinel))
			for _, err := range []error{
				sentinel,
				fmt.Errorf("volume v: %w", sentinel),
				overRPC(fmt.Errorf("volume v: %w", sentinel)),
			} {
				got, _ := errorAnswerOf(err)
				must.Eq(t, want, got, must.Sprintf("error %q", err))
			}
			// Only Nomad's "No cluster leader" keeps its 500.
			if sentinel != structs.ErrNoLeader {
				must.NotEq(t, http.StatusInternalServerError, want.code, must.Sprintf("a 500 says nothing of what %q means", sentinel))
			}
			// What a server's own callers retry, an HTTP caller is told it
			// may retry.
			if structs.IsRetryable(sentinel) {
				must.True(t, want.retry, must.Sprintf("%q is retryable but answers without Retry-After", sentinel))
			}
		})
	}
}

// The answers callers act on, as writeError sends them: the status, the
// Retry-After header, and the message.
func TestHTTP_ErrorAnswers(t *testing.T) {
	s := &HTTPServer{logger: hclog.NewNullLogger()}
	cases := []struct {
		name  string
		err   error
		code  int
		retry bool
		msg   string
	}{
		{"claim in progress", overRPC(fmt.Errorf("%w: allocation a, volume v", structs.ErrClaimInProgress)),
			http.StatusConflict, true, "a change to this volume claim is in progress: allocation a, volume v"},
		{"deposed leader's call", overRPC(fmt.Errorf("%w: ClientCSI.ControllerPublishVolume term 3 < 4", structs.ErrStaleLeaderTerm)),
			http.StatusServiceUnavailable, true, "controller call from a deposed leader: ClientCSI.ControllerPublishVolume term 3 < 4"},
		{"raft log write", overRPC(fmt.Errorf("%w: append to the raft log on /d: no space left on device", structs.ErrRaftLogWrite)),
			http.StatusServiceUnavailable, true, "the server could not write its raft log: append to the raft log on /d: no space left on device"},
		{"outcome unknown", structs.ErrOutcomeUnknown, http.StatusServiceUnavailable, true, structs.ErrOutcomeUnknown.Error()},
		{"no leader", overRPC(fmt.Errorf("%w: waited 5s", structs.ErrNoLeader)), http.StatusInternalServerError, true, "No cluster leader"},
		{"max claims", fmt.Errorf("%w: volume v already has 1 writer(s)", structs.ErrCSIMaxClaims),
			http.StatusConflict, false, "volume max claims reached: volume v already has 1 writer(s)"},
		{"claim in use", overRPC(structs.ErrCSIClaimInUse), http.StatusConflict, true, structs.ErrCSIClaimInUse.Error()},
		{"controller unavailable", fmt.Errorf("%w: plugin p", structs.ErrCSIControllerUnavailable),
			http.StatusServiceUnavailable, true, "csi controller unavailable: plugin p"},
		// The controller-unavailable error quotes the last candidate's,
		// which names another sentinel: the more specific one answers.
		{"controller unavailable quoting not found", overRPC(fmt.Errorf("%w: last: %w", structs.ErrCSIControllerUnavailable, structs.ErrNotFound)),
			http.StatusServiceUnavailable, true, "csi controller unavailable: last: not found"},
		{"plugin internal", overRPC(structs.ErrCSIInternal), http.StatusBadGateway, false, structs.ErrCSIInternal.Error()},
		{"plugin unimplemented", structs.ErrCSIUnimplemented, http.StatusNotImplemented, false, structs.ErrCSIUnimplemented.Error()},
		{"node not connected", structs.ErrNodeNotConnected, http.StatusServiceUnavailable, false, structs.ErrNodeNotConnected.Error()},
		{"ACL denial", structs.ErrPermissionDenied, http.StatusForbidden, false, "Permission denied"},
		{"not found", fmt.Errorf("%w: job x", structs.ErrNotFound), http.StatusNotFound, false, "not found: job x"},
		{"agent shutting down", errShuttingDown, http.StatusServiceUnavailable, true, "agent is shutting down"},
		{"bad request", badRequest("bad %s", "thing"), http.StatusBadRequest, false, "bad thing"},
		{"no sentinel", errors.New("boom"), http.StatusInternalServerError, false, "boom"},
		// Done in part, then refused: the refusal answers, not the mark.
		{"partly done, then refused", overRPC(fmt.Errorf("%w: left node-detached: %w", structs.ErrPartlyDone, structs.ErrCSIFailedPrecondition)),
			http.StatusConflict, false, structs.ErrPartlyDone.Error() + ": left node-detached: " + structs.ErrCSIFailedPrecondition.Error()},
		{"partly done, plain cause", overRPC(fmt.Errorf("%w: boom", structs.ErrPartlyDone)),
			http.StatusServiceUnavailable, true, structs.ErrPartlyDone.Error() + ": boom"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			s.writeError(rec, tc.err)
			must.EqOp(t, tc.code, rec.Code)
			must.EqOp(t, tc.msg, strings.TrimSuffix(rec.Body.String(), "\n"))
			if tc.retry {
				must.EqOp(t, "1", rec.Header().Get("Retry-After"))
			} else {
				must.EqOp(t, "", rec.Header().Get("Retry-After"))
			}
		})
	}
}
