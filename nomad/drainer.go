package nomad

import (
	"context"
	"time"

	memdb "github.com/hashicorp/go-memdb"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// drainInterval bounds how long the drainer waits between passes when
// nothing it watches changes (deadlines need a clock, not a change).
const drainInterval = time.Second

// runDrainer drives every draining node to empty: it asks each live
// allocation to migrate (the scheduler moves them within each group's
// max_parallel), stops what is left at the deadline or at once for a
// forced drain, then the system allocations (unless ignored) once the rest
// are gone and their volume claims released, and ends the drain when the
// node has nothing left to move, leaving it ineligible.
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
		system    []*structs.Allocation
	)
	drain := func(a *structs.Allocation) {
		if a.DesiredStatus != structs.AllocDesiredStatusRun {
			return // already stopping; wait for the client
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
			c.ModifyTime = time.Now().UnixNano()
			t := true
			c.DesiredTransition.Migrate = &t
			stop = append(stop, c)
		case !a.DesiredTransition.ShouldMigrate():
			t := true
			migrate[a.ID] = &structs.DesiredTransition{Migrate: &t}
		default:
			return
		}
		if job != nil {
			jobs[jobKey{job.Namespace, job.ID}] = job
		}
	}
	for _, a := range allocs {
		if a.ClientTerminalStatus() {
			continue
		}
		if a.Job != nil && a.Job.Type == structs.JobTypeSystem {
			if !d.IgnoreSystemJobs {
				remaining++
				system = append(system, a)
			}
			continue
		}
		remaining++
		drain(a)
	}
	// System allocations go last: among them are the node's CSI plugins,
	// and the volumes of the allocations that just left must still be
	// unpublished through them. So they stop only once every other
	// allocation here is done and no claim of another allocation names
	// this node; past the deadline, that wait is bounded by
	// Config.DrainClaimGrace, so a claim that cannot be released does not hold
	// the drain forever.
	if len(system) > 0 && remaining == len(system) {
		own := make(map[string]bool, len(system))
		for _, a := range system {
			own[a.ID] = true
		}
		vols, err := nodeClaims(store, ws, n.ID, own)
		if err != nil {
			return err
		}
		switch {
		case len(vols) == 0:
			for _, a := range system {
				drain(a)
			}
		case force && time.Since(forcedAt(d)) > s.config.DrainClaimGrace:
			s.logger.Warn("draining node: stopping system allocations although volume claims still name the node",
				"node_id", n.ID, "volumes", vols, "waited", s.config.DrainClaimGrace)
			for _, a := range system {
				drain(a)
			}
		default:
			s.logger.Debug("draining node: system allocations wait for volume claims to be released",
				"node_id", n.ID, "volumes", vols)
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

// nodeClaims returns the IDs of the volumes with a claim, in any state,
// that names nodeID and belongs to an allocation not in except. ws, if
// set, wakes when claims change.
func nodeClaims(store *state.StateStore, ws memdb.WatchSet, nodeID string, except map[string]bool) ([]string, error) {
	vols, err := store.CSIVolumes(ws, structs.DefaultNamespace, "")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, v := range vols {
		for allocID, c := range v.Claims {
			if c.NodeID == nodeID && !except[allocID] {
				out = append(out, v.ID)
				break
			}
		}
	}
	return out, nil
}
