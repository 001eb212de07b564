package api

import (
	"net/url"
	"time"
)

// Evaluation statuses.
const (
	EvalStatusBlocked   = "blocked"
	EvalStatusPending   = "pending"
	EvalStatusComplete  = "complete"
	EvalStatusFailed    = "failed"
	EvalStatusCancelled = "canceled"
)

// Evaluation is a request to reconcile one job against the cluster, and
// its outcome.
type Evaluation struct {
	ID                string
	Namespace         string
	Priority          int
	Type              string
	TriggeredBy       string
	JobID             string
	NodeID            string
	Status            string
	StatusDescription string
	WaitUntil         time.Time
	NextEval          string
	PreviousEval      string
	BlockedEval       string
	// FailedTGAllocs explains, per group, why placements failed.
	FailedTGAllocs map[string]*AllocationMetric
	// QueuedAllocations counts, per group, placements still wanted.
	QueuedAllocations map[string]int
	SnapshotIndex     uint64
	CreateIndex       uint64
	ModifyIndex       uint64
	CreateTime        int64
	ModifyTime        int64
}

// Terminal reports whether the evaluation is finished.
func (e *Evaluation) Terminal() bool {
	switch e.Status {
	case EvalStatusComplete, EvalStatusFailed, EvalStatusCancelled:
		return true
	}
	return false
}

// AllocationMetric explains a placement decision.
type AllocationMetric struct {
	NodesEvaluated     int
	NodesFiltered      int
	NodesAvailable     map[string]int
	ClassFiltered      map[string]int
	ConstraintFiltered map[string]int
	NodesExhausted     int
	DimensionExhausted map[string]int
	CoalescedFailures  int
}

// Evaluations reads evaluations.
type Evaluations struct{ c *Client }

// Evaluations returns a handle on the evaluation endpoints.
func (c *Client) Evaluations() *Evaluations { return &Evaluations{c} }

// List returns evaluations; q.Prefix filters by ID prefix.
func (e *Evaluations) List(q *QueryOptions) ([]*Evaluation, *QueryMeta, error) {
	var out []*Evaluation
	qm, err := e.c.query("/v1/evaluations", &out, q)
	if err != nil {
		return nil, nil, err
	}
	return out, qm, nil
}

// Info returns one evaluation by ID or unique ID prefix; an unknown one
// is an *UnexpectedResponseError with status 404.
func (e *Evaluations) Info(evalID string, q *QueryOptions) (*Evaluation, *QueryMeta, error) {
	var out Evaluation
	qm, err := e.c.query("/v1/evaluation/"+url.PathEscape(evalID), &out, q)
	if err != nil {
		return nil, nil, err
	}
	return &out, qm, nil
}
