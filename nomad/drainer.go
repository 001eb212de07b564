package nomad

import (
	"context"
	"sort"
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
	nodes, err := store.DrainingNodes(ws)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if err := s.drainNode(ws, n); err != nil {
			s.logger.Error("drain failed", "node_id", n.ID, "error", err)
		}
	}
	return nil
}

// drainNode runs one drain pass over node n: it reads what planDrain needs
// from the state store (adding what it reads to ws), and applies the plan
// through Raft.
func (s *Server) drainNode(ws memdb.WatchSet, n *structs.Node) error {
	in, err := s.drainInput(ws, n, time.Now())
	if err != nil {
		return err
	}
	plan := planDrain(in)

	switch plan.System {
	case systemWaitClaims:
		s.logger.Debug("draining node: system allocations wait for volume claims to be released",
			"node_id", n.ID, "volumes", plan.ClaimVolumes)
	case systemForced:
		s.logger.Warn("draining node: stopping system allocations although volume claims still name the node",
			"node_id", n.ID, "volumes", plan.ClaimVolumes, "waited", in.ClaimGrace)
	}

	evals := make([]*structs.Evaluation, 0, len(plan.Evaluate))
	for _, job := range plan.Evaluate {
		evals = append(evals, s.evalForJob(job, structs.EvalTriggerNodeDrain, n.ID))
	}
	switch {
	case len(plan.Stop) > 0:
		s.logger.Info("drain deadline reached; stopping remaining allocations", "node_id", n.ID, "allocs", len(plan.Stop))
		_, _, err := s.raftApply(structs.ApplyPlanResultsRequestType, &structs.ApplyPlanResultsRequest{AllocsStopped: plan.Stop, Evals: evals})
		return err
	case len(plan.Migrate) > 0:
		s.logger.Info("draining node: allocations marked for migration", "node_id", n.ID, "allocs", len(plan.Migrate))
		migrate := make(map[string]*structs.DesiredTransition, len(plan.Migrate))
		for _, id := range plan.Migrate {
			t := true
			migrate[id] = &structs.DesiredTransition{Migrate: &t}
		}
		_, _, err := s.raftApply(structs.AllocUpdateDesiredTransitionRequestType, &structs.AllocUpdateDesiredTransitionRequest{Allocs: migrate, Evals: evals})
		return err
	case plan.Complete:
		s.logger.Info("drain complete; node stays ineligible", "node_id", n.ID)
		_, _, err := s.raftApply(structs.NodeUpdateDrainRequestType, &structs.NodeUpdateDrainRequest{
			NodeID: n.ID, UpdatedAt: in.Now.Unix(), Complete: true,
		})
		return err
	}
	return nil
}

// drainInput reads what planDrain needs to decide a pass over node n at
// now: its allocations, their jobs as the store has them now, and the
// volume claims that name it.
func (s *Server) drainInput(ws memdb.WatchSet, n *structs.Node, now time.Time) (drainInput, error) {
	store := s.State()
	allocs, err := store.AllocsByNode(ws, n.ID)
	if err != nil {
		return drainInput{}, err
	}
	jobs := make(map[jobKey]*structs.Job)
	for _, a := range allocs {
		k := jobKey{a.Namespace, a.JobID}
		if _, ok := jobs[k]; ok || a.ClientTerminalStatus() {
			continue
		}
		job, err := store.JobByID(nil, a.Namespace, a.JobID)
		if err != nil {
			return drainInput{}, err
		}
		jobs[k] = job
	}
	claims, err := claimsNaming(store, ws, n.ID)
	if err != nil {
		return drainInput{}, err
	}
	return drainInput{
		Strategy:   n.DrainStrategy,
		Allocs:     allocs,
		Jobs:       jobs,
		Claims:     claims,
		ClaimGrace: s.config.DrainClaimGrace,
		Now:        now,
	}, nil
}

// claimsNaming returns the volume claims, in any state, that name nodeID,
// by volume then allocation. ws, if set, wakes when claims change.
func claimsNaming(store *state.StateStore, ws memdb.WatchSet, nodeID string) ([]drainClaim, error) {
	vols, err := store.CSIVolumes(ws, structs.DefaultNamespace, "")
	if err != nil {
		return nil, err
	}
	var out []drainClaim
	for _, v := range vols {
		for allocID, c := range v.Claims {
			if c.NodeID == nodeID {
				out = append(out, drainClaim{VolumeID: v.ID, AllocID: allocID})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].VolumeID != out[j].VolumeID {
			return out[i].VolumeID < out[j].VolumeID
		}
		return out[i].AllocID < out[j].AllocID
	})
	return out, nil
}

// nodeClaims returns the IDs of the volumes with a claim, in any state,
// that names nodeID and belongs to an allocation not in except. ws, if
// set, wakes when claims change.
func nodeClaims(store *state.StateStore, ws memdb.WatchSet, nodeID string, except map[string]bool) ([]string, error) {
	claims, err := claimsNaming(store, ws, nodeID)
	if err != nil {
		return nil, err
	}
	return claimVolumes(claims, except), nil
}
