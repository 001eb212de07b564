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
