package structs

import (
	"context"
	"reflect"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
)

// MessageType is the first byte of every Raft log entry; the rest of the
// entry is the msgpack-encoded request it names.
type MessageType uint8

const (
	NodeRegisterRequestType MessageType = iota
	NodeDeregisterRequestType
	NodeUpdateStatusRequestType
	JobRegisterRequestType
	JobDeregisterRequestType
	EvalUpdateRequestType
	AllocClientUpdateRequestType
	ApplyPlanResultsRequestType
	AllocUpdateDesiredTransitionRequestType
	NodeUpdateDrainRequestType
	NodeUpdateEligibilityRequestType
	CSIVolumeRegisterRequestType
	CSIVolumeDeregisterRequestType
	CSIVolumeClaimRequestType
	ClusterMetadataRequestType
	ACLPolicyUpsertRequestType
	ACLPolicyDeleteRequestType
	ACLTokenUpsertRequestType
	ACLTokenDeleteRequestType
	ACLTokenBootstrapRequestType
	CSIControllerFenceRequestType
)

// String names the message type for logs and errors.
func (t MessageType) String() string {
	switch t {
	case NodeRegisterRequestType:
		return "NodeRegister"
	case NodeDeregisterRequestType:
		return "NodeDeregister"
	case NodeUpdateStatusRequestType:
		return "NodeUpdateStatus"
	case JobRegisterRequestType:
		return "JobRegister"
	case JobDeregisterRequestType:
		return "JobDeregister"
	case EvalUpdateRequestType:
		return "EvalUpdate"
	case AllocClientUpdateRequestType:
		return "AllocClientUpdate"
	case ApplyPlanResultsRequestType:
		return "ApplyPlanResults"
	case AllocUpdateDesiredTransitionRequestType:
		return "AllocUpdateDesiredTransition"
	case NodeUpdateDrainRequestType:
		return "NodeUpdateDrain"
	case NodeUpdateEligibilityRequestType:
		return "NodeUpdateEligibility"
	case CSIVolumeRegisterRequestType:
		return "CSIVolumeRegister"
	case CSIVolumeDeregisterRequestType:
		return "CSIVolumeDeregister"
	case CSIVolumeClaimRequestType:
		return "CSIVolumeClaim"
	case ClusterMetadataRequestType:
		return "ClusterMetadata"
	case ACLPolicyUpsertRequestType:
		return "ACLPolicyUpsert"
	case ACLPolicyDeleteRequestType:
		return "ACLPolicyDelete"
	case ACLTokenUpsertRequestType:
		return "ACLTokenUpsert"
	case ACLTokenDeleteRequestType:
		return "ACLTokenDelete"
	case ACLTokenBootstrapRequestType:
		return "ACLTokenBootstrap"
	case CSIControllerFenceRequestType:
		return "CSIControllerFence"
	default:
		return "Unknown"
	}
}

// DefaultRegion is the region every request belongs to unless told otherwise.
const DefaultRegion = "global"

// MsgpackHandle is the codec handle for RPC and Raft. Raw bytes decode as
// strings and maps keep their concrete type, so what goes in comes out.
var MsgpackHandle = func() *codec.MsgpackHandle {
	h := &codec.MsgpackHandle{}
	h.RawToString = true
	h.MapType = reflect.TypeOf(map[string]any(nil))
	// Bound what a declared length may allocate before the bytes arrive, so a
	// hostile frame claiming a huge array cannot exhaust memory up front.
	// The bound holds per container, and containers nest (up to the
	// decoder's depth limit of 1024), so it must stay small: at 1<<16, a
	// 7-byte map header reserved about 5 MB, and 200 nested ones in a
	// 1.4 KB frame took 1 GB. Longer collections grow as their elements
	// arrive.
	h.MaxInitLen = 64
	// Let a codec.Raw value (an already-encoded body) be written as is: a
	// server relaying a call to a client passes the caller's bytes through.
	h.Raw = true
	return h
}()

// Encode writes the message type byte followed by msg in msgpack.
func Encode(t MessageType, msg any) ([]byte, error) {
	var body []byte
	if err := codec.NewEncoderBytes(&body, MsgpackHandle).Encode(msg); err != nil {
		return nil, err
	}
	return append([]byte{byte(t)}, body...), nil
}

// Decode reads a msgpack body into out.
func Decode(buf []byte, out any) error {
	return codec.NewDecoderBytes(buf, MsgpackHandle).Decode(out)
}

// RPCInfo is implemented by every request so the server can decide whether
// to forward it and where it belongs.
type RPCInfo interface {
	RequestRegion() string
	IsRead() bool
	AllowStaleRead() bool
}

// QueryOptions is embedded in every read request.
type QueryOptions struct {
	// Region the request is for; empty means the server's own region.
	Region string
	// MinQueryIndex makes the read block until the result's index is greater.
	MinQueryIndex uint64
	// MaxQueryTime bounds how long a blocking read waits.
	MaxQueryTime time.Duration
	// AllowStale lets a follower answer from its own state.
	AllowStale bool
	// Prefix filters list results by ID prefix.
	Prefix string
	// AuthToken is the caller's secret (a node's SecretID for client RPCs).
	AuthToken string
	// CancelID, set by a server that forwards a blocking query, names the
	// query so that the forwarder can end it with Status.CancelQuery when
	// its own caller leaves (see QueryCancelRequest).
	CancelID string `codec:",omitempty"`

	// session is the client session the request arrived on, set by the
	// receiving server only; unexported, so never encoded.
	session any
	// ctx is the caller's context (see SetContext); unexported, so never
	// encoded.
	ctx context.Context
}

func (q QueryOptions) RequestRegion() string { return q.Region }
func (q QueryOptions) RequestToken() string  { return q.AuthToken }
func (q QueryOptions) IsRead() bool          { return true }
func (q QueryOptions) AllowStaleRead() bool  { return q.AllowStale }

// Blocking-query bounds, as in Nomad: a wait defaults to five minutes and
// never exceeds ten.
const (
	DefaultBlockingQueryWait = 5 * time.Minute
	MaxBlockingQueryWait     = 10 * time.Minute
)

// BlockingJitterFraction: a blocking query waits up to 1/16 longer than
// asked, to spread the wake-ups of identical queries.
const BlockingJitterFraction = 16

// RPCCallTimeout is how long a caller waits for a reply to req: the time
// the query may block, its jitter, and slack for the reply itself.
func RPCCallTimeout(req any) time.Duration {
	if c, ok := req.(interface{ CallTimeout() time.Duration }); ok {
		return c.CallTimeout()
	}
	timeout := 30 * time.Second
	if q, ok := req.(interface{ TimeToBlock() time.Duration }); ok {
		ttb := q.TimeToBlock()
		timeout += ttb + ttb/BlockingJitterFraction
	}
	return timeout
}

// TimeToBlock is how long the query may block: zero unless it waits for an
// index past MinQueryIndex.
func (q QueryOptions) TimeToBlock() time.Duration {
	switch {
	case q.MinQueryIndex == 0:
		return 0
	case q.MaxQueryTime <= 0:
		return DefaultBlockingQueryWait
	case q.MaxQueryTime > MaxBlockingQueryWait:
		return MaxBlockingQueryWait
	}
	return q.MaxQueryTime
}

// WriteRequest is embedded in every write request.
type WriteRequest struct {
	Region    string
	AuthToken string

	// session is the client session the request arrived on, set by the
	// receiving server only; unexported, so never encoded.
	session any
}

func (w WriteRequest) RequestRegion() string { return w.Region }
func (w WriteRequest) RequestToken() string  { return w.AuthToken }
func (w WriteRequest) IsRead() bool          { return false }
func (w WriteRequest) AllowStaleRead() bool  { return false }

// QueryMeta is embedded in every read response.
type QueryMeta struct {
	// Index is the Raft index the result reflects.
	Index uint64
	// LastContact is the time since the answering server last heard from
	// the leader; zero on the leader.
	LastContact time.Duration
	// KnownLeader says whether the answering server knew of a leader.
	KnownLeader bool
}

// WriteMeta is embedded in every write response.
type WriteMeta struct {
	// Index is the Raft index at which the write was applied.
	Index uint64
}

// GenericRequest is a read with no arguments of its own.
type GenericRequest struct {
	QueryOptions
}

// GenericResponse is a write with nothing to return but its index.
type GenericResponse struct {
	WriteMeta
}

// SetAuth fills in region and token where the caller left them empty.
func (q *QueryOptions) SetAuth(region, token string) {
	if q.Region == "" {
		q.Region = region
	}
	if q.AuthToken == "" {
		q.AuthToken = token
	}
}

// SetAuth fills in region and token where the caller left them empty.
func (w *WriteRequest) SetAuth(region, token string) {
	if w.Region == "" {
		w.Region = region
	}
	if w.AuthToken == "" {
		w.AuthToken = token
	}
}
