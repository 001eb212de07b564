package structs

import "time"

// Evaluation statuses.
const (
	EvalStatusBlocked   = "blocked"
	EvalStatusPending   = "pending"
	EvalStatusComplete  = "complete"
	EvalStatusFailed    = "failed"
	EvalStatusCancelled = "canceled"
)

// What triggered an evaluation.
const (
	EvalTriggerJobRegister      = "job-register"
	EvalTriggerJobDeregister    = "job-deregister"
	EvalTriggerNodeUpdate       = "node-update"
	EvalTriggerNodeDrain        = "node-drain"
	EvalTriggerAllocStop        = "alloc-stop"
	EvalTriggerRetryFailedAlloc = "alloc-failure"
	EvalTriggerRollingUpdate    = "rolling-update"
	EvalTriggerQueuedAllocs     = "queued-allocs"
	EvalTriggerFailedFollowUp   = "failed-follow-up"
)

// Evaluation is a request to reconcile one job against the cluster.
type Evaluation struct {
	ID          string
	Namespace   string
	Priority    int
	Type        string // the job's type: picks the scheduler
	TriggeredBy string
	JobID       string
	NodeID      string

	Status            string
	StatusDescription string
	// WaitUntil delays processing (rescheduling delays).
	WaitUntil    time.Time
	NextEval     string
	PreviousEval string
	BlockedEval  string
	// FailedTGAllocs explains, per group, why placements failed.
	FailedTGAllocs map[string]*AllocMetric
	// QueuedAllocations counts, per group, placements still wanted.
	QueuedAllocations map[string]int
	SnapshotIndex     uint64

	CreateIndex uint64
	ModifyIndex uint64
	CreateTime  int64
	ModifyTime  int64
}

// TerminalStatus reports whether the evaluation is finished.
func (e *Evaluation) TerminalStatus() bool {
	switch e.Status {
	case EvalStatusComplete, EvalStatusFailed, EvalStatusCancelled:
		return true
	}
	return false
}

// Copy returns a copy whose maps may be changed freely.
func (e *Evaluation) Copy() *Evaluation {
	if e == nil {
		return nil
	}
	c := *e
	if e.FailedTGAllocs != nil {
		c.FailedTGAllocs = make(map[string]*AllocMetric, len(e.FailedTGAllocs))
		for k, v := range e.FailedTGAllocs {
			c.FailedTGAllocs[k] = v.Copy()
		}
	}
	if e.QueuedAllocations != nil {
		c.QueuedAllocations = make(map[string]int, len(e.QueuedAllocations))
		for k, v := range e.QueuedAllocations {
			c.QueuedAllocations[k] = v
		}
	}
	return &c
}

// AllocMetric explains a placement decision, shaped like Nomad's.
type AllocMetric struct {
	NodesEvaluated     int
	NodesFiltered      int
	NodesAvailable     map[string]int
	ClassFiltered      map[string]int
	ConstraintFiltered map[string]int
	NodesExhausted     int
	DimensionExhausted map[string]int
	CoalescedFailures  int
}

// Copy returns a deep copy.
func (m *AllocMetric) Copy() *AllocMetric {
	if m == nil {
		return nil
	}
	c := *m
	c.NodesAvailable = copyIntMap(m.NodesAvailable)
	c.ClassFiltered = copyIntMap(m.ClassFiltered)
	c.ConstraintFiltered = copyIntMap(m.ConstraintFiltered)
	c.DimensionExhausted = copyIntMap(m.DimensionExhausted)
	return &c
}

// FilterNode records that a node was ruled out, and why.
func (m *AllocMetric) FilterNode(reason string) {
	m.NodesFiltered++
	if m.ConstraintFiltered == nil {
		m.ConstraintFiltered = make(map[string]int)
	}
	m.ConstraintFiltered[reason]++
}

// ExhaustedNode records that a node had too little of a resource.
func (m *AllocMetric) ExhaustedNode(dimension string) {
	m.NodesExhausted++
	if m.DimensionExhausted == nil {
		m.DimensionExhausted = make(map[string]int)
	}
	m.DimensionExhausted[dimension]++
}

func copyIntMap(m map[string]int) map[string]int {
	if m == nil {
		return nil
	}
	c := make(map[string]int, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// Plan is a scheduler's answer to an evaluation: allocations to stop and
// allocations to place, per node. The leader applies it through Raft after
// checking each node can still take what is placed on it.
type Plan struct {
	EvalID   string
	Priority int
	Job      *Job
	// NodeUpdate holds allocations to stop or evict (desired status set).
	NodeUpdate map[string][]*Allocation
	// NodeAllocation holds new or updated allocations.
	NodeAllocation map[string][]*Allocation
	// FailedTGAllocs explains placements that found no node.
	FailedTGAllocs map[string]*AllocMetric
}

// IsNoOp reports whether the plan changes nothing.
func (p *Plan) IsNoOp() bool { return len(p.NodeUpdate) == 0 && len(p.NodeAllocation) == 0 }

// AppendStoppedAlloc adds a stop of alloc for the given reason.
func (p *Plan) AppendStoppedAlloc(alloc *Allocation, desiredStatus, desc string, clientStatus string) {
	c := alloc.Copy()
	c.DesiredStatus = desiredStatus
	c.DesiredDescription = desc
	if clientStatus != "" {
		c.ClientStatus = clientStatus
	}
	if p.NodeUpdate == nil {
		p.NodeUpdate = make(map[string][]*Allocation)
	}
	p.NodeUpdate[alloc.NodeID] = append(p.NodeUpdate[alloc.NodeID], c)
}

// AppendAlloc adds a placement.
func (p *Plan) AppendAlloc(alloc *Allocation) {
	if p.NodeAllocation == nil {
		p.NodeAllocation = make(map[string][]*Allocation)
	}
	p.NodeAllocation[alloc.NodeID] = append(p.NodeAllocation[alloc.NodeID], alloc)
}
