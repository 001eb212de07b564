package structs

// Request and response types for the Job, Alloc and Eval services and the
// workload methods of the Node service.

// JobRegisterRequest registers or updates a job and creates an evaluation.
type JobRegisterRequest struct {
	Job *Job
	// EnforceIndex makes the register fail unless the stored job's
	// JobModifyIndex equals JobModifyIndex (0: the job must not exist).
	EnforceIndex   bool
	JobModifyIndex uint64
	// Eval is filled in by the server before the Raft apply.
	Eval *Evaluation
	WriteRequest
}

// JobRegisterResponse names the evaluation the register created.
type JobRegisterResponse struct {
	EvalID          string
	EvalCreateIndex uint64
	JobModifyIndex  uint64
	Warnings        string
	QueryMeta
}

// JobDeregisterRequest stops a job, or removes it when Purge is set.
type JobDeregisterRequest struct {
	JobID string
	Purge bool
	// Eval is filled in by the server before the Raft apply.
	Eval *Evaluation
	WriteRequest
}

// JobDeregisterResponse names the evaluation that stops the allocations.
type JobDeregisterResponse struct {
	EvalID          string
	EvalCreateIndex uint64
	JobModifyIndex  uint64
	QueryMeta
}

// JobListRequest lists jobs.
type JobListRequest struct {
	QueryOptions
}

// JobListStub is a job in a list, shaped like Nomad's.
type JobListStub struct {
	ID                string
	Name              string
	Namespace         string
	Type              string
	Priority          int
	Datacenters       []string
	Stop              bool
	Status            string
	StatusDescription string
	JobSummary        *JobSummary
	Version           uint64
	SubmitTime        int64
	CreateIndex       uint64
	ModifyIndex       uint64
	JobModifyIndex    uint64
}

// JobSummary counts a job's allocations by client status per group.
type JobSummary struct {
	JobID     string
	Namespace string
	Summary   map[string]TaskGroupSummary
}

// TaskGroupSummary counts one group's allocations.
type TaskGroupSummary struct {
	Queued   int
	Complete int
	Failed   int
	Running  int
	Starting int
	Lost     int
}

// JobListResponse carries job stubs.
type JobListResponse struct {
	Jobs []*JobListStub
	QueryMeta
}

// JobSpecificRequest names one job.
type JobSpecificRequest struct {
	JobID string
	// All includes terminal allocations in Job.Allocations.
	All bool
	QueryOptions
}

// SingleJobResponse carries one job, nil when there is none.
type SingleJobResponse struct {
	Job *Job
	QueryMeta
}

// JobAllocationsResponse carries a job's allocations.
type JobAllocationsResponse struct {
	Allocations []*AllocListStub
	QueryMeta
}

// JobEvaluationsResponse carries a job's evaluations.
type JobEvaluationsResponse struct {
	Evaluations []*Evaluation
	QueryMeta
}

// AllocListRequest lists allocations.
type AllocListRequest struct {
	QueryOptions
}

// AllocListResponse carries allocation stubs.
type AllocListResponse struct {
	Allocations []*AllocListStub
	QueryMeta
}

// AllocSpecificRequest names one allocation.
type AllocSpecificRequest struct {
	AllocID string
	QueryOptions
}

// SingleAllocResponse carries one allocation, nil when there is none.
type SingleAllocResponse struct {
	Alloc *Allocation
	QueryMeta
}

// EvalListRequest lists evaluations.
type EvalListRequest struct {
	QueryOptions
}

// EvalListResponse carries evaluations.
type EvalListResponse struct {
	Evaluations []*Evaluation
	QueryMeta
}

// EvalSpecificRequest names one evaluation.
type EvalSpecificRequest struct {
	EvalID string
	QueryOptions
}

// SingleEvalResponse carries one evaluation, nil when there is none.
type SingleEvalResponse struct {
	Eval *Evaluation
	QueryMeta
}

// NodeClientAllocsResponse carries every allocation assigned to a node,
// with its job, for the node's client. It is a blocking query on the
// node's allocations.
type NodeClientAllocsResponse struct {
	Allocs []*Allocation
	// ClusterID is the cluster whose state the list comes from ("" from a
	// cluster that has none yet): a client holds its allocations rather
	// than reconcile them against another cluster's empty list.
	ClusterID string
	QueryMeta
}

// NodeAllocsResponse carries a node's allocations (Node.GetAllocs).
type NodeAllocsResponse struct {
	Allocs []*Allocation
	QueryMeta
}

// AllocUpdateRequest is a client's batch of allocation status updates
// (Node.UpdateAlloc): ID, ClientStatus, ClientDescription, TaskStates,
// ModifyTime. Only allocations of the calling node are accepted.
type AllocUpdateRequest struct {
	Alloc []*Allocation
	// Evals are created by the server for jobs whose allocations failed.
	Evals []*Evaluation
	WriteRequest
}

// EvalUpdateRequest stores evaluations (status changes, new ones).
type EvalUpdateRequest struct {
	Evals []*Evaluation
	WriteRequest
}

// ApplyPlanResultsRequest commits a plan: allocations stopped, allocations
// placed or updated, and the evaluations it settles or creates.
type ApplyPlanResultsRequest struct {
	AllocsStopped []*Allocation
	AllocsPlaced  []*Allocation
	Evals         []*Evaluation
	WriteRequest
}

// AllocUpdateDesiredTransitionRequest is the drainer asking allocations to
// move, with the evaluations that move them.
type AllocUpdateDesiredTransitionRequest struct {
	Allocs map[string]*DesiredTransition
	Evals  []*Evaluation
	WriteRequest
}

// NodeUpdateDrainRequest starts (DrainStrategy set) or stops (nil) a
// drain. Stopping a drain leaves the node ineligible unless MarkEligible.
type NodeUpdateDrainRequest struct {
	NodeID        string
	DrainStrategy *DrainStrategy
	MarkEligible  bool
	// Evals are created by the server.
	Evals []*Evaluation
	// UpdatedAt is set by the server (Unix seconds).
	UpdatedAt int64
	// Complete is set by the drainer when it ends a drain that moved
	// everything; a drain stopped otherwise was canceled.
	Complete bool
	WriteRequest
}

// NodeDrainUpdateResponse answers a drain change.
type NodeDrainUpdateResponse struct {
	NodeModifyIndex uint64
	EvalIDs         []string
	QueryMeta
}

// NodeUpdateEligibilityRequest sets a node's scheduling eligibility.
type NodeUpdateEligibilityRequest struct {
	NodeID      string
	Eligibility string
	// Evals are created by the server when a node becomes eligible.
	Evals     []*Evaluation
	UpdatedAt int64
	WriteRequest
}

// NodeEligibilityUpdateResponse answers an eligibility change.
type NodeEligibilityUpdateResponse struct {
	NodeModifyIndex uint64
	EvalIDs         []string
	QueryMeta
}
