package structs

import "context"

// SetContext ties the query to its caller: a blocking query ends as soon
// as ctx does (the HTTP client hung up, the RPC connection closed). Only
// the receiving server sets it; the value never travels on the wire.
func (q *QueryOptions) SetContext(ctx context.Context) { q.ctx = ctx }

// Context returns the caller's context, or context.Background when the
// query was not tied to one.
func (q *QueryOptions) Context() context.Context {
	if q.ctx == nil {
		return context.Background()
	}
	return q.ctx
}

// QueryCancelID is the name a forwarding server gave this query, or "".
func (q *QueryOptions) QueryCancelID() string { return q.CancelID }

// SetQueryCancelID names the query for Status.CancelQuery.
func (q *QueryOptions) SetQueryCancelID(id string) { q.CancelID = id }

// MaxCancelIDLen bounds a query's CancelID; a longer one is not tracked.
const MaxCancelIDLen = 64

// QueryCancelRequest ends a blocking query that a server forwarded to the
// receiver, named by the CancelID the forwarder gave it. Forwarded queries
// share one connection per server pair, so closing the connection is not
// how one of them ends.
type QueryCancelRequest struct {
	CancelID string
}

// QueryCancelResponse says whether the named query was still waiting.
type QueryCancelResponse struct {
	Cancelled bool
}
