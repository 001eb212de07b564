package raftlog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// failingStable is an in-memory stable store whose writes fail with EIO
// while eio is set.
type failingStable struct {
	*raft.InmemStore
	eio atomic.Bool
}

func (f *failingStable) SetUint64(key []byte, val uint64) error {
	if f.eio.Load() {
		return fmt.Errorf("write %s: %w", key, syscall.EIO)
	}
	return f.InmemStore.SetUint64(key, val)
}

type nopFSM struct{}

func (nopFSM) Apply(*raft.Log) any                 { return nil }
func (nopFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, errors.New("no snapshots") }
func (nopFSM) Restore(r io.ReadCloser) error       { return r.Close() }

// twoNodes starts a two-voter Raft cluster on in-memory transports, a
// leading and b following; b's term and vote go through stable.
func twoNodes(t *testing.T, stable raft.StableStore) (a, b *raft.Raft) {
	conf := func(id string) *raft.Config {
		c := raft.DefaultConfig()
		c.LocalID = raft.ServerID(id)
		c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = 50*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
		c.CommitTimeout = 5 * time.Millisecond
		c.Logger = hclog.NewNullLogger()
		// With pre-vote, a lone survivor of two never stands for
		// election; without it, it writes a new term at once.
		c.PreVoteDisabled = true
		return c
	}
	addrA, ta := raft.NewInmemTransport("a")
	addrB, tb := raft.NewInmemTransport("b")
	ta.Connect(addrB, tb)
	tb.Connect(addrA, ta)
	servers := raft.Configuration{Servers: []raft.Server{{ID: "a", Address: addrA}, {ID: "b", Address: addrB}}}
	sa := raft.NewInmemStore()
	var err error
	a, err = raft.NewRaft(conf("a"), nopFSM{}, sa, sa, raft.NewInmemSnapshotStore(), ta)
	must.NoError(t, err)
	must.NoError(t, a.BootstrapCluster(servers).Error())
	lb := raft.NewInmemStore()
	b, err = raft.NewRaft(conf("b"), nopFSM{}, lb, stable, raft.NewInmemSnapshotStore(), tb)
	must.NoError(t, err)
	must.NoError(t, b.BootstrapCluster(servers).Error())
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		if a.State() == raft.Follower && b.State() == raft.Leader {
			// b won the first election: hand the lead to a.
			_ = b.LeadershipTransferToServer("a", addrA).Error()
		}
		return a.State() == raft.Leader && b.State() == raft.Follower
	}), wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond)), must.Sprint("a leads, b follows"))
	return a, b
}

// A follower whose disk fails its term write, as it stands for election
// once the leader is gone, stops its Raft and reports the failure; the
// process lives on. The bare store is the control: Raft panics.
func TestStable_FailedTermWriteStopsRaftNotTheProcess(t *testing.T) {
	if os.Getenv("ROAM_RAFTLOG_BARE_TERM") == "1" {
		// The control, in a process of its own: the same fault under
		// the bare store.
		store := &failingStable{InmemStore: raft.NewInmemStore()}
		a, _ := twoNodes(t, store)
		store.eio.Store(true)
		must.NoError(t, a.Shutdown().Error())
		<-time.After(time.Minute) // the panic ends the process long before
		t.Fatal("Raft did not panic on its unwritable term")
	}

	t.Run("guarded", func(t *testing.T) {
		store := &failingStable{InmemStore: raft.NewInmemStore()}
		var mu sync.Mutex
		var reported []error
		guard := NewStable(store, "/data/raft/wal", func(err error) {
			mu.Lock()
			defer mu.Unlock()
			reported = append(reported, err)
		})
		a, b := twoNodes(t, guard)
		guard.Arm()
		term := b.CurrentTerm()
		store.eio.Store(true)
		must.NoError(t, a.Shutdown().Error())

		must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(reported) > 0
		}), wait.Timeout(10*time.Second), wait.Gap(5*time.Millisecond)), must.Sprint("b reports its failed term write"))
		mu.Lock()
		err := reported[0]
		mu.Unlock()
		must.ErrorIs(t, err, structs.ErrRaftLogWrite)
		must.ErrorIs(t, err, syscall.EIO)
		must.StrContains(t, err.Error(), fmt.Sprintf("write raft's term %d on /data/raft/wal", term+1))
		must.EqOp(t, term, b.CurrentTerm(), must.Sprint("b acts on no term it could not write"))
		must.ErrorIs(t, guard.TermWriteFailed(), structs.ErrRaftLogWrite)

		done := make(chan error, 1)
		go func() { done <- b.Shutdown().Error() }()
		select {
		case err := <-done:
			must.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("b's Raft did not shut down with its main loop stopped")
		}
		mu.Lock()
		defer mu.Unlock()
		must.Len(t, 1, reported, must.Sprint("reported once"))
	})

	t.Run("bare store panics", func(t *testing.T) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestStable_FailedTermWriteStopsRaftNotTheProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), "ROAM_RAFTLOG_BARE_TERM=1")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		must.True(t, errors.As(err, &exit), must.Sprintf("the control must crash: %v\n%s", err, out))
		must.EqOp(t, 2, exit.ExitCode(), must.Sprintf("%s", out))
		must.StrContains(t, string(out), "panic: failed to save current term")
	})

	t.Run("before Arm the error is returned", func(t *testing.T) {
		store := &failingStable{InmemStore: raft.NewInmemStore()}
		store.eio.Store(true)
		reported := 0
		guard := NewStable(store, "/d", func(error) { reported++ })
		err := guard.SetUint64(termKey, 7)
		must.ErrorIs(t, err, structs.ErrRaftLogWrite)
		must.ErrorIs(t, err, syscall.EIO)
		must.Zero(t, reported, must.Sprint("the caller reports what it is returned"))
		err = guard.SetUint64([]byte("LastVoteTerm"), 7)
		must.ErrorIs(t, err, syscall.EIO)
		must.False(t, errors.Is(err, structs.ErrRaftLogWrite), must.Sprint("only the term is guarded: Raft copes with a vote it could not write"))
	})
}
