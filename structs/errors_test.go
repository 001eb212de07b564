package structs

import (
	"errors"
	"fmt"
	"net/rpc"
	"testing"

	"github.com/shoenig/test/must"
)

func TestFromRPCError(t *testing.T) {
	cases := []struct {
		name      string
		in        error
		want      error
		retryable bool
	}{
		{"no leader", rpc.ServerError(fmt.Sprintf("%v: waited 5s", ErrNoLeader)), ErrNoLeader, true},
		{"outcome unknown beats no leader", rpc.ServerError(ErrOutcomeUnknown.Error() + ": " + ErrNoLeader.Error()), ErrOutcomeUnknown, true},
		{"shutdown", rpc.ServerError("forwarding: " + ErrShutdown.Error()), ErrShutdown, true},
		{"permission", rpc.ServerError(ErrPermissionDenied.Error() + ": token"), ErrPermissionDenied, false},
		{"unknown method", rpc.ServerError("rpc: can't find service Nope.Nothing"), ErrUnknownMethod, false},
		{"unknown node", rpc.ServerError("unknown node: abc"), ErrUnknownNode, false},
		{"already a sentinel", fmt.Errorf("wrapped: %w", ErrInvalidRequest), ErrInvalidRequest, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := FromRPCError(tc.in)
			must.ErrorIs(t, got, tc.want)
			must.Eq(t, tc.in.Error(), got.Error(), must.Sprint("message kept"))
			must.Eq(t, tc.retryable, IsRetryable(tc.in))
		})
	}
	must.NoError(t, FromRPCError(nil))
	plain := errors.New("something else")
	must.Eq(t, plain, FromRPCError(plain))
	must.False(t, IsRetryable(plain))
}

func TestRPCCallTimeout(t *testing.T) {
	must.Eq(t, 30_000_000_000, int64(RPCCallTimeout(&WriteRequest{})))
	q := &QueryOptions{MinQueryIndex: 5, MaxQueryTime: 16_000_000_000}
	// Slack covers the server's blocking time plus its jitter.
	must.Eq(t, int64(30_000_000_000+16_000_000_000+1_000_000_000), int64(RPCCallTimeout(q)))
}
