package nomad

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	metrics "github.com/hashicorp/go-metrics"
	"github.com/roamhq/roam/scheduler"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// schedulerWorkers is how many evaluations the leader processes at once
// (for different jobs; one job's evaluations run one at a time).
const schedulerWorkers = 2

// runWorker processes evaluations until ctx ends.
func (s *Server) runWorker(ctx context.Context) {
	for {
		eval, err := s.broker.dequeue(ctx)
		if err != nil {
			return
		}
		start := time.Now()
		if err := s.processEval(ctx, eval); err != nil {
			s.logger.Error("evaluation failed", "eval_id", eval.ID, "job_id", eval.JobID, "error", err)
		}
		metrics.MeasureSince([]string{"worker", "eval"}, start)
		s.broker.ack(eval)
	}
}

// snapshotState adapts a state snapshot to what the scheduler reads.
type snapshotState struct{ snap *state.StateSnapshot }

var _ scheduler.State = snapshotState{}

func (st snapshotState) Nodes() ([]*structs.Node, error) { return st.snap.Nodes(nil) }
func (st snapshotState) NodeByID(id string) (*structs.Node, error) {
	return st.snap.NodeByID(nil, id)
}
func (st snapshotState) AllocsByJob(ns, id string) ([]*structs.Allocation, error) {
	return st.snap.AllocsByJob(nil, ns, id)
}
func (st snapshotState) AllocsByNode(id string) ([]*structs.Allocation, error) {
	return st.snap.AllocsByNode(nil, id)
}
func (st snapshotState) JobByID(ns, id string) (*structs.Job, error) {
	return st.snap.JobByID(nil, ns, id)
}

// processEval schedules one evaluation and commits its plan.
func (s *Server) processEval(ctx context.Context, eval *structs.Evaluation) error {
	gen := s.broker.unblockGen()
	if h := s.config.schedulerPassHook; h != nil {
		h()
	}
	snap := s.State().Snapshot()
	plan, result, err := scheduler.Process(snapshotState{snap}, eval, scheduler.Options{
		Now:     time.Now(),
		NewID:   uuid.NewString,
		Volumes: &volumeChecker{snap: snap, namespace: eval.Namespace},
		Limits:  &s.config.JobLimits,
	})
	now := time.Now().UnixNano()
	done := eval.Copy()
	done.ModifyTime = now
	if err != nil {
		done.Status = structs.EvalStatusFailed
		done.StatusDescription = err.Error()
		_, _, aerr := s.raftApply(structs.EvalUpdateRequestType, &structs.EvalUpdateRequest{Evals: []*structs.Evaluation{done}})
		return errors.Join(err, aerr)
	}

	done.Status = structs.EvalStatusComplete
	done.QueuedAllocations = result.QueuedAllocations
	done.FailedTGAllocs = result.FailedTGAllocs
	if result.Blocked {
		done.Status = structs.EvalStatusBlocked
		done.StatusDescription = "some placements found no node; waiting for capacity"
	}
	p := &pendingPlan{plan: plan, eval: eval, done: done, followup: result.FollowupEval, now: now,
		reply: make(chan planResult, 1)}
	// Only the leader applies plans, one at a time, in runPlanApplier, so
	// its re-check sees every earlier plan's placements.
	select {
	case s.plans <- p:
	case <-ctx.Done():
		return fmt.Errorf("apply plan: %w", structs.ErrNoLeader)
	}
	var r planResult
	select {
	case r = <-p.reply:
	case <-ctx.Done():
		// The applier answers every plan it took before it returns, but
		// this worker's term is over: the outcome is the next leader's
		// to find in the state.
		return fmt.Errorf("apply plan: %w", structs.ErrNoLeader)
	}
	if r.err != nil {
		return fmt.Errorf("apply plan: %w", r.err)
	}
	if done.Status == structs.EvalStatusBlocked {
		s.broker.block(done, gen)
	}
	if r.stopped > 0 {
		// Stops free capacity for other jobs' blocked evaluations; not for
		// this job's own, which just saw them and would loop.
		s.broker.unblock(keyOf(eval))
	}
	return nil
}

// pendingPlan is a worker's plan on its way to the plan applier.
type pendingPlan struct {
	plan       *structs.Plan
	eval, done *structs.Evaluation
	followup   *structs.Evaluation
	now        int64
	reply      chan planResult // buffered: the applier never waits on it
}

// planResult is the applier's answer: the Raft apply's error, and how
// many allocations the plan stopped.
type planResult struct {
	err     error
	stopped int
}

// runPlanApplier applies the workers' plans one at a time until ctx (the
// leader's term) ends. Owning the queue replaces a mutex that was held
// across the Raft apply.
func (s *Server) runPlanApplier(ctx context.Context) {
	for {
		select {
		case p := <-s.plans:
			// select picks at random among ready cases: a plan taken
			// after the term ended is refused, not applied.
			if ctx.Err() != nil {
				p.reply <- planResult{err: structs.ErrNoLeader}
				continue
			}
			p.reply <- s.applyPlan(p)
		case <-ctx.Done():
			return
		}
	}
}

// applyPlan re-checks p's placements against the current state and
// commits what still fits, with the evaluation's outcome, through Raft.
func (s *Server) applyPlan(p *pendingPlan) planResult {
	req, rejected := s.checkPlan(p.plan)
	req.Evals = append(req.Evals, p.done)
	if f := p.followup; f != nil {
		f.CreateTime, f.ModifyTime = p.now, p.now
		req.Evals = append(req.Evals, f)
	}
	if rejected > 0 {
		// The cluster changed under the scheduler: evaluate again.
		req.Evals = append(req.Evals, s.newEval(p.eval.Namespace, p.eval.JobID, p.eval.Type, p.eval.Priority, structs.EvalTriggerQueuedAllocs, ""))
	}
	if _, _, err := s.raftApply(structs.ApplyPlanResultsRequestType, req); err != nil {
		return planResult{err: err}
	}
	return planResult{stopped: len(req.AllocsStopped)}
}

// checkPlan re-checks, against the current state, that each node can still
// take what the plan places on it, and drops the placements of nodes that
// cannot. Updates of existing allocations (a failed alloc's NextAllocation)
// always pass: they hold no resources.
func (s *Server) checkPlan(plan *structs.Plan) (*structs.ApplyPlanResultsRequest, int) {
	store := s.State()
	req := &structs.ApplyPlanResultsRequest{}
	stopping := make(map[string]bool)
	for _, allocs := range plan.NodeUpdate {
		for _, a := range allocs {
			stopping[a.ID] = true
			req.AllocsStopped = append(req.AllocsStopped, a)
		}
	}
	rejected := 0
	for nodeID, allocs := range plan.NodeAllocation {
		var placing, updating []*structs.Allocation
		for _, a := range allocs {
			if existing, _ := store.AllocByID(nil, a.ID); existing != nil {
				updating = append(updating, a)
			} else {
				placing = append(placing, a)
			}
		}
		req.AllocsPlaced = append(req.AllocsPlaced, updating...)
		if len(placing) == 0 {
			continue
		}
		node, err := store.NodeByID(nil, nodeID)
		var onNode []*structs.Allocation
		if err == nil {
			onNode, err = store.AllocsByNode(nil, nodeID)
		}
		ok, reason := false, "state read failed"
		if err == nil {
			ok, reason = scheduler.NodeFits(node, onNode, stopping, placing)
		}
		if !ok {
			s.logger.Warn("plan placements rejected at apply time", "node_id", nodeID, "reason", reason, "allocs", len(placing))
			rejected += len(placing)
			continue
		}
		req.AllocsPlaced = append(req.AllocsPlaced, placing...)
	}
	return req, rejected
}

// newEval builds a pending evaluation for a job.
func (s *Server) newEval(namespace, jobID, jobType string, priority int, trigger, nodeID string) *structs.Evaluation {
	now := time.Now().UnixNano()
	return &structs.Evaluation{
		ID:          uuid.NewString(),
		Namespace:   namespace,
		Priority:    priority,
		Type:        jobType,
		TriggeredBy: trigger,
		JobID:       jobID,
		NodeID:      nodeID,
		Status:      structs.EvalStatusPending,
		CreateTime:  now,
		ModifyTime:  now,
	}
}

// evalsForJob builds an evaluation for job.
func (s *Server) evalForJob(job *structs.Job, trigger, nodeID string) *structs.Evaluation {
	return s.newEval(job.Namespace, job.ID, job.Type, job.Priority, trigger, nodeID)
}

// evalsForNode builds one evaluation per job with a live allocation on the
// node, plus one per system job (which may need to place there).
func (s *Server) evalsForNode(nodeID, trigger string) ([]*structs.Evaluation, error) {
	store := s.State()
	allocs, err := store.AllocsByNode(nil, nodeID)
	if err != nil {
		return nil, err
	}
	seen := make(map[jobKey]bool)
	var evals []*structs.Evaluation
	add := func(job *structs.Job) {
		k := jobKey{job.Namespace, job.ID}
		if !seen[k] {
			seen[k] = true
			evals = append(evals, s.evalForJob(job, trigger, nodeID))
		}
	}
	for _, a := range allocs {
		if a.TerminalStatus() {
			continue
		}
		if job, _ := store.JobByID(nil, a.Namespace, a.JobID); job != nil {
			add(job)
		} else if a.Job != nil {
			add(a.Job)
		}
	}
	jobs, err := store.Jobs(nil, structs.DefaultNamespace, "")
	if err != nil {
		return nil, err
	}
	for _, j := range jobs {
		if j.Type == structs.JobTypeSystem && !j.Stop {
			add(j)
		}
	}
	return evals, nil
}

// onApply is the FSM's hook: on the leader it queues new evaluations and,
// when capacity may have grown, unblocks blocked ones.
func (s *Server) onApply(t structs.MessageType, evals []*structs.Evaluation) {
	s.broker.enqueue(evals...)
	switch t {
	case structs.NodeRegisterRequestType, structs.NodeUpdateStatusRequestType,
		structs.NodeUpdateEligibilityRequestType, structs.NodeUpdateDrainRequestType,
		structs.AllocClientUpdateRequestType:
		s.broker.unblock()
	}
}

// restoreEvals queues every pending or blocked evaluation in state; run
// when gaining leadership.
func (s *Server) restoreEvals() error {
	evals, err := s.State().Evals(nil, "")
	if err != nil {
		return err
	}
	s.broker.enqueue(evals...)
	return nil
}
