package structs

import (
	"errors"
	"net/rpc"
	"slices"
	"strings"
)

// Error values shared by servers, clients and the HTTP API. Each has a
// stable wire code (sentinelCodes) so that it survives an RPC hop: see
// EncodeRPCError and FromRPCError. Callers everywhere compare with
// errors.Is.
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
	// ErrStaleLeaderTerm means a controller call came from a leader whose
	// term is below one the receiver has seen: a deposed leader's call that
	// arrived late. It was not run; retryable, against the current leader.
	ErrStaleLeaderTerm = errors.New("controller call from a deposed leader")
	// ErrRaftLogWrite means a server could not write its Raft log (a full
	// disk, an I/O error). The write was not acknowledged nor applied; the
	// server stops, and another leads meanwhile. Retryable.
	ErrRaftLogWrite = errors.New("the server could not write its raft log")
	// ErrProfileInProgress means the agent asked is already taking as many
	// profiles as it allows (one CPU profile or trace, which is all the
	// runtime takes at a time; a few named ones); retryable once one ends.
	ErrProfileInProgress = errors.New("this agent is already taking as many profiles as it allows")
	// ErrPartlyDone marks an error from a call that changed state before it
	// failed (a claim walk that checkpointed, the first of several volumes
	// deleted): the error it wraps says why it stopped, and this says the
	// call must not be taken for one that never ran. A server never sends
	// such a call again on its own (nomad's forwardRetryable), and a caller
	// that checks outcomes counts it as changed, or possibly changed.
	ErrPartlyDone = errors.New("the call was carried out in part")
)

// sentinelCode is a sentinel and its wire code.
type sentinelCode struct {
	err  error
	code string
}

// sentinelCodes gives every sentinel of this package its wire code, most
// specific (most important) first: an error that wraps several lists their
// codes in this order, and the text fallback for uncoded errors picks the
// first whose message it contains.
//
// A code is part of the wire protocol: never rename or reuse one. A new
// sentinel gets a new code; a peer that does not know it reads the error
// as plain text.
var sentinelCodes = append(append([]sentinelCode{
	{ErrOutcomeUnknown, "outcome_unknown"},
	{ErrClaimInProgress, "claim_in_progress"},
	{ErrStaleLeaderTerm, "stale_leader_term"},
	{ErrCSIMaxClaims, "csi_max_claims"},
}, csiErrorCodes...),
	sentinelCode{ErrRaftLogWrite, "raft_log_write"},
	sentinelCode{ErrProfileInProgress, "profile_in_progress"},
	sentinelCode{ErrNodeNotConnected, "node_not_connected"},
	sentinelCode{ErrNoLeader, "no_leader"},
	sentinelCode{ErrPermissionDenied, "permission_denied"},
	sentinelCode{ErrUnknownNode, "unknown_node"},
	sentinelCode{ErrUnknownMethod, "unknown_method"},
	sentinelCode{ErrNotFound, "not_found"},
	sentinelCode{ErrShutdown, "shutdown"},
	sentinelCode{ErrWrongRegion, "wrong_region"},
	sentinelCode{ErrAmbiguousPrefix, "ambiguous_prefix"},
	sentinelCode{ErrJobTooLarge, "job_too_large"},
	sentinelCode{ErrEventsDropped, "events_dropped"},
	sentinelCode{ErrInvalidRequest, "invalid_request"},
	// Last: the error it marks says what went wrong, and answers for it.
	sentinelCode{ErrPartlyDone, "partly_done"},
)

// Sentinels returns every sentinel error of this package, most specific
// first (the order of sentinelCodes). Boundaries that translate errors
// (the HTTP API's status table) walk it so that none is forgotten.
func Sentinels() []error {
	out := make([]error, len(sentinelCodes))
	for i, sc := range sentinelCodes {
		out[i] = sc.err
	}
	return out
}

// sentinelByCode is sentinelCodes the other way round.
var sentinelByCode = func() map[string]error {
	m := make(map[string]error, len(sentinelCodes))
	for _, sc := range sentinelCodes {
		m[sc.code] = sc.err
	}
	return m
}()

// ErrorCodes returns the wire codes of the sentinels err wraps, most
// important first, including codes a newer peer sent that this build does
// not know (so a relay passes them on). Nil when it wraps none.
func ErrorCodes(err error) []string {
	if err == nil {
		return nil
	}
	var codes []string
	for _, sc := range sentinelCodes {
		if errors.Is(err, sc.err) {
			codes = append(codes, sc.code)
		}
	}
	var wire *rpcError
	if errors.As(err, &wire) {
		for _, c := range wire.unknown {
			if !slices.Contains(codes, c) {
				codes = append(codes, c)
			}
		}
	}
	return codes
}

// The coded wire form of an error, in net/rpc's string-only
// Response.Error:
//
//	"\x00roam:" codes "\x00" message
//
// codes is a comma-separated list of [a-z0-9_] codes, possibly empty. A
// server writes every handler error in this form, with an empty list when
// it wraps no sentinel, so the receiver knows the message carries no
// meaning of its own and never reads one into it; and it decodes exactly
// one layer, so a message that itself starts with the prefix stays text.
// Messages Go code builds do not start with a NUL, so a bare string from a
// peer without codes is not taken for a coded one.
const (
	rpcErrorPrefix = "\x00roam:"
	rpcErrorSep    = "\x00"
)

// EncodeRPCError returns err's wire form: the codes of the sentinels it
// wraps (ErrorCodes) and its message. FromRPCError reverses it. The empty
// string for a nil err.
func EncodeRPCError(err error) string {
	if err == nil {
		return ""
	}
	return rpcErrorPrefix + strings.Join(ErrorCodes(err), ",") + rpcErrorSep + err.Error()
}

// rpcError is an error that came over RPC: the sender's message, matching
// (errors.Is) the sentinels whose codes it carried.
type rpcError struct {
	msg       string
	sentinels []error
	// unknown are codes this build has no sentinel for, kept so that a
	// relayed error passes them on.
	unknown []string
}

func (e *rpcError) Error() string   { return e.msg }
func (e *rpcError) Unwrap() []error { return e.sentinels }

// decodeRPCError parses the coded wire form; ok is false for any other
// string.
func decodeRPCError(s string) (err *rpcError, ok bool) {
	rest, ok := strings.CutPrefix(s, rpcErrorPrefix)
	if !ok {
		return nil, false
	}
	list, msg, ok := strings.Cut(rest, rpcErrorSep)
	if !ok {
		// Cut short: keep what there is, with no meaning read into it.
		return &rpcError{msg: rest}, true
	}
	e := &rpcError{msg: msg}
	if list != "" {
		for _, code := range strings.Split(list, ",") {
			if sentinel, known := sentinelByCode[code]; known {
				e.sentinels = append(e.sentinels, sentinel)
			} else if code != "" {
				e.unknown = append(e.unknown, code)
			}
		}
	}
	return e, true
}

// FromRPCError turns an error that came back over RPC into one that
// errors.Is the sentinels the remote handler's error wrapped, with the
// remote message as its Error(). Every receiving path calls it on the
// error of a call: the server-to-server pool, the client's connection,
// server-to-client streams and the in-memory path. It is idempotent and
// returns any other error unchanged.
//
// A coded error (EncodeRPCError) is decoded; an unknown code becomes plain
// text. Only a bare wire string (rpc.ServerError) without the coded form
// is matched by its text, as a fallback: net/rpc's own errors and peers
// that predate the codes. A local error value is never read by its text:
// its chain says what it is.
func FromRPCError(err error) error {
	if err == nil {
		return nil
	}
	var done *rpcError
	if errors.As(err, &done) {
		// Decoded already: its message, whatever it says, is only text.
		return err
	}
	var wire rpc.ServerError
	if !errors.As(err, &wire) {
		return err
	}
	if decoded, ok := decodeRPCError(string(wire)); ok {
		if msg := err.Error(); msg != string(wire) {
			// Wrapped before it was decoded: keep the wrapper's words and
			// what else its chain matches.
			decoded.msg = strings.Replace(msg, string(wire), decoded.msg, 1)
			decoded.sentinels = append(decoded.sentinels, err)
		}
		return decoded
	}
	for _, sc := range sentinelCodes {
		if errors.Is(err, sc.err) {
			return err
		}
	}
	msg := err.Error()
	// net/rpc's own wording for a method no service has.
	if strings.HasPrefix(msg, "rpc: can't find service ") || strings.HasPrefix(msg, "rpc: can't find method ") {
		return &rpcError{msg: msg, sentinels: []error{ErrUnknownMethod}}
	}
	for _, sc := range sentinelCodes {
		if strings.Contains(msg, sc.err.Error()) {
			return &rpcError{msg: msg, sentinels: []error{sc.err}}
		}
	}
	return err
}

// IsRetryable says whether the same call may succeed if tried again later,
// possibly against another server.
func IsRetryable(err error) bool {
	err = FromRPCError(err)
	return errors.Is(err, ErrNoLeader) || errors.Is(err, ErrShutdown) || errors.Is(err, ErrOutcomeUnknown) ||
		errors.Is(err, ErrClaimInProgress) || errors.Is(err, ErrStaleLeaderTerm)
}
