package structs

import (
	"errors"
	"strings"
)

// Error values shared by servers, clients and the HTTP API. Over RPC an
// error travels as its message; FromRPCError turns a known message back into
// the value, so callers everywhere compare with errors.Is.
var (
	// ErrNoLeader means the cluster has no leader right now; retryable.
	ErrNoLeader = errors.New("no cluster leader")
	// ErrPermissionDenied means the caller's token does not allow the call.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrUnknownNode means no node has the given ID.
	ErrUnknownNode = errors.New("unknown node")
	// ErrUnknownMethod means no RPC has that name.
	ErrUnknownMethod = errors.New("unknown rpc method")
	// ErrNotFound is a generic "no such object".
	ErrNotFound = errors.New("not found")
	// ErrShutdown means the server is shutting down; retryable elsewhere.
	ErrShutdown = errors.New("server shutting down")
	// ErrWrongRegion means the request named a region this cluster is not.
	ErrWrongRegion = errors.New("unknown region")
	// ErrAmbiguousPrefix means an ID prefix matched more than one object.
	ErrAmbiguousPrefix = errors.New("ambiguous id prefix")
	// ErrInvalidRequest means the request failed validation.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrOutcomeUnknown means the leader was lost while a write was in
	// flight: it may or may not have been applied. Retryable by callers
	// whose write is idempotent; never retried blindly by a server.
	ErrOutcomeUnknown = errors.New("leadership lost with the write in flight; outcome unknown")
	// ErrClaimInProgress means another change to the same volume claim is
	// running on the leader; retryable.
	ErrClaimInProgress = errors.New("a change to this volume claim is in progress")
	// ErrNodeNotConnected means a server-to-client call could not reach the
	// node: no server holds its session, or the session broke mid-call.
	// Not in IsRetryable: the same call against the same node is unlikely to
	// succeed soon. Code choosing among nodes (controller candidates) checks
	// it explicitly and moves on to the next node.
	ErrNodeNotConnected = errors.New("node is not connected to any server")
)

// knownErrors is searched in order, so more specific messages come first.
var knownErrors = append(append([]error{ErrOutcomeUnknown, ErrClaimInProgress, ErrCSIMaxClaims}, csiErrors...),
	ErrNodeNotConnected, ErrNoLeader, ErrPermissionDenied, ErrUnknownNode, ErrUnknownMethod,
	ErrNotFound, ErrShutdown, ErrWrongRegion, ErrAmbiguousPrefix, ErrInvalidRequest,
)

// rpcError keeps the full server message while matching a sentinel.
type rpcError struct {
	msg      string
	sentinel error
}

func (e *rpcError) Error() string { return e.msg }
func (e *rpcError) Unwrap() error { return e.sentinel }

// FromRPCError maps an error that came back over RPC (a bare string) to the
// sentinel its message starts with or contains, keeping the message.
func FromRPCError(err error) error {
	if err == nil {
		return nil
	}
	for _, known := range knownErrors {
		if errors.Is(err, known) {
			return err
		}
	}
	msg := err.Error()
	// net/rpc's own wording for a method no service has.
	if strings.HasPrefix(msg, "rpc: can't find service ") || strings.HasPrefix(msg, "rpc: can't find method ") {
		return &rpcError{msg: msg, sentinel: ErrUnknownMethod}
	}
	for _, known := range knownErrors {
		if strings.Contains(msg, known.Error()) {
			return &rpcError{msg: msg, sentinel: known}
		}
	}
	return err
}

// IsRetryable says whether the same call may succeed if tried again later,
// possibly against another server.
func IsRetryable(err error) bool {
	err = FromRPCError(err)
	return errors.Is(err, ErrNoLeader) || errors.Is(err, ErrShutdown) || errors.Is(err, ErrOutcomeUnknown) ||
		errors.Is(err, ErrClaimInProgress)
}
