package nomad

import (
	"context"
	"sync"

	"github.com/roamhq/roam/structs"
)

// queryCancels lets a server end one blocking query that another server
// forwarded to it. Forwarded queries from one server share a connection,
// so a query whose caller left cannot be ended by closing it; instead the
// forwarder names each query (QueryOptions.CancelID) and, when its caller
// leaves, sends Status.CancelQuery with that name.
//
// A query is tracked from the moment its body is read until its reply is
// written. Requests on one connection are read in order, so a cancel sent
// after its query on the same connection always finds it.
type queryCancels struct {
	max int

	mu      sync.Mutex
	cancels map[string]context.CancelFunc
}

// maxTrackedQueries bounds the queries one server tracks for cancelling.
// Past it a forwarded query still ends with its connection, or its wait.
const maxTrackedQueries = 1 << 16

func newQueryCancels(max int) *queryCancels {
	return &queryCancels{max: max, cancels: make(map[string]context.CancelFunc)}
}

// track returns a context that ends with parent or when id is cancelled,
// and the function that stops tracking it. An empty, overlong, duplicate or
// over-limit id is not tracked: the query keeps parent as its context.
func (q *queryCancels) track(parent context.Context, id string) (context.Context, func()) {
	if id == "" || len(id) > structs.MaxCancelIDLen {
		return parent, func() {}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, dup := q.cancels[id]; dup || len(q.cancels) >= q.max {
		return parent, func() {}
	}
	ctx, cancel := context.WithCancel(parent)
	q.cancels[id] = cancel
	return ctx, func() {
		q.mu.Lock()
		delete(q.cancels, id)
		q.mu.Unlock()
		cancel()
	}
}

// cancel ends the query named id, and reports whether it was tracked.
func (q *queryCancels) cancel(id string) bool {
	q.mu.Lock()
	cancel, ok := q.cancels[id]
	delete(q.cancels, id)
	q.mu.Unlock()
	if ok {
		cancel()
	}
	return ok
}

// len is the number of tracked queries.
func (q *queryCancels) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.cancels)
}

// queryCanceller is a request a forwarder can name for cancelling
// (structs.QueryOptions, and what embeds it).
type queryCanceller interface {
	QueryCancelID() string
	SetQueryCancelID(string)
}
