package state

import (
	"fmt"

	memdb "github.com/hashicorp/go-memdb"

	"github.com/roamhq/roam/structs"
)

// TableClusterMeta holds the one row of cluster metadata.
const TableClusterMeta = "cluster_meta"

func init() {
	schemaFactories = append(schemaFactories, clusterMetaTableSchema)
}

func clusterMetaTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableClusterMeta,
		Indexes: map[string]*memdb.IndexSchema{
			"id": {
				Name:    "id",
				Unique:  true,
				Indexer: &memdb.StringFieldIndex{Field: "ClusterID"},
			},
		},
	}
}

// ClusterMetadata returns the cluster's metadata, or nil before the first
// leader set it.
func (s *StateStore) ClusterMetadata(ws memdb.WatchSet) (*structs.ClusterMetadata, error) {
	txn := s.db.Txn(false)
	it, err := txn.Get(TableClusterMeta, "id")
	if err != nil {
		return nil, fmt.Errorf("state: cluster metadata: %w", err)
	}
	ws.Add(it.WatchCh())
	raw := it.Next()
	if raw == nil {
		return nil, nil
	}
	return raw.(*structs.ClusterMetadata), nil
}

// SetClusterMetadata stores m unless the cluster already has an ID: the
// first leader's write wins, and a later one (two leaders in quick
// succession) changes nothing.
func (s *StateStore) SetClusterMetadata(index uint64, m *structs.ClusterMetadata) error {
	if m == nil || m.ClusterID == "" {
		return fmt.Errorf("%w: cluster metadata without an ID", structs.ErrInvalidRequest)
	}
	txn := s.db.Txn(true)
	defer txn.Abort()
	existing, err := txn.First(TableClusterMeta, "id")
	if err != nil {
		return fmt.Errorf("state: cluster metadata: %w", err)
	}
	if existing != nil {
		return nil
	}
	c := *m
	if err := txn.Insert(TableClusterMeta, &c); err != nil {
		return fmt.Errorf("state: cluster metadata insert: %w", err)
	}
	if err := setIndexTxn(txn, TableClusterMeta, index); err != nil {
		return err
	}
	txn.Commit()
	return nil
}

// ClusterMetadata adds the cluster metadata to a restore.
func (r *Restore) ClusterMetadata(m *structs.ClusterMetadata) error {
	if err := r.txn.Insert(TableClusterMeta, m); err != nil {
		return fmt.Errorf("state: restore cluster metadata: %w", err)
	}
	return nil
}
