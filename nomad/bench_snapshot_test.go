package nomad

import (
	"bytes"
	"fmt"
	"io"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// snapshotBenchFSM is an FSM holding nodes, one service job, and vols
// volumes each claimed (taken) by its own running allocation, written
// straight into the state store.
func snapshotBenchFSM(tb testing.TB, nodes, vols int) *FSM {
	tb.Helper()
	f, err := NewFSM(hclog.NewNullLogger())
	must.NoError(tb, err)
	st := f.State()
	index := uint64(1)
	nodeList := make([]*structs.Node, nodes)
	for i := range nodeList {
		nodeList[i] = benchNode(fmt.Sprintf("node-%d", i))
		must.NoError(tb, st.UpsertNode(index, nodeList[i]))
		index++
	}
	job := benchJob("db", vols)
	job.Namespace = structs.DefaultNamespace
	must.NoError(tb, st.RegisterJob(index, job, nil))
	index++
	volumes := make([]*structs.CSIVolume, vols)
	allocs := make([]*structs.Allocation, vols)
	for i := range volumes {
		volumes[i] = testVolume(fmt.Sprintf("vol[%d]", i))
		volumes[i].Namespace = structs.DefaultNamespace
		allocs[i] = &structs.Allocation{
			ID: fmt.Sprintf("00000000-0000-0000-0000-%012d", i), Namespace: structs.DefaultNamespace,
			Name: fmt.Sprintf("db.g[%d]", i), JobID: job.ID, Job: job, TaskGroup: "g",
			NodeID: nodeList[i%nodes].ID, DesiredStatus: structs.AllocDesiredStatusRun,
			ClientStatus: structs.AllocClientStatusRunning,
			Resources:    &structs.Resources{CPU: 100, MemoryMB: 64},
		}
	}
	must.NoError(tb, st.UpsertCSIVolumes(index, volumes))
	index++
	must.NoError(tb, st.ApplyPlanResults(index, nil, allocs, nil))
	index++
	for i, v := range volumes {
		must.NoError(tb, st.UpdateCSIVolumeClaim(index, structs.DefaultNamespace, v.ID, &structs.CSIVolumeClaim{
			AllocationID: allocs[i].ID, NodeID: allocs[i].NodeID, ExternalNodeID: "ext-" + allocs[i].NodeID,
			Mode: structs.CSIVolumeClaimWrite, AccessMode: structs.CSIAccessModeSingleNodeWriter,
			AttachmentMode: structs.CSIAttachmentModeFilesystem, State: structs.CSIVolumeClaimStateTaken,
			PublishContext: map[string]string{"device": "/dev/roam00"}, UpdatedAt: 1700000000,
		}))
		index++
	}
	return f
}

// saveSnapshotFile is SaveSnapshotFile without Raft: the FSM's snapshot
// streamed to memory, counted and wrapped in a file.
func saveSnapshotFile(tb testing.TB, f *FSM) []byte {
	snap, err := f.Snapshot()
	must.NoError(tb, err)
	defer snap.Release()
	sink := &memSink{}
	must.NoError(tb, snap.Persist(sink))
	_, file, err := buildSnapshotFile(100, 2, 1, "global", sink.Bytes())
	must.NoError(tb, err)
	return file
}

// benchSnapshot measures saving and restoring a snapshot file of state
// with the given numbers of nodes and claimed volumes (one allocation
// per volume).
func benchSnapshot(b *testing.B, nodes, vols int) {
	src := snapshotBenchFSM(b, nodes, vols)
	file := saveSnapshotFile(b, src)
	b.Run("save", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			saveSnapshotFile(b, src)
		}
		b.ReportMetric(float64(len(file)), "file-bytes")
	})
	b.Run("restore", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			// What the leader does with an upload before Raft sees it
			// (checksum and a full decode), then the FSM restore every
			// server runs.
			_, body, err := ReadSnapshotFile(bytes.NewReader(file), 0)
			if err != nil {
				b.Fatal(err)
			}
			dst, err := NewFSM(hclog.NewNullLogger())
			if err != nil {
				b.Fatal(err)
			}
			if err := dst.Restore(io.NopCloser(bytes.NewReader(body))); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(file)), "file-bytes")
	})
}

// BenchmarkSnapshot_1000Volumes1000Allocs is issue 19's benchmark: 100
// nodes, 1,000 volumes each claimed by one of 1,000 allocations.
func BenchmarkSnapshot_1000Volumes1000Allocs(b *testing.B) { benchSnapshot(b, 100, 1000) }

// BenchmarkSnapshot_5000Nodes20000Volumes is the scale issue's size:
// 5,000 nodes, 20,000 volumes each claimed by one of 20,000 allocations.
func BenchmarkSnapshot_5000Nodes20000Volumes(b *testing.B) { benchSnapshot(b, 5000, 20000) }

func TestSnapshotBenchState_RoundTrips(t *testing.T) {
	src := snapshotBenchFSM(t, 10, 50)
	hdr, body, err := ReadSnapshotFile(bytes.NewReader(saveSnapshotFile(t, src)), 0)
	must.NoError(t, err)
	must.Eq(t, 50, hdr.Counts["csi_volumes"])
	must.Eq(t, 50, hdr.Counts["allocs"])
	must.Eq(t, 10, hdr.Counts["nodes"])
	dst := testFSM(t)
	must.NoError(t, dst.Restore(io.NopCloser(bytes.NewReader(body))))
	v, err := dst.State().CSIVolumeByID(nil, structs.DefaultNamespace, "vol[7]")
	must.NoError(t, err)
	must.MapLen(t, 1, v.Claims)
}
