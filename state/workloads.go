package state

import (
	"fmt"
	"sort"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/roamhq/roam/structs"
)

// UpsertJob stores a job at index. A changed specification bumps Version
// and JobModifyIndex; CreateIndex is kept.
func (s *StateStore) UpsertJob(index uint64, job *structs.Job) error {
	txn := s.writeTxn()
	defer txn.Abort()
	if err := upsertJobTxn(txn, index, job); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

func upsertJobTxn(txn *memdb.Txn, index uint64, job *structs.Job) error {
	j := *job
	existing, err := txn.First(TableJobs, "id", j.Namespace, j.ID)
	if err != nil {
		return fmt.Errorf("state: job lookup: %w", err)
	}
	if existing != nil {
		old := existing.(*structs.Job)
		j.CreateIndex = old.CreateIndex
		j.Version = old.Version + 1
	} else {
		j.CreateIndex = index
		j.Version = 0
	}
	j.ModifyIndex = index
	j.JobModifyIndex = index
	if j.Status == "" {
		j.Status = structs.JobStatusPending
	}
	if err := txn.Insert(TableJobs, &j); err != nil {
		return fmt.Errorf("state: job insert: %w", err)
	}
	return setIndexTxn(txn, TableJobs, index)
}

// DeleteJob removes a job (purge). Its allocations and evaluations stay
// until garbage collected.
func (s *StateStore) DeleteJob(index uint64, namespace, id string) error {
	txn := s.writeTxn()
	defer txn.Abort()
	existing, err := txn.First(TableJobs, "id", namespace, id)
	if err != nil {
		return fmt.Errorf("state: job lookup: %w", err)
	}
	if existing == nil {
		return fmt.Errorf("%w: job %q", structs.ErrNotFound, id)
	}
	if err := txn.Delete(TableJobs, existing); err != nil {
		return fmt.Errorf("state: job delete: %w", err)
	}
	if err := setIndexTxn(txn, TableJobs, index); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

// JobByID returns the job or nil.
func (s *StateStore) JobByID(ws memdb.WatchSet, namespace, id string) (*structs.Job, error) {
	txn := s.db.Txn(false)
	ch, raw, err := txn.FirstWatch(TableJobs, "id", namespace, id)
	if err != nil {
		return nil, fmt.Errorf("state: job lookup: %w", err)
	}
	ws.Add(ch)
	if raw == nil {
		return nil, nil
	}
	return raw.(*structs.Job), nil
}

// Jobs returns every job in namespace whose ID starts with prefix, by ID.
func (s *StateStore) Jobs(ws memdb.WatchSet, namespace, prefix string) ([]*structs.Job, error) {
	txn := s.db.Txn(false)
	iter, err := txn.Get(TableJobs, "id_prefix", namespace, prefix)
	if err != nil {
		return nil, fmt.Errorf("state: job scan: %w", err)
	}
	ws.Add(iter.WatchCh())
	var out []*structs.Job
	for raw := iter.Next(); raw != nil; raw = iter.Next() {
		out = append(out, raw.(*structs.Job))
	}
	return out, nil
}

// UpsertEvals stores evaluations at index.
func (s *StateStore) UpsertEvals(index uint64, evals []*structs.Evaluation) error {
	txn := s.writeTxn()
	defer txn.Abort()
	if err := upsertEvalsTxn(txn, index, evals); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

func upsertEvalsTxn(txn *memdb.Txn, index uint64, evals []*structs.Evaluation) error {
	if len(evals) == 0 {
		return nil
	}
	for _, e := range evals {
		c := e.Copy()
		existing, err := txn.First(TableEvals, "id", c.ID)
		if err != nil {
			return fmt.Errorf("state: eval lookup: %w", err)
		}
		if existing != nil {
			c.CreateIndex = existing.(*structs.Evaluation).CreateIndex
		} else {
			c.CreateIndex = index
		}
		c.ModifyIndex = index
		if err := txn.Insert(TableEvals, c); err != nil {
			return fmt.Errorf("state: eval insert: %w", err)
		}
	}
	return setIndexTxn(txn, TableEvals, index)
}

// EvalByID returns the evaluation or nil.
func (s *StateStore) EvalByID(ws memdb.WatchSet, id string) (*structs.Evaluation, error) {
	txn := s.db.Txn(false)
	ch, raw, err := txn.FirstWatch(TableEvals, "id", id)
	if err != nil {
		return nil, fmt.Errorf("state: eval lookup: %w", err)
	}
	ws.Add(ch)
	if raw == nil {
		return nil, nil
	}
	return raw.(*structs.Evaluation), nil
}

// Evals returns every evaluation whose ID starts with prefix, by ID.
func (s *StateStore) Evals(ws memdb.WatchSet, prefix string) ([]*structs.Evaluation, error) {
	return getAll(s, ws, func(e *structs.Evaluation) string { return e.ID }, TableEvals, "id_prefix", prefix)
}

// EvalsByJob returns a job's evaluations, by ID.
func (s *StateStore) EvalsByJob(ws memdb.WatchSet, namespace, jobID string) ([]*structs.Evaluation, error) {
	return getAll(s, ws, func(e *structs.Evaluation) string { return e.ID }, TableEvals, "job", namespace, jobID)
}

// UpsertAllocs stores allocations at index. For an allocation the store
// already has, the client's view (ClientStatus, TaskStates) is kept unless
// the update carries one, so a server-side change cannot erase what the
// client reported.
func (s *StateStore) UpsertAllocs(index uint64, allocs []*structs.Allocation) error {
	txn := s.writeTxn()
	defer txn.Abort()
	if err := upsertAllocsTxn(txn, index, allocs); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

func upsertAllocsTxn(txn *memdb.Txn, index uint64, allocs []*structs.Allocation) error {
	for _, a := range allocs {
		c := a.Copy()
		existing, err := txn.First(TableAllocs, "id", c.ID)
		if err != nil {
			return fmt.Errorf("state: alloc lookup: %w", err)
		}
		if existing != nil {
			old := existing.(*structs.Allocation)
			c.CreateIndex = old.CreateIndex
			if c.ClientStatus == "" {
				c.ClientStatus = old.ClientStatus
			}
			if c.TaskStates == nil {
				c.TaskStates = old.TaskStates
			}
			if c.Job == nil {
				c.Job = old.Job
			}
		} else {
			c.CreateIndex = index
		}
		c.ModifyIndex = index
		c.AllocModifyIndex = index
		if err := txn.Insert(TableAllocs, c); err != nil {
			return fmt.Errorf("state: alloc insert: %w", err)
		}
	}
	return setIndexTxn(txn, TableAllocs, index)
}

// UpdateAllocsFromClient records what a client reports: status,
// description and task states. Unknown allocations are an error and
// nothing is written.
func (s *StateStore) UpdateAllocsFromClient(index uint64, updates []*structs.Allocation) error {
	return s.UpdateAllocsFromClientWithEvals(index, updates, nil)
}

func updateAllocsFromClientTxn(txn *memdb.Txn, index uint64, updates []*structs.Allocation) error {
	for _, u := range updates {
		existing, err := txn.First(TableAllocs, "id", u.ID)
		if err != nil {
			return fmt.Errorf("state: alloc lookup: %w", err)
		}
		if existing == nil {
			return fmt.Errorf("%w: allocation %s", structs.ErrNotFound, u.ID)
		}
		c := existing.(*structs.Allocation).Copy()
		c.ClientStatus = u.ClientStatus
		c.ClientDescription = u.ClientDescription
		if u.TaskStates != nil {
			c.TaskStates = u.Copy().TaskStates
		}
		c.ModifyTime = u.ModifyTime
		c.ModifyIndex = index
		if err := txn.Insert(TableAllocs, c); err != nil {
			return fmt.Errorf("state: alloc insert: %w", err)
		}
	}
	return setIndexTxn(txn, TableAllocs, index)
}

// AllocByID returns the allocation or nil.
func (s *StateStore) AllocByID(ws memdb.WatchSet, id string) (*structs.Allocation, error) {
	txn := s.db.Txn(false)
	ch, raw, err := txn.FirstWatch(TableAllocs, "id", id)
	if err != nil {
		return nil, fmt.Errorf("state: alloc lookup: %w", err)
	}
	ws.Add(ch)
	if raw == nil {
		return nil, nil
	}
	return raw.(*structs.Allocation), nil
}

// Allocs returns every allocation whose ID starts with prefix, by ID.
func (s *StateStore) Allocs(ws memdb.WatchSet, prefix string) ([]*structs.Allocation, error) {
	return getAll(s, ws, allocID, TableAllocs, "id_prefix", prefix)
}

// AllocsByJob returns a job's allocations, terminal ones included, by ID.
func (s *StateStore) AllocsByJob(ws memdb.WatchSet, namespace, jobID string) ([]*structs.Allocation, error) {
	return getAll(s, ws, allocID, TableAllocs, "job", namespace, jobID)
}

// AllocsByNode returns a node's allocations, terminal ones included, by ID.
func (s *StateStore) AllocsByNode(ws memdb.WatchSet, nodeID string) ([]*structs.Allocation, error) {
	return getAll(s, ws, allocID, TableAllocs, "node", nodeID)
}

func allocID(a *structs.Allocation) string { return a.ID }

// getAll collects every object an index lookup returns, sorted by key so
// callers see a stable order whatever the index.
func getAll[T any](s *StateStore, ws memdb.WatchSet, key func(T) string, table, index string, args ...any) ([]T, error) {
	txn := s.db.Txn(false)
	iter, err := txn.Get(table, index, args...)
	if err != nil {
		return nil, fmt.Errorf("state: %s scan by %s: %w", table, index, err)
	}
	ws.Add(iter.WatchCh())
	var out []T
	for raw := iter.Next(); raw != nil; raw = iter.Next() {
		out = append(out, raw.(T))
	}
	sort.Slice(out, func(i, j int) bool { return key(out[i]) < key(out[j]) })
	return out, nil
}
