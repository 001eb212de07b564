// Package state is Roam's in-memory state store: go-memdb tables written by
// the Raft FSM at a Raft index, read through snapshots and watch sets.
package state

import (
	"fmt"

	memdb "github.com/hashicorp/go-memdb"
)

// StateStore holds the cluster's state. Every write names the Raft index it
// is applied at; objects handed out are never mutated afterwards.
type StateStore struct {
	db *memdb.MemDB

	// abandonCh is closed when a restore replaces this store, waking every
	// blocked query so it re-reads from the new one.
	abandonCh chan struct{}

	// hook is told of every committed write (SetChangeHook).
	hook *changeHook
}

// NewStateStore returns an empty store.
func NewStateStore() (*StateStore, error) {
	db, err := memdb.NewMemDB(stateSchema())
	if err != nil {
		return nil, fmt.Errorf("state: create memdb: %w", err)
	}
	return &StateStore{db: db, abandonCh: make(chan struct{}), hook: &changeHook{}}, nil
}

// AbandonCh is closed when the store has been replaced by a restore.
func (s *StateStore) AbandonCh() <-chan struct{} { return s.abandonCh }

// Abandon marks the store as replaced. Safe to call once.
func (s *StateStore) Abandon() { close(s.abandonCh) }

// Snapshot returns a point-in-time view that later writes do not change.
func (s *StateStore) Snapshot() *StateSnapshot {
	return &StateSnapshot{StateStore: StateStore{db: s.db.Snapshot(), abandonCh: s.abandonCh, hook: &changeHook{}}}
}

// StateSnapshot is a read-only copy of the store.
type StateSnapshot struct {
	StateStore
}

// Index returns the last Raft index that touched table, or 0.
func (s *StateStore) Index(table string) (uint64, error) {
	txn := s.db.Txn(false)
	raw, err := txn.First(TableIndex, "id", table)
	if err != nil {
		return 0, fmt.Errorf("state: index lookup %q: %w", table, err)
	}
	if raw == nil {
		return 0, nil
	}
	return raw.(*IndexEntry).Value, nil
}

// LatestIndex returns the highest index of any table.
func (s *StateStore) LatestIndex() (uint64, error) {
	txn := s.db.Txn(false)
	iter, err := txn.Get(TableIndex, "id")
	if err != nil {
		return 0, fmt.Errorf("state: index scan: %w", err)
	}
	var max uint64
	for raw := iter.Next(); raw != nil; raw = iter.Next() {
		if v := raw.(*IndexEntry).Value; v > max {
			max = v
		}
	}
	return max, nil
}

// Indexes returns every table's index; used by snapshots.
func (s *StateStore) Indexes() ([]*IndexEntry, error) {
	txn := s.db.Txn(false)
	iter, err := txn.Get(TableIndex, "id")
	if err != nil {
		return nil, fmt.Errorf("state: index scan: %w", err)
	}
	var out []*IndexEntry
	for raw := iter.Next(); raw != nil; raw = iter.Next() {
		out = append(out, raw.(*IndexEntry))
	}
	return out, nil
}

// setIndexTxn records that table changed at index, inside txn.
func setIndexTxn(txn *memdb.Txn, table string, index uint64) error {
	raw, err := txn.First(TableIndex, "id", table)
	if err != nil {
		return fmt.Errorf("state: index lookup %q: %w", table, err)
	}
	if raw != nil && raw.(*IndexEntry).Value >= index {
		return nil
	}
	if err := txn.Insert(TableIndex, &IndexEntry{Key: table, Value: index}); err != nil {
		return fmt.Errorf("state: index update %q: %w", table, err)
	}
	return nil
}

// WatchTables adds to ws, for each table, a channel that is closed by the
// next write to it (its entry in the index table is replaced). It is one
// channel per table, however many of its objects a caller reads.
func (s *StateStore) WatchTables(ws memdb.WatchSet, tables ...string) error {
	txn := s.db.Txn(false)
	for _, table := range tables {
		ch, _, err := txn.FirstWatch(TableIndex, "id", table)
		if err != nil {
			return fmt.Errorf("state: watch table %q: %w", table, err)
		}
		ws.Add(ch)
	}
	return nil
}
