package state

import (
	"fmt"
	"time"

	"github.com/roamhq/roam/structs"
)

// The operations below each apply one Raft entry in one transaction, so a
// job and the evaluation it triggers, or a plan's allocations and its
// evaluation, become visible together or not at all.

// RegisterJob stores a job and its evaluation.
func (s *StateStore) RegisterJob(index uint64, job *structs.Job, eval *structs.Evaluation) error {
	txn := s.writeTxn()
	defer txn.Abort()
	if err := upsertJobTxn(txn, index, job); err != nil {
		return err
	}
	if err := upsertEvalsTxn(txn, index, evalList(eval)); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

// DeregisterJob marks a job stopped, or removes it when purge is set, and
// stores the evaluation that stops its allocations.
func (s *StateStore) DeregisterJob(index uint64, namespace, id string, purge bool, eval *structs.Evaluation) error {
	txn := s.writeTxn()
	defer txn.Abort()
	raw, err := txn.First(TableJobs, "id", namespace, id)
	if err != nil {
		return fmt.Errorf("state: job lookup: %w", err)
	}
	if raw == nil {
		return fmt.Errorf("%w: job %q", structs.ErrNotFound, id)
	}
	if purge {
		if err := txn.Delete(TableJobs, raw); err != nil {
			return fmt.Errorf("state: job delete: %w", err)
		}
		if err := setIndexTxn(txn, TableJobs, index); err != nil {
			return err
		}
	} else {
		j := *raw.(*structs.Job)
		j.Stop = true
		// Stopping is not a new specification: keep the version.
		j.ModifyIndex = index
		if err := txn.Insert(TableJobs, &j); err != nil {
			return fmt.Errorf("state: job insert: %w", err)
		}
		if err := setIndexTxn(txn, TableJobs, index); err != nil {
			return err
		}
	}
	if err := upsertEvalsTxn(txn, index, evalList(eval)); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

// ApplyPlanResults stores a plan's stopped and placed or updated
// allocations and the evaluations it settles or creates.
func (s *StateStore) ApplyPlanResults(index uint64, stopped, placed []*structs.Allocation, evals []*structs.Evaluation) error {
	txn := s.writeTxn()
	defer txn.Abort()
	if len(stopped)+len(placed) > 0 {
		if err := upsertAllocsTxn(txn, index, append(append([]*structs.Allocation(nil), stopped...), placed...)); err != nil {
			return err
		}
	}
	if err := upsertEvalsTxn(txn, index, evals); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

// UpdateAllocsFromClientWithEvals records a client's updates and the
// evaluations they trigger.
func (s *StateStore) UpdateAllocsFromClientWithEvals(index uint64, updates []*structs.Allocation, evals []*structs.Evaluation) error {
	txn := s.writeTxn()
	defer txn.Abort()
	if err := updateAllocsFromClientTxn(txn, index, updates); err != nil {
		return err
	}
	if err := upsertEvalsTxn(txn, index, evals); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

// UpdateAllocDesiredTransitions sets the drainer's requests on allocations
// and stores the evaluations that act on them.
func (s *StateStore) UpdateAllocDesiredTransitions(index uint64, transitions map[string]*structs.DesiredTransition, evals []*structs.Evaluation) error {
	txn := s.writeTxn()
	defer txn.Abort()
	for id, dt := range transitions {
		raw, err := txn.First(TableAllocs, "id", id)
		if err != nil {
			return fmt.Errorf("state: alloc lookup: %w", err)
		}
		if raw == nil {
			continue // collected meanwhile; nothing to move
		}
		c := raw.(*structs.Allocation).Copy()
		if dt.Migrate != nil {
			c.DesiredTransition.Migrate = dt.Migrate
		}
		if dt.Reschedule != nil {
			c.DesiredTransition.Reschedule = dt.Reschedule
		}
		if dt.ForceReschedule != nil {
			c.DesiredTransition.ForceReschedule = dt.ForceReschedule
		}
		c.ModifyIndex = index
		if err := txn.Insert(TableAllocs, c); err != nil {
			return fmt.Errorf("state: alloc insert: %w", err)
		}
	}
	if err := setIndexTxn(txn, TableAllocs, index); err != nil {
		return err
	}
	if err := upsertEvalsTxn(txn, index, evals); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

// UpdateNodeDrain starts (strategy set) or ends (nil) a node's drain. A
// drain makes the node ineligible; ending one leaves it ineligible unless
// markEligible. LastDrain records the drain: draining while it runs, then
// complete (the drainer ended it, complete set) or canceled.
func (s *StateStore) UpdateNodeDrain(index uint64, nodeID string, strategy *structs.DrainStrategy, markEligible, complete bool, updatedAt int64, evals []*structs.Evaluation) error {
	return s.updateNode(index, nodeID, evals, func(n *structs.Node) {
		now := time.Unix(updatedAt, 0).UTC()
		switch {
		case strategy != nil:
			started := strategy.StartedAt
			if n.DrainStrategy != nil && n.LastDrain != nil {
				started = n.LastDrain.StartedAt // an update of a running drain
			}
			n.LastDrain = &structs.DrainMetadata{StartedAt: started, UpdatedAt: strategy.StartedAt, Status: structs.DrainStatusDraining}
		case n.DrainStrategy != nil:
			ld := structs.DrainMetadata{StartedAt: n.DrainStrategy.StartedAt, Status: structs.DrainStatusCanceled}
			if n.LastDrain != nil {
				ld = *n.LastDrain
			}
			// updatedAt has whole seconds; the drain's start does not.
			ld.UpdatedAt, ld.Status = now, structs.DrainStatusCanceled
			if ld.UpdatedAt.Before(ld.StartedAt) {
				ld.UpdatedAt = ld.StartedAt
			}
			if complete {
				ld.Status = structs.DrainStatusComplete
			}
			n.LastDrain = &ld
		}
		n.DrainStrategy = strategy
		n.Drain = strategy != nil
		switch {
		case strategy != nil:
			n.SchedulingEligibility = structs.NodeSchedulingIneligible
		case markEligible:
			n.SchedulingEligibility = structs.NodeSchedulingEligible
		}
		n.StatusUpdatedAt = updatedAt
	})
}

// UpdateNodeEligibility sets a node's scheduling eligibility.
func (s *StateStore) UpdateNodeEligibility(index uint64, nodeID, eligibility string, updatedAt int64, evals []*structs.Evaluation) error {
	return s.updateNode(index, nodeID, evals, func(n *structs.Node) {
		n.SchedulingEligibility = eligibility
		n.StatusUpdatedAt = updatedAt
	})
}

// updateNode applies change to a copy of the node and stores it with evals.
func (s *StateStore) updateNode(index uint64, nodeID string, evals []*structs.Evaluation, change func(*structs.Node)) error {
	txn := s.writeTxn()
	defer txn.Abort()
	raw, err := txn.First(TableNodes, "id", nodeID)
	if err != nil {
		return fmt.Errorf("state: node lookup: %w", err)
	}
	if raw == nil {
		return fmt.Errorf("%w: %s", structs.ErrUnknownNode, nodeID)
	}
	n := raw.(*structs.Node).Copy()
	change(n)
	n.ModifyIndex = index
	if err := txn.Insert(TableNodes, n); err != nil {
		return fmt.Errorf("state: node insert: %w", err)
	}
	if err := setIndexTxn(txn, TableNodes, index); err != nil {
		return err
	}
	if err := upsertEvalsTxn(txn, index, evals); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

func evalList(e *structs.Evaluation) []*structs.Evaluation {
	if e == nil {
		return nil
	}
	return []*structs.Evaluation{e}
}
