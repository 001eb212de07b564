package state

import (
	"fmt"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/roamhq/roam/structs"
)

// Restore loads a store from a snapshot stream in one transaction: either
// every object lands or none does.
type Restore struct {
	store *StateStore
	txn   *memdb.Txn
}

// Restore starts a restore into s, which should be a new, empty store.
func (s *StateStore) Restore() *Restore {
	return &Restore{store: s, txn: s.db.Txn(true)}
}

// Node adds a node.
func (r *Restore) Node(n *structs.Node) error {
	if err := r.txn.Insert(TableNodes, n); err != nil {
		return fmt.Errorf("state: restore node: %w", err)
	}
	return nil
}

// Job adds a job.
func (r *Restore) Job(j *structs.Job) error {
	if err := r.txn.Insert(TableJobs, j); err != nil {
		return fmt.Errorf("state: restore job: %w", err)
	}
	return nil
}

// Alloc adds an allocation.
func (r *Restore) Alloc(a *structs.Allocation) error {
	if err := r.txn.Insert(TableAllocs, a); err != nil {
		return fmt.Errorf("state: restore alloc: %w", err)
	}
	return nil
}

// Eval adds an evaluation.
func (r *Restore) Eval(e *structs.Evaluation) error {
	if err := r.txn.Insert(TableEvals, e); err != nil {
		return fmt.Errorf("state: restore eval: %w", err)
	}
	return nil
}

// CSIVolume adds a volume.
func (r *Restore) CSIVolume(v *structs.CSIVolume) error {
	if err := r.txn.Insert(TableCSIVolumes, v); err != nil {
		return fmt.Errorf("state: restore volume: %w", err)
	}
	return nil
}

// CSIPlugin adds a plugin.
func (r *Restore) CSIPlugin(p *structs.CSIPlugin) error {
	if err := r.txn.Insert(TableCSIPlugins, p); err != nil {
		return fmt.Errorf("state: restore plugin: %w", err)
	}
	return nil
}

// IndexEntry adds a table index.
func (r *Restore) IndexEntry(e *IndexEntry) error {
	if err := r.txn.Insert(TableIndex, e); err != nil {
		return fmt.Errorf("state: restore index: %w", err)
	}
	return nil
}

// Commit makes the restore visible.
func (r *Restore) Commit() { r.txn.Commit() }

// Abort discards it.
func (r *Restore) Abort() { r.txn.Abort() }
