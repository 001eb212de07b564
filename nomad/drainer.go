package nomad

import (
	"context"
	"time"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/roamhq/roam/structs"
)

// drainInterval bounds how long the drainer waits between passes when
// nothing it watches changes (deadlines need a clock, not a change).
const drainInterval = time.Second

// runDrainer drives every draining node to empty: it asks each live
// allocation to migrate (the scheduler moves them within each group's
// max_parallel), stops what is left at the deadline or at once for a
// forced drain, and ends the drain when the node has nothing left to
// move, leaving it ineligible.
func (s *Server) runDrainer(ctx context.Context) {
	for {
		ws := memdb.NewWatchSet()
		if err := s.drainPass(ws); err != nil {
			s.logger.Error("drain pass failed", "error", err)
		}
		wctx, cancel := context.WithTimeout(ctx, drainInterval)
		_ = ws.WatchCtx(wctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
	}
}

func (s *Server) drainPass(ws memdb.WatchSet) error {
	store := s.State()
	ws.Add(store.AbandonCh())
	nodes, err := store.Nodes(ws)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n.DrainStrategy == nil {
			continue
		}
		if err := s.drainNode(ws, n); err != nil {
			s.logger.Error("drain failed", "node_id", n.ID, "error", err)
		}
	}
	return nil
}

func (s *Server) drainNode(ws memdb.WatchSet, n *structs.Node) error {
	store := s.State()
	allocs, err := store.AllocsByNode(ws, n.ID)
	if err != nil {
		return err
	}
	d := n.DrainStrategy
	force := d.Deadline < 0 || (!d.ForceDeadline.IsZero() && !time.Now().Before(d.ForceDeadline))

	var (
		remaining int
		migrate   = make(map[string]*structs.DesiredTransition)
		stop      []*structs.Allocation
		jobs      = make(map[jobKey]*structs.Job)
	)
	for _, a := range allocs {
		if a.ClientTerminalStatus() {
			continue
		}
		system := a.Job != nil && a.Job.Type == structs.JobTypeSystem
		if system && d.IgnoreSystemJobs {
			continue
		}
		remaining++
		if a.DesiredStatus != structs.AllocDesiredStatusRun {
			continue // already stopping; wait for the client
		}
		job := a.Job
		if current, _ := store.JobByID(nil, a.Namespace, a.JobID); current != nil {
			job = current
		}
		switch {
		case force:
			c := a.Copy()
			c.DesiredStatus = structs.AllocDesiredStatusStop
			c.DesiredDescription = "alloc stopped: node drain reached its deadline"
			t := true
			c.DesiredTransition.Migrate = &t
			stop = append(stop, c)
		case !a.DesiredTransition.ShouldMigrate():
			t := true
			migrate[a.ID] = &structs.DesiredTransition{Migrate: &t}
		default:
			continue
		}
		if job != nil {
			jobs[jobKey{job.Namespace, job.ID}] = job
		}
	}

	var evals []*structs.Evaluation
	for _, job := range jobs {
		evals = append(evals, s.evalForJob(job, structs.EvalTriggerNodeDrain, n.ID))
	}
	switch {
	case len(stop) > 0:
		s.logger.Info("drain deadline reached; stopping remaining allocations", "node_id", n.ID, "allocs", len(stop))
		_, _, err := s.raftApply(structs.ApplyPlanResultsRequestType, &structs.ApplyPlanResultsRequest{AllocsStopped: stop, Evals: evals})
		return err
	case len(migrate) > 0:
		s.logger.Info("draining node: allocations marked for migration", "node_id", n.ID, "allocs", len(migrate))
		_, _, err := s.raftApply(structs.AllocUpdateDesiredTransitionRequestType, &structs.AllocUpdateDesiredTransitionRequest{Allocs: migrate, Evals: evals})
		return err
	case remaining == 0:
		s.logger.Info("drain complete; node stays ineligible", "node_id", n.ID)
		_, _, err := s.raftApply(structs.NodeUpdateDrainRequestType, &structs.NodeUpdateDrainRequest{
			NodeID: n.ID, UpdatedAt: time.Now().Unix(),
		})
		return err
	}
	return nil
}
