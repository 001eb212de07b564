package nomad

import (
	"fmt"
	"time"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// Job serves job registration and job reads.
type Job struct {
	srv *Server
}

func jobNamespace(ns string) string {
	if ns == "" {
		return structs.DefaultNamespace
	}
	return ns
}

// Register stores a job and creates the evaluation that places it. The job
// is canonicalized and validated here too, under the server's job limits,
// so a caller that skipped the parsers still cannot store an invalid or
// oversized job.
func (j *Job) Register(args *structs.JobRegisterRequest, reply *structs.JobRegisterResponse) error {
	if done, err := j.srv.forward("Job.Register", args, args, reply); done {
		return err
	}
	if args.Job == nil {
		return fmt.Errorf("%w: missing job", structs.ErrInvalidRequest)
	}
	job := *args.Job
	// Before Canonicalize, which walks every group and task.
	if err := j.srv.config.JobLimits.CheckSize(&job); err != nil {
		return fmt.Errorf("%w: %w", structs.ErrInvalidRequest, err)
	}
	job.Canonicalize()
	if err := job.ValidateWith(j.srv.config.JobLimits); err != nil {
		return err
	}
	existing, err := j.srv.State().JobByID(nil, job.Namespace, job.ID)
	if err != nil {
		return err
	}
	if args.EnforceIndex {
		var have uint64
		if existing != nil {
			have = existing.JobModifyIndex
		}
		if have != args.JobModifyIndex {
			return fmt.Errorf("%w: enforcing job modify index %d: job has index %d", structs.ErrInvalidRequest, args.JobModifyIndex, have)
		}
	}
	job.Stop = args.Job.Stop
	job.SubmitTime = time.Now().UnixNano()
	job.Status, job.StatusDescription = "", ""
	eval := j.srv.evalForJob(&job, structs.EvalTriggerJobRegister, "")
	req := structs.JobRegisterRequest{Job: &job, Eval: eval, WriteRequest: args.WriteRequest}
	_, index, err := j.srv.raftApply(structs.JobRegisterRequestType, &req)
	if err != nil {
		return err
	}
	reply.EvalID = eval.ID
	reply.EvalCreateIndex = index
	reply.JobModifyIndex = index
	reply.Index = index
	return nil
}

// Deregister stops a job (or removes it with Purge) and creates the
// evaluation that stops its allocations.
func (j *Job) Deregister(args *structs.JobDeregisterRequest, reply *structs.JobDeregisterResponse) error {
	if done, err := j.srv.forward("Job.Deregister", args, args, reply); done {
		return err
	}
	if args.JobID == "" {
		return fmt.Errorf("%w: missing job ID", structs.ErrInvalidRequest)
	}
	job, err := j.srv.State().JobByID(nil, structs.DefaultNamespace, args.JobID)
	if err != nil {
		return err
	}
	if job == nil {
		return fmt.Errorf("%w: job %q", structs.ErrNotFound, args.JobID)
	}
	eval := j.srv.evalForJob(job, structs.EvalTriggerJobDeregister, "")
	req := structs.JobDeregisterRequest{JobID: args.JobID, Purge: args.Purge, Eval: eval, WriteRequest: args.WriteRequest}
	_, index, err := j.srv.raftApply(structs.JobDeregisterRequestType, &req)
	if err != nil {
		return err
	}
	reply.EvalID = eval.ID
	reply.EvalCreateIndex = index
	reply.JobModifyIndex = index
	reply.Index = index
	return nil
}

// List returns job stubs with their status and summary.
func (j *Job) List(args *structs.JobListRequest, reply *structs.JobListResponse) error {
	if done, err := j.srv.forward("Job.List", args, args, reply); done {
		return err
	}
	return j.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		jobs, err := store.Jobs(ws, structs.DefaultNamespace, args.Prefix)
		if err != nil {
			return err
		}
		reply.Jobs = make([]*structs.JobListStub, 0, len(jobs))
		for _, job := range jobs {
			stub, err := jobStub(ws, store, job)
			if err != nil {
				return err
			}
			reply.Jobs = append(reply.Jobs, stub)
		}
		reply.Index, err = maxTableIndex(store, state.TableJobs, state.TableAllocs)
		return err
	})
}

// GetJob returns one job with its derived status; nil when unknown.
func (j *Job) GetJob(args *structs.JobSpecificRequest, reply *structs.SingleJobResponse) error {
	if done, err := j.srv.forward("Job.GetJob", args, args, reply); done {
		return err
	}
	return j.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		job, err := store.JobByID(ws, structs.DefaultNamespace, args.JobID)
		if err != nil {
			return err
		}
		reply.Job = nil
		if job == nil {
			reply.Index, err = store.Index(state.TableJobs)
			return err
		}
		c := *job
		allocs, err := store.AllocsByJob(ws, job.Namespace, job.ID)
		if err != nil {
			return err
		}
		evals, err := store.EvalsByJob(ws, job.Namespace, job.ID)
		if err != nil {
			return err
		}
		c.Status = jobStatus(&c, allocs, evals)
		reply.Job = &c
		reply.Index = job.ModifyIndex
		return nil
	})
}

// Allocations returns a job's allocations; terminal ones only with All.
func (j *Job) Allocations(args *structs.JobSpecificRequest, reply *structs.JobAllocationsResponse) error {
	if done, err := j.srv.forward("Job.Allocations", args, args, reply); done {
		return err
	}
	return j.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		allocs, err := store.AllocsByJob(ws, structs.DefaultNamespace, args.JobID)
		if err != nil {
			return err
		}
		reply.Allocations = make([]*structs.AllocListStub, 0, len(allocs))
		for _, a := range allocs {
			reply.Allocations = append(reply.Allocations, a.Stub())
		}
		reply.Index, err = store.Index(state.TableAllocs)
		return err
	})
}

// Evaluations returns a job's evaluations.
func (j *Job) Evaluations(args *structs.JobSpecificRequest, reply *structs.JobEvaluationsResponse) error {
	if done, err := j.srv.forward("Job.Evaluations", args, args, reply); done {
		return err
	}
	return j.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		evals, err := store.EvalsByJob(ws, structs.DefaultNamespace, args.JobID)
		if err != nil {
			return err
		}
		reply.Evaluations = evals
		if reply.Evaluations == nil {
			reply.Evaluations = []*structs.Evaluation{}
		}
		reply.Index, err = store.Index(state.TableEvals)
		return err
	})
}

// jobStatus derives a job's status rather than storing it: running while
// any allocation is live, pending while evaluations are outstanding, dead
// otherwise (stopped, finished, or failed for good).
func jobStatus(job *structs.Job, allocs []*structs.Allocation, evals []*structs.Evaluation) string {
	for _, a := range allocs {
		if !a.TerminalStatus() {
			return structs.JobStatusRunning
		}
	}
	if job.Stop {
		return structs.JobStatusDead
	}
	for _, e := range evals {
		if !e.TerminalStatus() {
			return structs.JobStatusPending
		}
	}
	if len(allocs) == 0 {
		return structs.JobStatusPending
	}
	return structs.JobStatusDead
}

func jobStub(ws memdb.WatchSet, store *state.StateStore, job *structs.Job) (*structs.JobListStub, error) {
	allocs, err := store.AllocsByJob(ws, job.Namespace, job.ID)
	if err != nil {
		return nil, err
	}
	evals, err := store.EvalsByJob(ws, job.Namespace, job.ID)
	if err != nil {
		return nil, err
	}
	summary := &structs.JobSummary{JobID: job.ID, Namespace: job.Namespace, Summary: map[string]structs.TaskGroupSummary{}}
	for _, tg := range job.TaskGroups {
		summary.Summary[tg.Name] = structs.TaskGroupSummary{}
	}
	for _, a := range allocs {
		s := summary.Summary[a.TaskGroup]
		switch a.ClientStatus {
		case structs.AllocClientStatusRunning:
			s.Running++
		case structs.AllocClientStatusPending:
			s.Starting++
		case structs.AllocClientStatusComplete:
			s.Complete++
		case structs.AllocClientStatusFailed:
			s.Failed++
		case structs.AllocClientStatusLost:
			s.Lost++
		}
		summary.Summary[a.TaskGroup] = s
	}
	return &structs.JobListStub{
		ID: job.ID, Name: job.Name, Namespace: job.Namespace, Type: job.Type, Priority: job.Priority,
		Datacenters: job.Datacenters, Stop: job.Stop, Status: jobStatus(job, allocs, evals),
		JobSummary: summary, Version: job.Version, SubmitTime: job.SubmitTime,
		CreateIndex: job.CreateIndex, ModifyIndex: job.ModifyIndex, JobModifyIndex: job.JobModifyIndex,
	}, nil
}

// maxTableIndex is the highest index of the given tables.
func maxTableIndex(store *state.StateStore, tables ...string) (uint64, error) {
	var max uint64
	for _, t := range tables {
		idx, err := store.Index(t)
		if err != nil {
			return 0, err
		}
		if idx > max {
			max = idx
		}
	}
	return max, nil
}
