package volumewatcher

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// benchWorld is a store with claims taken by running allocations (nothing
// for the watcher to do) and one spare volume the benchmark claims and
// frees, as the claim path's checkpoints do.
func benchWorld(b *testing.B, claims int) (*world, string) {
	w := &world{index: 1}
	store, err := state.NewStateStore()
	must.NoError(b, err)
	w.store = store
	w.node = &structs.Node{ID: "node-1", SecretID: "s", Status: structs.NodeStatusReady}
	must.NoError(b, store.UpsertNode(w.next(), w.node))
	allocs := make([]*structs.Allocation, claims+1)
	vols := make([]*structs.CSIVolume, claims+1)
	for i := range allocs {
		allocs[i] = &structs.Allocation{ID: fmt.Sprintf("alloc-%d", i), Namespace: structs.DefaultNamespace, JobID: "j",
			TaskGroup: "g", NodeID: w.node.ID, DesiredStatus: structs.AllocDesiredStatusRun,
			ClientStatus: structs.AllocClientStatusRunning}
		vols[i] = &structs.CSIVolume{ID: fmt.Sprintf("vol-%d", i), Namespace: structs.DefaultNamespace,
			ExternalID: fmt.Sprintf("ext-%d", i), PluginID: "p",
			RequestedCapabilities: []*structs.CSIVolumeCapability{{AccessMode: structs.CSIAccessModeSingleNodeWriter,
				AttachmentMode: structs.CSIAttachmentModeFilesystem}}}
	}
	must.NoError(b, store.UpsertAllocs(w.next(), allocs))
	must.NoError(b, store.UpsertCSIVolumes(w.next(), vols))
	for i := range claims {
		must.NoError(b, store.UpdateCSIVolumeClaim(w.next(), structs.DefaultNamespace, vols[i].ID, benchClaim(allocs[i].ID, structs.CSIVolumeClaimStateTaken)))
	}
	return w, allocs[claims].ID
}

func benchClaim(allocID string, st structs.CSIClaimState) *structs.CSIVolumeClaim {
	return &structs.CSIVolumeClaim{AllocationID: allocID, NodeID: "node-1", Mode: structs.CSIVolumeClaimWrite,
		AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
		State: st, UpdatedAt: time.Now().UnixNano()}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchWatcherWrites measures what a running watcher costs the leader per
// claim checkpoint, with claims other claims in the store: the process's
// CPU time per write, writes paced at 100 a second as a busy claim path
// applies them. The claim path's own state reads are not in it.
func benchWatcherWrites(b *testing.B, claims int) {
	w, allocID := benchWorld(b, claims)
	spare := fmt.Sprintf("vol-%d", claims)
	cfg := DefaultConfig()
	cfg.State = func() *state.StateStore { return w.store }
	cfg.Releaser = newFakeReleaser()
	wt, err := New(cfg)
	must.NoError(b, err)
	runWatcher(b, wt)

	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	runtime.GC() // the setup's garbage is not the watcher's
	passes0 := wt.passes.Load()
	cpu0 := cpuTime()
	writes := 0
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		<-tick.C
		st := structs.CSIVolumeClaimStatePublishing
		if i%2 == 1 {
			st = structs.CSIVolumeClaimStateFreed
		}
		c := benchClaim(allocID, st)
		if st == structs.CSIVolumeClaimStateFreed {
			c.State = ""
		}
		if err := w.store.UpdateCSIVolumeClaim(w.next(), structs.DefaultNamespace, spare, c); err != nil {
			b.Fatal(err)
		}
		writes++
	}
	b.StopTimer()
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(cpu.Microseconds())/float64(writes), "cpu-us/write")
	b.ReportMetric(float64(wt.passes.Load()-passes0)/float64(writes), "passes/write")
}

func BenchmarkWatcherWrites_100Claims(b *testing.B)   { benchWatcherWrites(b, 100) }
func BenchmarkWatcherWrites_10000Claims(b *testing.B) { benchWatcherWrites(b, 10000) }
