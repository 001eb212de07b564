package structs

import "time"

// Server-to-client RPC: a server calls a client over the yamux session the
// client opened, and relays the call to the server holding that session when
// it is not the one.

// SetSession records the client session a request arrived on. Only the
// receiving server's codec calls it; the value never travels on the wire.
func (q *QueryOptions) SetSession(session any) { q.session = session }

// Session returns the client session the request arrived on, or nil for a
// request from another server or from inside the process.
func (q *QueryOptions) Session() any { return q.session }

// SetSession records the client session a request arrived on. Only the
// receiving server's codec calls it; the value never travels on the wire.
func (w *WriteRequest) SetSession(session any) { w.session = session }

// Session returns the client session the request arrived on, or nil for a
// request from another server or from inside the process.
func (w *WriteRequest) Session() any { return w.session }

// NodeConnQueryResponse says whether the answering server holds a session
// with the node asked about (Status.HasNodeConn).
type NodeConnQueryResponse struct {
	// Connected is true when the server holds a live session for the node.
	Connected bool
	// Established is when the server recorded that session for the node.
	Established time.Time
	QueryMeta
}

// ClientRPCForwardRequest asks the server holding a node's session to make
// a call to that node (ClientRPC.Forward).
type ClientRPCForwardRequest struct {
	NodeID string
	// Method is the client's Service.Method.
	Method string
	// Args is the call's argument, msgpack-encoded with MsgpackHandle.
	Args []byte
	// Timeout bounds the call on the relaying server; zero means its default.
	Timeout time.Duration
	// NodeIndex is the node's ModifyIndex where the calling server read
	// its secret (the AuthToken): a relaying server whose state is behind
	// waits, briefly, to reach it before it checks the token.
	NodeIndex uint64
	// LeaderTerm is the call's CSIControllerQuery.LeaderTerm, zero for
	// other calls: the relaying server refuses the call if its own Raft
	// term is higher.
	LeaderTerm uint64
	WriteRequest
}

// ClientRPCForwardResponse carries the client's reply, msgpack-encoded.
type ClientRPCForwardResponse struct {
	Reply []byte
}

// ClientStatusPingResponse is a client's answer to ClientStatus.Ping.
type ClientStatusPingResponse struct {
	// NodeID is the answering node, so a caller sees whom it reached.
	NodeID string
}
