package nomad

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
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

var (
	cmdAt     = func(term uint64) raft.Log { return raft.Log{Type: raft.LogCommand, Term: term} }
	noopAt    = func(term uint64) raft.Log { return raft.Log{Type: raft.LogNoop, Term: term} }
	barrierAt = func(term uint64) raft.Log { return raft.Log{Type: raft.LogBarrier, Term: term} }
	configAt  = func(term uint64) raft.Log { return raft.Log{Type: raft.LogConfiguration, Term: term} }
)

// sampleLog is 1 cmd(1), 2 noop(2), 3 cmd(2), 4 barrier(2), 5 config(2),
// 6 noop(3), 7 cmd(3).
func sampleLog() []raft.Log {
	return []raft.Log{cmdAt(1), noopAt(2), cmdAt(2), barrierAt(2), configAt(2), noopAt(3), cmdAt(3)}
}

// indexOf returns a commandIndex over entries, either written through it
// or found in the log when it starts.
func indexOf(t *testing.T, seeded bool, entries ...raft.Log) *commandIndex {
	t.Helper()
	if seeded {
		c, err := newCommandIndex(storeLogs(t, entries...))
		must.NoError(t, err)
		return c
	}
	c, err := newCommandIndex(raft.NewInmemStore())
	must.NoError(t, err)
	for i := range entries {
		entries[i].Index = uint64(i + 1)
		must.NoError(t, c.StoreLog(&entries[i]))
	}
	return c
}

func TestCommandIndex_LastEarlierCommand(t *testing.T) {
	cases := []struct {
		name          string
		term, applied uint64
		want          uint64
	}{
		{"the new term's own command does not count", 3, 0, 3},
		{"applied up to the last earlier command", 3, 3, 0},
		{"applied past it", 3, 5, 0},
		{"an earlier command not yet applied", 3, 2, 3},
		{"only terms before the leader's", 2, 0, 1},
		{"every command earlier", 4, 0, 7},
		{"every command earlier and applied", 4, 7, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, known := indexOf(t, false, sampleLog()...).lastEarlierCommand(tc.term, tc.applied)
			must.True(t, known)
			must.Eq(t, tc.want, got)
		})
	}

	// After a restart the index knows the newest command in the log, the
	// one a lookup for any later term needs.
	for _, tc := range cases[len(cases)-2:] {
		t.Run(tc.name+" after a restart", func(t *testing.T) {
			got, known := indexOf(t, true, sampleLog()...).lastEarlierCommand(tc.term, tc.applied)
			must.True(t, known)
			must.Eq(t, tc.want, got)
		})
	}

	t.Run("a deleted suffix is forgotten", func(t *testing.T) {
		c := indexOf(t, false, sampleLog()...)
		must.NoError(t, c.DeleteRange(7, 7))
		got, _ := c.lastEarlierCommand(4, 0)
		must.Eq(t, 3, got)
		// Raft writes the suffix again, in a later term.
		must.NoError(t, c.StoreLog(&raft.Log{Index: 7, Term: 4, Type: raft.LogNoop}))
		got, _ = c.lastEarlierCommand(5, 0)
		must.Eq(t, 3, got)
	})

	t.Run("a failed delete forgets nothing", func(t *testing.T) {
		c := indexOf(t, false, sampleLog()...)
		c.LogStore = failingLogs{c.LogStore}
		must.Error(t, c.DeleteRange(7, 7))
		got, known := c.lastEarlierCommand(4, 3)
		must.True(t, known)
		must.Eq(t, 7, got, must.Sprint("command 7 is still in the log"))
	})

	t.Run("an index written again replaces the old record", func(t *testing.T) {
		c := indexOf(t, false, sampleLog()...)
		must.NoError(t, c.StoreLog(&raft.Log{Index: 7, Term: 4, Type: raft.LogCommand}))
		got, _ := c.lastEarlierCommand(4, 0)
		must.Eq(t, 3, got, must.Sprint("index 7 is now of term 4"))
	})

	t.Run("commands compacted into a snapshot are applied", func(t *testing.T) {
		c := indexOf(t, false, sampleLog()...)
		must.NoError(t, c.DeleteRange(1, 3))
		got, known := c.lastEarlierCommand(3, 0)
		must.True(t, known)
		must.Eq(t, 0, got)
	})

	t.Run("past the commands it lists it cannot tell", func(t *testing.T) {
		var entries []raft.Log
		for range maxCommandRefs {
			entries = append(entries, cmdAt(1))
		}
		c := indexOf(t, false, entries...)
		got, known := c.lastEarlierCommand(2, 0)
		must.True(t, known)
		must.Eq(t, maxCommandRefs, got)
		// As many commands of term 2: those of term 1 drop out.
		for i := range maxCommandRefs {
			must.NoError(t, c.StoreLog(&raft.Log{Index: uint64(maxCommandRefs + i + 1), Term: 2, Type: raft.LogCommand}))
		}
		_, known = c.lastEarlierCommand(2, 0)
		must.False(t, known)
		// Unless the FSM has applied past every command it no longer lists.
		got, known = c.lastEarlierCommand(2, maxCommandRefs)
		must.True(t, known)
		must.Eq(t, 0, got)
	})

	t.Run("past its first scan it cannot tell", func(t *testing.T) {
		entries := []raft.Log{cmdAt(1)}
		for range seedScan {
			entries = append(entries, noopAt(2))
		}
		_, known := indexOf(t, true, entries...).lastEarlierCommand(3, 0)
		must.False(t, known)
		// One entry fewer and the command is within the scan.
		got, known := indexOf(t, true, entries[:seedScan]...).lastEarlierCommand(3, 0)
		must.True(t, known)
		must.Eq(t, 1, got)
	})

	t.Run("a scan that reaches the log's start sees everything", func(t *testing.T) {
		// Commands 1 and 3 compacted into a snapshot, 7 cut off.
		compacted := storeLogs(t, sampleLog()...)
		must.NoError(t, compacted.DeleteRange(1, 3))
		must.NoError(t, compacted.DeleteRange(7, 7))
		c, err := newCommandIndex(compacted)
		must.NoError(t, err)
		got, known := c.lastEarlierCommand(4, 0)
		must.True(t, known)
		must.Eq(t, 0, got)
	})

	t.Run("commands written after a restart are added to the one found", func(t *testing.T) {
		c := indexOf(t, true, sampleLog()...)
		must.NoError(t, c.StoreLogs([]*raft.Log{
			{Index: 8, Term: 4, Type: raft.LogNoop}, {Index: 9, Term: 4, Type: raft.LogCommand},
		}))
		got, _ := c.lastEarlierCommand(5, 0)
		must.Eq(t, 9, got)
		got, _ = c.lastEarlierCommand(4, 0)
		must.Eq(t, 7, got)
	})

	t.Run("it passes on whether the store is monotonic", func(t *testing.T) {
		// raft-wal refuses a gap in its indexes; Raft clears such a store
		// after a user snapshot restore only if it says so.
		wal, err := raftwal.Open(t.TempDir())
		must.NoError(t, err)
		defer wal.Close()
		c, err := newCommandIndex(wal)
		must.NoError(t, err)
		must.True(t, c.IsMonotonic())
		c, err = newCommandIndex(raft.NewInmemStore())
		must.NoError(t, err)
		must.False(t, c.IsMonotonic())
	})

	t.Run("a log that cannot be read fails the start", func(t *testing.T) {
		_, err := newCommandIndex(failingLogs{storeLogs(t, sampleLog()...)})
		must.ErrorContains(t, err, "disk on fire")
	})
}

// failingLogs is a log store whose reads and deletes fail.
type failingLogs struct{ raft.LogStore }

func (failingLogs) GetLog(uint64, *raft.Log) error   { return errors.New("disk on fire") }
func (failingLogs) DeleteRange(uint64, uint64) error { return errors.New("disk on fire") }

// mustReturnNil waits for a waitApplied call's result on done, now that
// what it waits for is there.
func mustReturnNil(t *testing.T, done <-chan error, with string) {
	t.Helper()
	select {
	case err := <-done:
		must.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("still waiting with %s", with)
	}
}

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
		mustReturnNil(t, done, "index 5 applied")
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

	t.Run("a restore sets the count to what the restored state records", func(t *testing.T) {
		src, err := NewFSM(hclog.NewNullLogger())
		must.NoError(t, err)
		node := testNode("restored")
		must.NoError(t, src.State().UpsertNode(40, node))
		snap, err := src.Snapshot()
		must.NoError(t, err)
		sink := &memSink{}
		must.NoError(t, snap.Persist(sink))

		g, err := NewFSM(hclog.NewNullLogger())
		must.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- g.waitApplied(context.Background(), 40) }()
		must.NoError(t, g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))))
		mustReturnNil(t, done, "a state restored at 40")
		must.Eq(t, 40, g.Applied())
		// A snapshot older than what was applied lowers it.
		g.Apply(&raft.Log{Index: 90, Type: raft.LogCommand})
		must.NoError(t, g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))))
		must.Eq(t, 40, g.Applied())
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

// countFSM counts commands; its snapshot is the count.
type countFSM struct {
	mu sync.Mutex
	n  uint64
}

func (f *countFSM) Apply(*raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	return nil
}

func (f *countFSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return countSnap(f.n), nil
}

func (f *countFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var b [8]byte
	if _, err := io.ReadFull(rc, b[:]); err != nil {
		return err
	}
	f.mu.Lock()
	f.n = binary.BigEndian.Uint64(b[:])
	f.mu.Unlock()
	return nil
}

type countSnap uint64

func (s countSnap) Persist(sink raft.SnapshotSink) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(s))
	if _, err := sink.Write(b[:]); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (countSnap) Release() {}

// A follower that fell behind the leader's compacted log gets a snapshot
// and catches up: with raft-wal under the command index, Raft must clear
// the follower's log after installing it (raft-wal takes no gap in its
// indexes), which it does only if the index says the store is monotonic.
func TestCommandIndex_FollowerCatchesUpFromASnapshot(t *testing.T) {
	t.Parallel()
	type node struct {
		r     *raft.Raft
		trans *raft.InmemTransport
	}
	var nodes []node
	var servers []raft.Server
	for i := range 3 {
		addr, trans := raft.NewInmemTransport(raft.ServerAddress(fmt.Sprintf("n%d", i)))
		nodes = append(nodes, node{trans: trans})
		servers = append(servers, raft.Server{ID: raft.ServerID(addr), Address: addr})
	}
	for i := range nodes {
		for j := range nodes {
			if i != j {
				nodes[i].trans.Connect(nodes[j].trans.LocalAddr(), nodes[j].trans)
			}
		}
	}
	for i := range nodes {
		dir := t.TempDir()
		wal, err := raftwal.Open(dir, raftwal.WithSegmentSize(8<<10))
		must.NoError(t, err)
		t.Cleanup(func() { wal.Close() })
		logs, err := newCommandIndex(wal)
		must.NoError(t, err)
		snaps, err := raft.NewFileSnapshotStore(dir, 2, io.Discard)
		must.NoError(t, err)
		cfg := raft.DefaultConfig()
		cfg.LocalID = servers[i].ID
		cfg.Logger = hclog.NewNullLogger()
		// 50 ms timers lost the leader mid-test under -race beside the
		// package's parallel tests (make test, once); the test needs one
		// leader throughout, not a fast election.
		cfg.HeartbeatTimeout, cfg.ElectionTimeout = 250*time.Millisecond, 250*time.Millisecond
		cfg.LeaderLeaseTimeout, cfg.CommitTimeout = 250*time.Millisecond, 5*time.Millisecond
		cfg.TrailingLogs, cfg.SnapshotThreshold = 10, 1<<30
		r, err := raft.NewRaft(cfg, &countFSM{}, logs, wal, snaps, nodes[i].trans)
		must.NoError(t, err)
		t.Cleanup(func() { r.Shutdown().Error() })
		nodes[i].r = r
	}
	must.NoError(t, nodes[0].r.BootstrapCluster(raft.Configuration{Servers: servers}).Error())

	var leader, behind node
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		for _, n := range nodes {
			if n.r.State() == raft.Leader {
				leader = n
				return nil
			}
		}
		return errors.New("no leader")
	}), wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond)))
	for _, n := range nodes {
		if n.r != leader.r {
			behind = n
			break
		}
	}
	leader.trans.Disconnect(behind.trans.LocalAddr())
	behind.trans.Disconnect(leader.trans.LocalAddr())
	for i := range 300 {
		must.NoError(t, leader.r.Apply([]byte{byte(i)}, 5*time.Second).Error())
	}
	// The leader's log now starts well past the follower's.
	must.NoError(t, leader.r.Snapshot().Error())
	leader.trans.Connect(behind.trans.LocalAddr(), behind.trans)
	behind.trans.Connect(leader.trans.LocalAddr(), leader.trans)

	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		if got, want := behind.r.AppliedIndex(), leader.r.AppliedIndex(); got < want {
			return fmt.Errorf("follower applied %d, leader %d", got, want)
		}
		return nil
	}), wait.Timeout(15*time.Second), wait.Gap(20*time.Millisecond)))
	// And it takes new entries after the snapshot, from whichever node
	// leads by now: under -race beside the package's parallel tests the
	// leader has lost its lease here once (make test), which is not what
	// this test is about.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		for _, n := range nodes {
			if n.r.State() == raft.Leader {
				leader = n
				return n.r.Apply([]byte("after"), 5*time.Second).Error()
			}
		}
		return errors.New("no leader")
	}), wait.Timeout(15*time.Second), wait.Gap(20*time.Millisecond)))
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		if got, want := behind.r.AppliedIndex(), leader.r.AppliedIndex(); got < want {
			return fmt.Errorf("follower applied %d, leader %d", got, want)
		}
		return nil
	}), wait.Timeout(15*time.Second), wait.Gap(20*time.Millisecond)))
}
