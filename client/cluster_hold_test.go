package client

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// waitQueries waits until the fake server has answered n more allocation
// queries than it had when called: the watcher acted on at least n-1.
func (f *fakeServer) waitQueries(t *testing.T, n int) {
	t.Helper()
	f.mu.Lock()
	target := f.queries + n
	f.mu.Unlock()
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.queries >= target
	}), wait.Timeout(20*time.Second), wait.Gap(5*time.Millisecond)))
}

// restore puts a back as a snapshot restore would: as it was, its
// AllocModifyIndex unchanged.
func (f *fakeServer) restore(a *structs.Allocation) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a = a.Copy()
	a.ModifyIndex = f.index + 1
	f.allocs[a.ID] = a
	f.bumpLocked()
}

func (f *fakeServer) setCluster(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clusterID = id
	f.bumpLocked()
}

// Servers that answer for another cluster (rebuilt on empty disks, not yet
// restored) list no allocations for this node; the client holds its
// running allocation instead of stopping it, and picks up again when its
// own cluster answers.
func TestAllocManager_HoldsAllocsWhileAnotherClusterAnswers(t *testing.T) {
	dir := t.TempDir()
	srv := newFakeServer("node-1")
	srv.clusterID = "cluster-a"
	var tm *testManager
	guard, err := newClusterGuard(dir, hclog.NewNullLogger(), func() bool { return tm.hasAllocs() })
	must.NoError(t, err)
	tm = startTestManagerWith(t, srv, dir, nil, func(c *allocManagerConfig) {
		c.HoldFor = guard.hold
		c.MaxRetryBackoff = 20 * time.Millisecond
	})
	alloc := testAlloc("node-1", structs.JobTypeService, noRestarts, shTask("web", "exec sleep 600"))
	srv.upsert(alloc)
	running := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusRunning)
	started := running.TaskStates["web"].StartedAt

	// Another cluster answers, with nothing for this node (the cluster
	// changes first: its own cluster dropping it would stop it).
	srv.setCluster("cluster-b")
	srv.remove(alloc.ID)
	srv.waitQueries(t, 5)
	ar := tm.getRunner(alloc.ID)
	must.NotNil(t, ar, must.Sprint("the allocation was dropped while another cluster answered"))
	must.False(t, ar.allDead(), must.Sprint("the task was stopped while another cluster answered"))

	// Its own cluster is back (restored): the task ran on untouched.
	srv.setCluster("cluster-a")
	srv.restore(running)
	srv.waitQueries(t, 3)
	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusRunning)
	must.Eq(t, started, got.TaskStates["web"].StartedAt, must.Sprint("the task was restarted"))
	must.False(t, tm.getRunner(alloc.ID).allDead())

	// Its own cluster dropping it still stops it.
	srv.remove(alloc.ID)
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		if ar := tm.getRunner(alloc.ID); ar != nil && !ar.allDead() {
			return fmt.Errorf("allocation still running after its cluster dropped it")
		}
		return nil
	}), wait.Timeout(20*time.Second), wait.Gap(20*time.Millisecond)))
}

func TestClusterGuard_AdoptsWhenNothingRuns(t *testing.T) {
	dir := t.TempDir()
	has := true
	g, err := newClusterGuard(dir, hclog.NewNullLogger(), func() bool { return has })
	must.NoError(t, err)
	must.False(t, g.hold(""))
	must.False(t, g.hold("a"))
	must.True(t, g.hold("b"))
	has = false
	must.False(t, g.hold("b"), must.Sprint("no allocation here: join the new cluster"))
	// Remembered across restarts.
	g2, err := newClusterGuard(dir, hclog.NewNullLogger(), func() bool { return true })
	must.NoError(t, err)
	must.False(t, g2.hold("b"))
	must.True(t, g2.hold("a"))
}

// A task that ends while another cluster answers is reported to servers
// that do not know it; once its own cluster answers again, the client
// reports it once more, so the allocation (and its claims) can settle.
func TestAllocManager_ReportsAgainAfterHold(t *testing.T) {
	dir := t.TempDir()
	flag := filepath.Join(t.TempDir(), "done")
	srv := newFakeServer("node-1")
	srv.clusterID = "cluster-a"
	var tm *testManager
	guard, err := newClusterGuard(dir, hclog.NewNullLogger(), func() bool { return tm.hasAllocs() })
	must.NoError(t, err)
	tm = startTestManagerWith(t, srv, dir, nil, func(c *allocManagerConfig) {
		c.HoldFor = guard.hold
		c.MaxRetryBackoff = 20 * time.Millisecond
	})
	alloc := testAlloc("node-1", structs.JobTypeBatch, noRestarts,
		shTask("work", fmt.Sprintf("while [ ! -e %q ]; do sleep 0.05; done", flag)))
	srv.upsert(alloc)
	running := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusRunning)

	srv.setCluster("cluster-b")
	srv.remove(alloc.ID)
	srv.waitQueries(t, 3)
	must.NoError(t, os.WriteFile(flag, nil, 0o644))
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return tm.getRunner(alloc.ID).allDead() }),
		wait.Timeout(20*time.Second), wait.Gap(10*time.Millisecond)))
	// Flushed to servers that do not know the allocation.
	srv.waitQueries(t, 3)

	srv.setCluster("cluster-a")
	srv.restore(running)
	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)
	ar := tm.getRunner(alloc.ID)
	must.NotNil(t, ar)
	must.True(t, ar.allDead(), must.Sprint("the finished allocation was run again"))
}

// Servers rebuilt on empty disks first refuse the node (they do not know
// it), then answer at an index below the client's last one. The query
// after the refusal starts from scratch, so the guard sees the other
// cluster at once rather than after a full blocking wait.
func TestAllocManager_QueryAfterErrorSeesRebuiltServers(t *testing.T) {
	dir := t.TempDir()
	srv := newFakeServer("node-1")
	srv.clusterID = "cluster-a"
	var tm *testManager
	guard, err := newClusterGuard(dir, hclog.NewNullLogger(), func() bool { return tm.hasAllocs() })
	must.NoError(t, err)
	seen := make(chan string, 64)
	tm = startTestManagerWith(t, srv, dir, nil, func(c *allocManagerConfig) {
		c.HoldFor = func(id string) bool {
			select {
			case seen <- id:
			default:
			}
			return guard.hold(id)
		}
		// Long enough that a query blocking on the old index outlives
		// the test's wait below.
		c.MaxQueryTime = 10 * time.Minute
		c.MaxRetryBackoff = 20 * time.Millisecond
	})
	alloc := testAlloc("node-1", structs.JobTypeService, noRestarts, shTask("web", "exec sleep 600"))
	srv.upsert(alloc)
	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusRunning)

	// The servers lose their disks: they refuse the node, then answer
	// for a new cluster at index 1, with nothing for this node.
	srv.mu.Lock()
	srv.failQueries = true
	srv.clusterID = "cluster-b"
	srv.index = 1
	delete(srv.allocs, alloc.ID)
	srv.bumpLocked()
	srv.mu.Unlock()
	srv.waitQueries(t, 2)
	srv.mu.Lock()
	srv.failQueries = false
	srv.mu.Unlock()

	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		for {
			select {
			case id := <-seen:
				if id == "cluster-b" {
					return true
				}
			default:
				return false
			}
		}
	}), wait.Timeout(20*time.Second), wait.Gap(10*time.Millisecond)),
		must.Sprint("the watcher never saw the rebuilt servers' cluster"))
	ar := tm.getRunner(alloc.ID)
	must.NotNil(t, ar)
	must.False(t, ar.allDead(), must.Sprint("the task was stopped while another cluster answered"))
}
