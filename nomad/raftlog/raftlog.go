// Package raftlog stands between Raft and the store that holds its log, and
// makes the first append or delete that fails the last one.
//
// A write that fails leaves the store in a state nothing above it can
// repair. raft-wal, after a segment rotation that found no room for the
// next segment file, answers every later append with "segment is sealed",
// even once space is free; hashicorp/raft, after a failed append that
// followed a truncation of a conflicting suffix, keeps a last index the
// log does not have; and our meta store refuses every write after one whose
// outcome on disk is unknown. A server that goes on in any of these states
// falls silently behind, or worse. So the first failed write is reported
// (Fail) and every later one is refused with the same error, unrun: the
// server stops with that error, and its supervisor starts it again, which
// reopens the log from what is on disk (crash-safe by design) and catches
// up from the leader.
//
// A failed write is never acknowledged: Raft hands the error to every
// write of the batch and a leader steps down. The error wraps
// structs.ErrRaftLogWrite, which the HTTP API answers with 503.
//
// Raft's stable keys (term and vote) are not refused after a failed
// append: a server stopping after one must still be able to vote or start
// an election on its way out, and the meta store that holds them is a
// separate pair of preallocated files, which a full disk does not stop
// (it refuses writes by itself once one of its own failed). A term that
// cannot be written stops the server too (Stable), where Raft would
// panic.
package raftlog

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/types"

	"github.com/roamhq/roam/structs"
)

// Guard is a Store that refuses every write after the first that failed.
// Reads pass through: what is on disk stays readable, and Raft panics on a
// failed read of an entry it knows it has.
type Guard struct {
	store raft.LogStore
	dir   string
	// fail is called once, with the first failed write's error, outside mu.
	fail func(error)

	mu sync.Mutex
	// failed is the first failed write's error, wrapped; nil while every
	// write succeeded.
	failed error
}

var (
	_ raft.LogStore          = (*Guard)(nil)
	_ raft.MonotonicLogStore = (*Guard)(nil)
)

// New guards store, whose files are in dir (named in errors). fail is
// called once, shortly after the first write that fails, with the error
// the write returned, on a goroutine of its own.
func New(store raft.LogStore, dir string, fail func(error)) *Guard {
	return &Guard{store: store, dir: dir, fail: fail}
}

// Failed returns the first failed write's error, or nil.
func (g *Guard) Failed() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.failed
}

// write runs one write unless an earlier one failed, and records its
// failure. Writes are not serialised here: Raft's own goroutines already
// order them, and the store below is safe for concurrent use.
func (g *Guard) write(op string, f func() error) error {
	if err := g.Failed(); err != nil {
		return err
	}
	err := f()
	if err == nil {
		return nil
	}
	hint := ""
	if errors.Is(err, types.ErrSealed) {
		// raft-wal logs why it could not start the next segment; its
		// append only says the current one is full.
		hint = " (the log could not start its next segment file: is the disk full? the raft-wal rotate error logged before says)"
	}
	wrapped := fmt.Errorf("%w: %s on %s: %w%s; this server stops so that its supervisor restarts it, which reopens the log from disk and catches up",
		structs.ErrRaftLogWrite, op, g.dir, err, hint)
	g.mu.Lock()
	first := g.failed == nil
	if first {
		g.failed = wrapped
	}
	g.mu.Unlock()
	if !first {
		// Two writes failed at once; the first one recorded is the answer.
		return g.Failed()
	}
	if g.fail != nil {
		// Reported a moment later, so that Raft hands this error to the
		// writes that wait on it (and their callers answer with it)
		// before the server starts to stop.
		time.AfterFunc(failReportDelay, func() { g.fail(wrapped) })
	}
	return wrapped
}

// failReportDelay is how long after a failed write Fail is called.
const failReportDelay = 250 * time.Millisecond

func (g *Guard) FirstIndex() (uint64, error) { return g.store.FirstIndex() }

func (g *Guard) LastIndex() (uint64, error) { return g.store.LastIndex() }

func (g *Guard) GetLog(index uint64, log *raft.Log) error { return g.store.GetLog(index, log) }

func (g *Guard) StoreLog(log *raft.Log) error {
	return g.write("append to the raft log", func() error { return g.store.StoreLog(log) })
}

func (g *Guard) StoreLogs(logs []*raft.Log) error {
	return g.write("append to the raft log", func() error { return g.store.StoreLogs(logs) })
}

func (g *Guard) DeleteRange(min, max uint64) error {
	return g.write("delete from the raft log", func() error { return g.store.DeleteRange(min, max) })
}

// IsMonotonic passes on whether the store takes only consecutive indexes
// (raft-wal does), so that Raft clears it after restoring a snapshot.
func (g *Guard) IsMonotonic() bool {
	m, ok := g.store.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}
