package structs

import (
	"errors"
	"fmt"
	"net/rpc"
	"testing"

	"github.com/shoenig/test/must"
)

// TestFromRPCError_CSI covers the text fallback for CSI errors from a peer
// that sends no codes.
func TestFromRPCError_CSI(t *testing.T) {
	for _, sc := range csiErrorCodes {
		sentinel := sc.err
		msg := fmt.Errorf("csi ControllerPublishVolume: %w: volume v1", sentinel).Error()
		got := FromRPCError(rpc.ServerError(msg))
		must.ErrorIs(t, got, sentinel, must.Sprint(msg))
		must.Eq(t, msg, got.Error())
		must.False(t, IsRetryable(got))
	}
	// The CSI NOT_FOUND message contains the generic one; it must win.
	got := FromRPCError(rpc.ServerError(ErrCSINotFound.Error()))
	must.ErrorIs(t, got, ErrCSINotFound)
	must.False(t, errors.Is(got, ErrNotFound))

	// No reachable controller quotes the last candidate's error, whatever
	// sentinel that names; the outer meaning wins.
	for _, last := range []error{ErrCSIPluginNotFound, ErrNodeNotConnected, ErrCSIUnavailable} {
		msg := fmt.Errorf(`%w: plugin "p": all 2 candidates failed, last on node n2: %w: "p"`, ErrCSIControllerUnavailable, last).Error()
		got := FromRPCError(rpc.ServerError(msg))
		must.ErrorIs(t, got, ErrCSIControllerUnavailable, must.Sprint(msg))
		must.False(t, errors.Is(got, last), must.Sprint(msg))
	}
}
