package agent

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/roamhq/roam/client"
	"github.com/roamhq/roam/nomad"
	"github.com/roamhq/roam/structs"
)

// codedError is an error answered with a given HTTP status.
type codedError struct {
	code int
	msg  string
}

func (e *codedError) Error() string { return e.msg }

// badRequest is a 400 with msg.
func badRequest(format string, args ...any) error {
	return &codedError{code: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// errShuttingDown answers requests still waiting when the agent stops.
var errShuttingDown = &codedError{code: http.StatusServiceUnavailable, msg: "agent is shutting down"}

// retryAfterSeconds is the Retry-After of an answer whose call may succeed
// if sent again: an election, a claim change on the leader or a plugin's
// restart takes about that long, and a caller that polls sooner only adds
// load to a cluster that is already busy.
const retryAfterSeconds = 1

// errorAnswer is how the HTTP API answers one sentinel.
type errorAnswer struct {
	code int
	// retry sets Retry-After: the same request may succeed later,
	// unchanged.
	retry bool
}

// sentinelAnswers gives every sentinel of structs its answer.
// TestHTTP_EverySentinelHasAStatus fails when structs gains a sentinel
// that is missing here, so none falls through to a bare 500.
var sentinelAnswers = map[error]errorAnswer{
	// The write may or may not have been applied; an idempotent caller
	// sends it again.
	structs.ErrOutcomeUnknown: {http.StatusServiceUnavailable, true},
	// Another change to the same claim is running on the leader: a
	// conflict that passes by itself.
	structs.ErrClaimInProgress: {http.StatusConflict, true},
	// A deposed leader's call, refused unrun: the current leader takes
	// the same call.
	structs.ErrStaleLeaderTerm: {http.StatusServiceUnavailable, true},
	// The write failed before it was acknowledged; the server that could
	// not write stops, and another leads.
	structs.ErrRaftLogWrite: {http.StatusServiceUnavailable, true},
	structs.ErrCSIMaxClaims: {http.StatusConflict, false},
	// The runtime takes one CPU profile or trace at a time.
	structs.ErrProfileInProgress: {http.StatusConflict, true},
	structs.ErrCSIClaimInUse:     {http.StatusConflict, true},
	structs.ErrCSIPluginNotFound: {http.StatusNotFound, false},
	// The plugin's INVALID_ARGUMENT or OUT_OF_RANGE: the caller's input
	// (a capacity no provider has, say), not a server failure.
	structs.ErrCSIInvalidArgument:       {http.StatusBadRequest, false},
	structs.ErrCSINotFound:              {http.StatusNotFound, false},
	structs.ErrCSIFailedPrecondition:    {http.StatusConflict, false},
	structs.ErrCSIResourceExhausted:     {http.StatusConflict, false},
	structs.ErrCSIAlreadyExists:         {http.StatusConflict, false},
	structs.ErrCSIUnimplemented:         {http.StatusNotImplemented, false},
	structs.ErrCSIControllerUnavailable: {http.StatusServiceUnavailable, true},
	structs.ErrCSIUnavailable:           {http.StatusServiceUnavailable, true},
	// The plugin failed, not Roam: the gateway's upstream.
	structs.ErrCSIInternal: {http.StatusBadGateway, false},
	// Not retryable soon (structs.IsRetryable leaves it out): no server
	// holds the node's session.
	structs.ErrNodeNotConnected: {http.StatusServiceUnavailable, false},
	// Nomad answers 500 here, and its clients match the text to retry.
	structs.ErrNoLeader:         {http.StatusInternalServerError, true},
	structs.ErrPermissionDenied: {http.StatusForbidden, false},
	structs.ErrUnknownNode:      {http.StatusNotFound, false},
	structs.ErrUnknownMethod:    {http.StatusNotImplemented, false},
	structs.ErrNotFound:         {http.StatusNotFound, false},
	structs.ErrShutdown:         {http.StatusServiceUnavailable, true},
	structs.ErrWrongRegion:      {http.StatusBadRequest, false},
	structs.ErrAmbiguousPrefix:  {http.StatusBadRequest, false},
	structs.ErrJobTooLarge:      {http.StatusBadRequest, false},
	structs.ErrEventsDropped:    {http.StatusGone, false},
	structs.ErrInvalidRequest:   {http.StatusBadRequest, false},
	// Only when what stopped the call has no answer of its own: the
	// servers, or the same call again, finish what was begun.
	structs.ErrPartlyDone: {http.StatusServiceUnavailable, true},
}

// errorStatus maps an error to its HTTP status and the message to answer
// with, following Nomad where it has an equivalent.
func errorStatus(err error) (int, string) {
	a, msg := errorAnswerOf(err)
	return a.code, msg
}

// errorAnswerOf is errorStatus with whether the caller may retry. An
// error that wraps several sentinels answers as the most specific
// (structs.Sentinels' order).
func errorAnswerOf(err error) (errorAnswer, string) {
	var coded *codedError
	if errors.As(err, &coded) {
		return errorAnswer{code: coded.code, retry: coded.code == http.StatusServiceUnavailable}, coded.msg
	}
	for _, sentinel := range structs.Sentinels() {
		if !errors.Is(err, sentinel) {
			continue
		}
		a, ok := sentinelAnswers[sentinel]
		if !ok {
			break
		}
		switch {
		case sentinel == structs.ErrNoLeader:
			// Nomad's exact text: clients match on it to retry.
			return a, "No cluster leader"
		case sentinel == structs.ErrPermissionDenied && err.Error() == structs.ErrPermissionDenied.Error():
			// An ACL denial answers Nomad's text; other denials say why.
			return a, "Permission denied"
		}
		return a, err.Error()
	}
	if errors.Is(err, nomad.ErrServerClosed) || errors.Is(err, client.ErrShutdown) {
		return errorAnswer{code: http.StatusServiceUnavailable, retry: true}, err.Error()
	}
	return errorAnswer{code: http.StatusInternalServerError}, err.Error()
}

func (s *HTTPServer) writeError(w http.ResponseWriter, err error) {
	a, msg := errorAnswerOf(err)
	if a.code >= http.StatusInternalServerError {
		s.logger.Warn("request failed", "status", a.code, "error", err)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if a.retry {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds))
	}
	w.WriteHeader(a.code)
	_, _ = fmt.Fprintln(w, msg)
}
