package scheduler

import (
	"errors"
	"fmt"
	"time"

	"github.com/roamhq/roam/structs"
)

// State is what the scheduler reads. The server's state store implements
// it over a snapshot; results must not be mutated by the caller and are
// not mutated here.
type State interface {
	// Nodes returns every node, in any order.
	Nodes() ([]*structs.Node, error)
	// NodeByID returns the node or nil when there is none.
	NodeByID(id string) (*structs.Node, error)
	// AllocsByJob returns every allocation of the job, terminal ones too.
	AllocsByJob(namespace, jobID string) ([]*structs.Allocation, error)
	// AllocsByNode returns every allocation on the node, terminal ones too.
	AllocsByNode(nodeID string) ([]*structs.Allocation, error)
	// JobByID returns the job or nil when there is none.
	JobByID(namespace, id string) (*structs.Job, error)
}

// VolumeChecker decides whether a node can serve a group's volume
// requests. The CSI work fills it in (healthy node plugin per requested
// volume, free claims on the volume); until then Options.Volumes is nil and
// no volume check is made.
type VolumeChecker interface {
	// FeasibleVolumes reports whether the allocation with index allocIndex
	// of tg may be placed on node. replacing is the allocation being
	// replaced (reschedule, migration, lost), or nil; its claims may be
	// counted as free. When ok is false, reason is recorded in the
	// placement's AllocMetric as a filter reason.
	FeasibleVolumes(node *structs.Node, tg *structs.TaskGroup, allocIndex int, replacing *structs.Allocation) (ok bool, reason string)
}

// CandidateVolumeChecker is a VolumeChecker that answers faster when it
// is given a list of nodes up front: it can read what it needs of every
// node once per evaluation instead of once per placement and node. The
// scheduler hands it each group's candidate nodes and then asks about
// them by position.
type CandidateVolumeChecker interface {
	VolumeChecker
	// ForNodes returns a checker for nodes. The caller changes neither
	// the slice nor the nodes while it uses the checker.
	ForNodes(nodes []*structs.Node) NodeVolumeChecker
}

// NodeVolumeChecker answers for the nodes it was made for.
type NodeVolumeChecker interface {
	// FeasibleVolumesAt is FeasibleVolumes for the i-th node: the same
	// answer and reason.
	FeasibleVolumesAt(i int, tg *structs.TaskGroup, allocIndex int, replacing *structs.Allocation) (ok bool, reason string)
}

// Options are Process's injected dependencies.
type Options struct {
	// Now is the scheduler's clock; required.
	Now time.Time
	// NewID mints allocation and evaluation IDs; required. Tests inject a
	// deterministic sequence.
	NewID func() string
	// Volumes checks CSI volume feasibility; nil means no volume check.
	// One that is also a CandidateVolumeChecker is asked through that.
	Volumes VolumeChecker
	// Limits bound the jobs Process places; nil means
	// structs.DefaultJobLimits. Servers refuse to register a job over
	// them, but one stored before they were set (or lowered) still comes
	// back from Raft with its evaluations: placing it would take work and
	// memory in proportion to counts nobody checked.
	Limits *structs.JobLimits
}

// Validate reports a missing dependency without changing anything.
func (o Options) Validate() error {
	switch {
	case o.Now.IsZero():
		return fmt.Errorf("%w: Now is zero", ErrInvalidOptions)
	case o.NewID == nil:
		return fmt.Errorf("%w: NewID is nil", ErrInvalidOptions)
	}
	return nil
}

// Result is what Process learned besides the plan.
type Result struct {
	// FollowupEval, when not nil, is an evaluation the caller must create:
	// it reschedules failed allocations whose delay has not yet passed, at
	// WaitUntil (the earliest of their reschedule times).
	FollowupEval *structs.Evaluation
	// QueuedAllocations counts, per group of the job, placements wanted
	// but not made by this plan. Every group of a running job is listed.
	QueuedAllocations map[string]int
	// FailedTGAllocs explains, per group, why placements found no node.
	// The plan carries the same map.
	FailedTGAllocs map[string]*structs.AllocMetric
	// Blocked reports that some placement found no node: the caller should
	// block the evaluation until the cluster changes.
	Blocked bool
}

// Errors Process returns.
var (
	// ErrInvalidOptions means Options lacks a required dependency.
	ErrInvalidOptions = errors.New("scheduler: invalid options")
	// ErrUnknownJobType means the job's type has no scheduler.
	ErrUnknownJobType = errors.New("scheduler: unknown job type")
)

// Descriptions the scheduler sets on allocations it stops.
const (
	AllocDescJobStopped    = "alloc not needed since job is stopped"
	AllocDescJobGone       = "alloc not needed since job was deregistered"
	AllocDescNotNeeded     = "alloc not needed due to job update"
	AllocDescDuplicate     = "alloc not needed: another alloc holds its index"
	AllocDescMigrating     = "alloc is being migrated"
	AllocDescLost          = "alloc is lost since its node is down"
	AllocDescNodeDraining  = "alloc stopped since its node is draining"
	AllocDescNotInNodeSet  = "alloc not needed: node no longer in the job's datacenters"
	allocDescLostClientMsg = "alloc lost: node is down"
)

// Process reconciles the evaluation's job against st and returns the plan
// that moves the cluster towards it. The plan may be a no-op.
func Process(st State, eval *structs.Evaluation, opts Options) (*structs.Plan, *Result, error) {
	if err := opts.Validate(); err != nil {
		return nil, nil, err
	}
	if eval == nil {
		return nil, nil, fmt.Errorf("%w: nil evaluation", ErrInvalidOptions)
	}
	ns := eval.Namespace
	if ns == "" {
		ns = structs.DefaultNamespace
	}
	job, err := st.JobByID(ns, eval.JobID)
	if err != nil {
		return nil, nil, fmt.Errorf("reading job %q: %w", eval.JobID, err)
	}
	allocs, err := st.AllocsByJob(ns, eval.JobID)
	if err != nil {
		return nil, nil, fmt.Errorf("reading allocations of job %q: %w", eval.JobID, err)
	}

	if !job.Stopped() {
		limits := structs.DefaultJobLimits()
		if opts.Limits != nil {
			limits = *opts.Limits
		}
		if err := limits.CheckSize(job); err != nil {
			return nil, nil, fmt.Errorf("job %q is not scheduled: %w", job.ID, err)
		}
	}

	p := newPlanner(st, eval, job, opts)
	if job.Stopped() {
		desc := AllocDescJobStopped
		if job == nil {
			desc = AllocDescJobGone
		}
		for _, a := range sortedAllocs(allocs) {
			if !a.TerminalStatus() {
				p.stop(a, structs.AllocDesiredStatusStop, desc, "")
			}
		}
		return p.finish()
	}

	switch job.Type {
	case structs.JobTypeService, structs.JobTypeBatch:
		err = p.reconcileGeneric(allocs)
	case structs.JobTypeSystem:
		err = p.reconcileSystem(allocs)
	default:
		err = fmt.Errorf("%w: %q", ErrUnknownJobType, job.Type)
	}
	if err != nil {
		return nil, nil, err
	}
	return p.finish()
}

// planner carries one Process call's working state.
type planner struct {
	st   State
	eval *structs.Evaluation
	job  *structs.Job
	opts Options
	now  int64

	plan     *structs.Plan
	followup *structs.Evaluation // built on first delayed reschedule
	queued   map[string]int
	failed   map[string]*structs.AllocMetric

	// nodes are all nodes sorted by ID, loaded on first use.
	nodes     []*structs.Node
	nodeByID  map[string]*structs.Node
	nodesRead bool
	// usage per node, loaded on first use; kept current as the plan
	// stops and places allocations.
	usage map[string]*nodeUsage
	// stopped are the IDs of allocations this plan stops.
	stopped map[string]bool
	// static caches per-group feasibility that does not depend on usage.
	static map[string]*staticFeasibility
}

func newPlanner(st State, eval *structs.Evaluation, job *structs.Job, opts Options) *planner {
	p := &planner{
		st:      st,
		eval:    eval,
		job:     job,
		opts:    opts,
		now:     opts.Now.UnixNano(),
		plan:    &structs.Plan{EvalID: eval.ID, Priority: eval.Priority, Job: job},
		queued:  make(map[string]int),
		failed:  make(map[string]*structs.AllocMetric),
		usage:   make(map[string]*nodeUsage),
		stopped: make(map[string]bool),
		static:  make(map[string]*staticFeasibility),
	}
	if job != nil {
		for _, tg := range job.TaskGroups {
			p.queued[tg.Name] = 0
		}
	}
	return p
}

func (p *planner) finish() (*structs.Plan, *Result, error) {
	res := &Result{FollowupEval: p.followup}
	if p.job != nil && !p.job.Stop {
		res.QueuedAllocations = p.queued
	}
	if len(p.failed) > 0 {
		p.plan.FailedTGAllocs = p.failed
		res.FailedTGAllocs = p.failed
		res.Blocked = true
	}
	return p.plan, res, nil
}

// stop adds a stop of a to the plan and frees its resources, returning the
// stopped copy so callers can link it to a replacement.
func (p *planner) stop(a *structs.Allocation, desired, desc, clientStatus string) *structs.Allocation {
	p.plan.AppendStoppedAlloc(a, desired, desc, clientStatus)
	list := p.plan.NodeUpdate[a.NodeID]
	c := list[len(list)-1]
	c.ModifyTime = p.now
	if clientStatus == structs.AllocClientStatusLost {
		c.ClientDescription = allocDescLostClientMsg
	}
	if !p.stopped[a.ID] && !a.TerminalStatus() {
		if u := p.usage[a.NodeID]; u != nil {
			u.remove(a)
		}
	}
	p.stopped[a.ID] = true
	return c
}

// loadNodes reads and sorts every node once.
func (p *planner) loadNodes() error {
	if p.nodesRead {
		return nil
	}
	nodes, err := p.st.Nodes()
	if err != nil {
		return fmt.Errorf("reading nodes: %w", err)
	}
	p.nodes = sortNodes(nodes)
	p.nodeByID = make(map[string]*structs.Node, len(nodes))
	for _, n := range p.nodes {
		p.nodeByID[n.ID] = n
	}
	p.nodesRead = true
	return nil
}

// node returns the node by ID, or nil when it no longer exists.
func (p *planner) node(id string) (*structs.Node, error) {
	if err := p.loadNodes(); err != nil {
		return nil, err
	}
	if n, ok := p.nodeByID[id]; ok {
		return n, nil
	}
	n, err := p.st.NodeByID(id)
	if err != nil {
		return nil, fmt.Errorf("reading node %q: %w", id, err)
	}
	return n, nil
}

// recordFailure folds a failed placement's metric into the group's entry:
// the first failure's metric is kept and later ones are coalesced.
func (p *planner) recordFailure(group string, m *structs.AllocMetric) {
	p.queued[group]++
	if prev, ok := p.failed[group]; ok {
		prev.CoalescedFailures++
		return
	}
	p.failed[group] = m
}

// newAlloc builds a pending allocation of tg at idx on node.
func (p *planner) newAlloc(tg *structs.TaskGroup, idx int, node *structs.Node) *structs.Allocation {
	ask := groupAsk(tg)
	var allocated *structs.AllocatedResources
	if u := p.usage[node.ID]; u != nil {
		// fit loaded the node's usage and found these ports free.
		if ports, _ := assignPorts(node, u, tg); len(ports) > 0 {
			allocated = &structs.AllocatedResources{Shared: structs.AllocatedSharedResources{Ports: ports}}
		}
	}
	return &structs.Allocation{
		ID:                 p.opts.NewID(),
		AllocatedResources: allocated,
		Namespace:          p.job.Namespace,
		EvalID:             p.eval.ID,
		Name:               structs.AllocName(p.job.ID, tg.Name, idx),
		NodeID:             node.ID,
		NodeName:           node.Name,
		JobID:              p.job.ID,
		Job:                p.job,
		TaskGroup:          tg.Name,
		Resources:          &ask,
		DesiredStatus:      structs.AllocDesiredStatusRun,
		ClientStatus:       structs.AllocClientStatusPending,
		CreateTime:         p.now,
		ModifyTime:         p.now,
	}
}

// groupAsk sums a group's task resources.
func groupAsk(tg *structs.TaskGroup) structs.Resources {
	var r structs.Resources
	for _, t := range tg.Tasks {
		if t.Resources != nil {
			r.CPU += t.Resources.CPU
			r.MemoryMB += t.Resources.MemoryMB
		}
	}
	return r
}
