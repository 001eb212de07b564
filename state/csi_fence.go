package state

import (
	"fmt"

	memdb "github.com/hashicorp/go-memdb"

	"github.com/roamhq/roam/structs"
)

// TableCSIFences holds one structs.CSIControllerFence per plugin ID.
const TableCSIFences = "csi_fences"

func init() {
	schemaFactories = append(schemaFactories, csiFenceTableSchema)
}

func csiFenceTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableCSIFences,
		Indexes: map[string]*memdb.IndexSchema{
			"id": {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "PluginID"}},
		},
	}
}

// UpsertCSIControllerFence records the node a plugin's destructive calls
// go to.
func (s *StateStore) UpsertCSIControllerFence(index uint64, f *structs.CSIControllerFence) error {
	if f == nil || f.PluginID == "" || f.NodeID == "" {
		return fmt.Errorf("%w: controller fence needs a plugin ID and a node ID", structs.ErrInvalidRequest)
	}
	txn := s.db.Txn(true)
	defer txn.Abort()
	existing, err := txn.First(TableCSIFences, "id", f.PluginID)
	if err != nil {
		return fmt.Errorf("state: controller fence: %w", err)
	}
	c := *f
	c.CreateIndex, c.ModifyIndex = index, index
	if existing != nil {
		c.CreateIndex = existing.(*structs.CSIControllerFence).CreateIndex
	}
	if err := txn.Insert(TableCSIFences, &c); err != nil {
		return fmt.Errorf("state: controller fence insert: %w", err)
	}
	if err := setIndexTxn(txn, TableCSIFences, index); err != nil {
		return err
	}
	txn.Commit()
	return nil
}

// CSIControllerFence returns pluginID's fence, or nil.
func (s *StateStore) CSIControllerFence(ws memdb.WatchSet, pluginID string) (*structs.CSIControllerFence, error) {
	txn := s.db.Txn(false)
	ch, raw, err := txn.FirstWatch(TableCSIFences, "id", pluginID)
	if err != nil {
		return nil, fmt.Errorf("state: controller fence: %w", err)
	}
	ws.Add(ch)
	if raw == nil {
		return nil, nil
	}
	return raw.(*structs.CSIControllerFence), nil
}

// CSIControllerFences returns every plugin's fence.
func (s *StateStore) CSIControllerFences(ws memdb.WatchSet) ([]*structs.CSIControllerFence, error) {
	txn := s.db.Txn(false)
	it, err := txn.Get(TableCSIFences, "id")
	if err != nil {
		return nil, fmt.Errorf("state: controller fences: %w", err)
	}
	ws.Add(it.WatchCh())
	var out []*structs.CSIControllerFence
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*structs.CSIControllerFence))
	}
	return out, nil
}

// CSIControllerFence adds a fence to a restore.
func (r *Restore) CSIControllerFence(f *structs.CSIControllerFence) error {
	if err := r.txn.Insert(TableCSIFences, f); err != nil {
		return fmt.Errorf("state: restore controller fence: %w", err)
	}
	return nil
}
