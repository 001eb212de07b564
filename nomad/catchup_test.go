package nomad

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"
)

// storeLogs writes entries (type, term) at indexes 1, 2, ... into a new
// in-memory log.
func storeLogs(t *testing.T, entries ...raft.Log) *raft.InmemStore {
	t.Helper()
	s := raft.NewInmemStore()
	for i := range entries {
		entries[i].Index = uint64(i + 1)
	}
	logs := make([]*raft.Log, len(entries))
	for i := range entries {
		logs[i] = &entries[i]
	}
	must.NoError(t, s.StoreLogs(logs))
	return s
}

func TestLastEarlierCommand(t *testing.T) {
	cmd := func(term uint64) raft.Log { return raft.Log{Type: raft.LogCommand, Term: term} }
	noop := func(term uint64) raft.Log { return raft.Log{Type: raft.LogNoop, Term: term} }
	barrier := func(term uint64) raft.Log { return raft.Log{Type: raft.LogBarrier, Term: term} }
	config := func(term uint64) raft.Log { return raft.Log{Type: raft.LogConfiguration, Term: term} }

	// 1 cmd(1), 2 noop(2), 3 cmd(2), 4 barrier(2), 5 config(2), 6 noop(3), 7 cmd(3)
	logs := storeLogs(t, cmd(1), noop(2), cmd(2), barrier(2), config(2), noop(3), cmd(3))
	cases := []struct {
		name                string
		term, last, applied uint64
		want                uint64
	}{
		{"the new term's own entries do not count", 3, 7, 0, 3},
		{"applied up to the last earlier command", 3, 7, 3, 0},
		{"applied past it", 3, 7, 5, 0},
		{"an earlier command not yet applied", 3, 7, 2, 3},
		{"only terms before the leader's", 2, 7, 0, 1},
		{"last bounds the walk", 3, 2, 0, 1},
		{"an empty range", 3, 0, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, known := lastEarlierCommand(logs, tc.term, tc.last, tc.applied)
			must.True(t, known)
			must.Eq(t, tc.want, got)
		})
	}

	t.Run("no log store", func(t *testing.T) {
		_, known := lastEarlierCommand(nil, 3, 7, 0)
		must.False(t, known)
	})

	t.Run("entries below the first are in a snapshot the FSM has", func(t *testing.T) {
		compacted := storeLogs(t, cmd(1), noop(2), cmd(2), barrier(2), config(2), noop(3), cmd(3))
		must.NoError(t, compacted.DeleteRange(1, 3))
		got, known := lastEarlierCommand(compacted, 3, 7, 0)
		must.True(t, known)
		must.Eq(t, 0, got)
	})

	t.Run("a log that cannot be read cannot tell", func(t *testing.T) {
		_, known := lastEarlierCommand(failingLogs{logs}, 3, 7, 0)
		must.False(t, known)
	})

	t.Run("past the walk's bound the log cannot tell", func(t *testing.T) {
		entries := []raft.Log{cmd(1)}
		for range catchUpWalk {
			entries = append(entries, noop(2))
		}
		long := storeLogs(t, entries...)
		last := uint64(len(entries))
		_, known := lastEarlierCommand(long, 3, last, 0)
		must.False(t, known)
		// One entry fewer to read and the command is found.
		got, known := lastEarlierCommand(long, 3, last-1, 0)
		must.True(t, known)
		must.Eq(t, 1, got)
	})
}

// failingLogs is a log store whose reads fail.
type failingLogs struct{ raft.LogStore }

func (failingLogs) GetLog(uint64, *raft.Log) error { return errors.New("disk on fire") }

func TestFSM_WaitApplied(t *testing.T) {
	f, err := NewFSM(hclog.NewNullLogger())
	must.NoError(t, err)
	apply := func(index uint64) { f.Apply(&raft.Log{Index: index, Type: raft.LogCommand}) }

	t.Run("returns once the index is applied", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { done <- f.waitApplied(context.Background(), 5) }()
		for i := uint64(1); i <= 4; i++ {
			apply(i)
		}
		select {
		case err := <-done:
			t.Fatalf("returned with index 4 applied: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		apply(5)
		select {
		case err := <-done:
			must.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("still waiting with index 5 applied")
		}
		must.Eq(t, 5, f.Applied())
		// Already applied: no wait.
		must.NoError(t, f.waitApplied(context.Background(), 3))
	})

	t.Run("a failed entry counts as applied", func(t *testing.T) {
		// An entry no handler knows fails the same way on every server.
		res := f.Apply(&raft.Log{Index: 6, Type: raft.LogCommand, Data: []byte{0xff}})
		must.ErrorIs(t, res.(error), errUnknownMessage)
		must.Eq(t, 6, f.Applied())
	})

	t.Run("ends with its context", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		must.ErrorIs(t, f.waitApplied(ctx, 1000), context.DeadlineExceeded)
	})

	t.Run("no wake-up is lost", func(t *testing.T) {
		g, err := NewFSM(hclog.NewNullLogger())
		must.NoError(t, err)
		const n = 2000
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for w := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- g.waitApplied(ctx, uint64(w*n/64+1))
			}()
		}
		for i := uint64(1); i <= n; i++ {
			g.Apply(&raft.Log{Index: i, Type: raft.LogCommand})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			must.NoError(t, err)
		}
	})
}
