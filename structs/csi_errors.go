package structs

import "errors"

// Errors of the CSI boundary. The client translates a plugin's gRPC status
// code into one of these exactly once, where it calls the plugin; over RPC
// they travel as their codes (csiErrorCodes) and FromRPCError turns them
// back into values, so servers compare them with errors.Is like any other
// sentinel.
var (
	// ErrCSIPluginNotFound means the client asked to serve a CSI call has
	// no plugin with that ID (or none of the needed type). A server tries
	// the next candidate client.
	ErrCSIPluginNotFound = errors.New("csi plugin not on this client")
	// ErrCSIInvalidArgument is INVALID_ARGUMENT or OUT_OF_RANGE: the request
	// is wrong and will stay wrong.
	ErrCSIInvalidArgument = errors.New("csi plugin: invalid argument")
	// ErrCSINotFound is NOT_FOUND: the volume, snapshot or node does not
	// exist in the storage provider.
	ErrCSINotFound = errors.New("csi plugin: object not found")
	// ErrCSIFailedPrecondition is FAILED_PRECONDITION: the provider's state
	// forbids the call now (volume attached elsewhere, still published).
	ErrCSIFailedPrecondition = errors.New("csi plugin: failed precondition")
	// ErrCSIResourceExhausted is RESOURCE_EXHAUSTED: for example, the node
	// has no room for another attachment.
	ErrCSIResourceExhausted = errors.New("csi plugin: resource exhausted")
	// ErrCSIAlreadyExists is ALREADY_EXISTS: the object exists with
	// incompatible parameters.
	ErrCSIAlreadyExists = errors.New("csi plugin: already exists with other parameters")
	// ErrCSIUnimplemented is UNIMPLEMENTED: the plugin lacks the call.
	ErrCSIUnimplemented = errors.New("csi plugin: call not implemented")
	// ErrCSIUnavailable is UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED or
	// ABORTED: the plugin could not be reached or did not finish; the call
	// may be retried and may or may not have taken effect.
	ErrCSIUnavailable = errors.New("csi plugin: unavailable")
	// ErrCSIInternal is any other failure of the plugin.
	ErrCSIInternal = errors.New("csi plugin: internal error")

	// ErrCSIControllerUnavailable means the leader found no controller
	// instance of the plugin it could reach: none healthy on a ready node,
	// or every one failed as unreachable (its node between servers, say,
	// while a server restarts). It may pass; whether to wait is the
	// caller's choice.
	ErrCSIControllerUnavailable = errors.New("csi controller unavailable")

	// ErrCSIClaimInUse means a claim cannot be released yet: its
	// allocation's tasks may still be using the volume (the client has not
	// reported the allocation terminal, and its node is up).
	ErrCSIClaimInUse = errors.New("volume claim still in use by its allocation")
)

// csiErrorCodes are the wire codes of the CSI sentinels. They come before
// the generic ones in sentinelCodes: their meanings are more specific.
// ErrCSIControllerUnavailable comes first: its message quotes the last
// candidate's error, which may name another sentinel.
var csiErrorCodes = []sentinelCode{
	{ErrCSIControllerUnavailable, "csi_controller_unavailable"},
	{ErrCSIClaimInUse, "csi_claim_in_use"},
	{ErrCSIPluginNotFound, "csi_plugin_not_found"},
	{ErrCSIInvalidArgument, "csi_invalid_argument"},
	{ErrCSINotFound, "csi_not_found"},
	{ErrCSIFailedPrecondition, "csi_failed_precondition"},
	{ErrCSIResourceExhausted, "csi_resource_exhausted"},
	{ErrCSIAlreadyExists, "csi_already_exists"},
	{ErrCSIUnimplemented, "csi_unimplemented"},
	{ErrCSIUnavailable, "csi_unavailable"},
	{ErrCSIInternal, "csi_internal"},
}
