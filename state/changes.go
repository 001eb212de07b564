package state

import (
	"sync/atomic"

	memdb "github.com/hashicorp/go-memdb"
)

// Change is one object a committed write changed: Before is nil for an
// insert, After nil for a delete. Both are the store's own objects, which
// are never mutated: a reader may keep them but must not change them.
type Change struct {
	Table  string
	Before any
	After  any
}

// ChangeHook is told, after each write at a Raft index commits, of the
// objects it changed (the index table left out). It runs on the writer's
// goroutine, the FSM's, so it must not block.
type ChangeHook func(index uint64, changes []Change)

// changeHook holds the hook; a separate type so the store is not copied
// with it.
type changeHook struct {
	fn atomic.Pointer[ChangeHook]
}

// SetChangeHook sets (or, with nil, clears) the hook.
func (s *StateStore) SetChangeHook(h ChangeHook) {
	if h == nil {
		s.hook.fn.Store(nil)
		return
	}
	s.hook.fn.Store(&h)
}

// writeTxn starts a write transaction that records what it changes.
func (s *StateStore) writeTxn() *memdb.Txn {
	txn := s.db.Txn(true)
	txn.TrackChanges()
	return txn
}

// commit commits txn, a write at index, and then tells the hook what it
// changed.
func (s *StateStore) commit(txn *memdb.Txn, index uint64) {
	h := s.hook.fn.Load()
	if h == nil {
		txn.Commit()
		return
	}
	raw := txn.Changes()
	txn.Commit()
	changes := make([]Change, 0, len(raw))
	for _, c := range raw {
		if c.Table == TableIndex {
			continue
		}
		changes = append(changes, Change{Table: c.Table, Before: c.Before, After: c.After})
	}
	(*h)(index, changes)
}
