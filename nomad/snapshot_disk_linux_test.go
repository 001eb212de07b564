//go:build linux

package nomad

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
	"golang.org/x/sys/unix"
)

// paddedFSM counts entries; its snapshot is the count and snapPad bytes
// that repeat it, so a snapshot is large and a torn one is seen.
type paddedFSM struct {
	mu sync.Mutex
	n  uint64
}

const snapPad = 1 << 20

func (f *paddedFSM) Apply(*raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	return nil
}

func (f *paddedFSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return paddedSnap(f.n), nil
}

func (f *paddedFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	n, err := readPaddedSnap(rc)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.n = n
	f.mu.Unlock()
	return nil
}

func (f *paddedFSM) count() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

type paddedSnap uint64

func (s paddedSnap) Persist(sink raft.SnapshotSink) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(s))
	if _, err := sink.Write(bytes.Repeat(b[:], snapPad/8+1)); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (paddedSnap) Release() {}

// readPaddedSnap reads a paddedSnap whole, or says how it is broken.
func readPaddedSnap(r io.Reader) (uint64, error) {
	buf, err := io.ReadAll(r)
	if err != nil {
		return 0, err
	}
	if len(buf) != snapPad+8 {
		return 0, fmt.Errorf("snapshot of %d bytes, want %d", len(buf), snapPad+8)
	}
	if !bytes.Equal(buf, bytes.Repeat(buf[:8], snapPad/8+1)) {
		return 0, errors.New("snapshot content torn")
	}
	return binary.BigEndian.Uint64(buf[:8]), nil
}

// A snapshot taken while the disk is full fails, and leaves the snapshot
// before it whole: Raft goes on, a restart restores from that snapshot and
// the log, and once there is room the next snapshot is taken. The store is
// the one a server uses (raft.FileSnapshotStore, two kept), on a 4 MiB
// tmpfs.
func TestSnapshotStore_FullDiskKeepsThePreviousSnapshot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root (CI runs as root)")
	}
	t.Parallel()
	dir := t.TempDir()
	must.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4m,mode=0700"))
	t.Cleanup(func() { must.NoError(t, unix.Unmount(dir, unix.MNT_DETACH)) })
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, hclog.NewNullLogger())
	must.NoError(t, err)
	logs, stable := raft.NewInmemStore(), raft.NewInmemStore()

	start := func(fsm *paddedFSM) *raft.Raft {
		t.Helper()
		_, trans := raft.NewInmemTransport(raft.ServerAddress("a"))
		cfg := raft.DefaultConfig()
		cfg.LocalID = "a"
		cfg.Logger = hclog.NewNullLogger()
		cfg.HeartbeatTimeout, cfg.ElectionTimeout = 50*time.Millisecond, 50*time.Millisecond
		cfg.LeaderLeaseTimeout, cfg.CommitTimeout = 50*time.Millisecond, 5*time.Millisecond
		cfg.SnapshotThreshold, cfg.SnapshotInterval = 1<<40, time.Hour // only the test's own
		r, err := raft.NewRaft(cfg, fsm, logs, stable, snaps, trans)
		must.NoError(t, err)
		t.Cleanup(func() { _ = r.Shutdown().Error() })
		must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return r.State() == raft.Leader }),
			wait.Timeout(10*time.Second), wait.Gap(5*time.Millisecond)))
		return r
	}
	apply := func(r *raft.Raft, n int) {
		t.Helper()
		for range n {
			must.NoError(t, r.Apply([]byte("x"), 5*time.Second).Error())
		}
	}

	fsm := &paddedFSM{}
	_, trans := raft.NewInmemTransport(raft.ServerAddress("a"))
	boot := raft.DefaultConfig()
	boot.LocalID = "a"
	must.NoError(t, raft.BootstrapCluster(boot, logs, stable, snaps, trans,
		raft.Configuration{Servers: []raft.Server{{ID: "a", Address: trans.LocalAddr()}}}))
	r := start(fsm)
	apply(r, 100)
	must.NoError(t, r.Snapshot().Error())
	first := fsm.count()

	// Fill what is left but half a snapshot, then ask for a snapshot.
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	must.NoError(t, err)
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			must.ErrorIs(t, err, syscall.ENOSPC)
			break
		}
	}
	// Leave half a snapshot's room, so the snapshot fails part way
	// through its state, not at its first file.
	st, err := f.Stat()
	must.NoError(t, err)
	must.NoError(t, f.Truncate(st.Size()-snapPad/2))
	must.NoError(t, f.Close())
	apply(r, 50)
	err = r.Snapshot().Error()
	must.Error(t, err, must.Sprint("a snapshot on a full disk succeeded"))
	t.Logf("snapshot on the full disk: %v", err)

	list, err := snaps.List()
	must.NoError(t, err)
	must.Len(t, 1, list, must.Sprint("the failed snapshot left something listed"))
	_, rc, err := snaps.Open(list[0].ID)
	must.NoError(t, err)
	n, err := readPaddedSnap(rc)
	must.NoError(t, rc.Close())
	must.NoError(t, err, must.Sprint("the snapshot before the full disk is broken"))
	must.EqOp(t, first, n)

	// Raft goes on, and a restart on the full disk restores that snapshot
	// and replays the log after it.
	apply(r, 10)
	must.NoError(t, r.Shutdown().Error())
	again := &paddedFSM{}
	r = start(again)
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return again.count() == first+60 }),
		wait.Timeout(10*time.Second), wait.Gap(5*time.Millisecond)),
		must.Sprintf("the restarted FSM has %d of %d entries", again.count(), first+60))

	// With room again, the next snapshot is taken.
	must.NoError(t, os.Remove(filler))
	must.NoError(t, r.Snapshot().Error())
	list, err = snaps.List()
	must.NoError(t, err)
	must.Len(t, 2, list)
	_, rc, err = snaps.Open(list[0].ID)
	must.NoError(t, err)
	n, err = readPaddedSnap(rc)
	must.NoError(t, rc.Close())
	must.NoError(t, err)
	must.EqOp(t, first+60, n)
}
