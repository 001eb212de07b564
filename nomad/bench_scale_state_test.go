package nomad

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// The state a `make scale` run leaves on the servers, built straight into
// a state store through the same writes the FSM makes: nodes registered
// one by one with the simulator's fingerprint (every node runs the plugin's
// node service, the first three its controller), the simulator's job at two
// allocations per node, four volumes per node of which the two per node
// that the allocations hold are claimed, and the evaluations the
// registrations and the job left behind.

const scalePlugin = "sim"

// scaleNode is a node as the simulator fingerprints it.
func scaleNode(i int, controller bool) *structs.Node {
	now := time.Unix(1700000000, 0)
	id := uuid.NewString()
	n := &structs.Node{
		ID: id, SecretID: uuid.NewString(), Name: fmt.Sprintf("sim-%05d", i), Datacenter: "dc1",
		Attributes: map[string]string{
			"kernel.name": "linux", "driver.raw_exec": "1",
			"cpu.totalcompute": "400", "memory.totalbytes": fmt.Sprint(1 << 30),
			"unique.network.ip-address": fmt.Sprintf("127.100.%d.%d", i/250, i%250+1),
		},
		Drivers: map[string]*structs.DriverInfo{
			"raw_exec": {Detected: true, Healthy: true, HealthDescription: "Healthy", UpdateTime: now,
				Attributes: map[string]string{"driver.raw_exec": "1"}},
		},
		CSINodePlugins: map[string]*structs.CSIInfo{scalePlugin: {
			PluginID: scalePlugin, Healthy: true, HealthDescription: "healthy", UpdateTime: now,
			Provider: "sim.roam", ProviderVersion: "1", RequiresControllerPlugin: true,
			NodeInfo: &structs.CSINodeInfo{ID: id, MaxVolumes: 1024},
		}},
		CSIControllerPlugins: map[string]*structs.CSIInfo{},
		Status:               structs.NodeStatusReady,
	}
	if controller {
		n.CSIControllerPlugins[scalePlugin] = &structs.CSIInfo{
			PluginID: scalePlugin, Healthy: true, HealthDescription: "healthy", UpdateTime: now,
			Provider: "sim.roam", ProviderVersion: "1", RequiresControllerPlugin: true,
			ControllerInfo: &structs.CSIControllerInfo{SupportsAttachDetach: true},
		}
	}
	return n
}

// scaleState is the state of a scale run of nodes simulated nodes, in an
// FSM, with what was written to build it.
type scaleState struct {
	fsm    *FSM
	nodes  []*structs.Node
	vols   []*structs.CSIVolume
	allocs []*structs.Allocation
	job    *structs.Job
	index  uint64
}

func buildScaleState(tb testing.TB, nodes int) *scaleState {
	tb.Helper()
	return buildScaleStateWith(tb, nodes, nil, nil)
}

// buildScaleStateWith is buildScaleState with the FSM's writes published to
// events (when not nil), and afterNodes called once every node is
// registered.
func buildScaleStateWith(tb testing.TB, nodes int, events *eventBroker, afterNodes func()) *scaleState {
	tb.Helper()
	f, err := NewFSM(hclog.NewNullLogger())
	must.NoError(tb, err)
	if events != nil {
		f.SetEventBroker(events)
	}
	st := f.State()
	s := &scaleState{fsm: f, index: 1}
	next := func() uint64 { s.index++; return s.index }

	for i := range nodes {
		n := scaleNode(i, i < 3)
		ev := &structs.Evaluation{
			ID: uuid.NewString(), Namespace: structs.DefaultNamespace, Priority: 50,
			Type: structs.JobTypeService, TriggeredBy: "node-update", JobID: "sim", NodeID: n.ID,
			Status: structs.EvalStatusComplete, CreateTime: 1700000000, ModifyTime: 1700000000,
		}
		must.NoError(tb, st.UpsertNode(next(), n, ev))
		s.nodes = append(s.nodes, n)
	}
	if afterNodes != nil {
		afterNodes()
	}

	job := buildScaleStateJob(2 * nodes)
	jobEval := &structs.Evaluation{
		ID: uuid.NewString(), Namespace: structs.DefaultNamespace, Priority: 50,
		Type: structs.JobTypeService, TriggeredBy: "job-register", JobID: job.ID,
		Status: structs.EvalStatusComplete, CreateTime: 1700000000, ModifyTime: 1700000000,
	}
	must.NoError(tb, st.RegisterJob(next(), job, jobEval))
	s.job = job

	// Volumes as the simulator registers them: 500 per call.
	vols := scaleVolumes(4 * nodes)
	for lo := 0; lo < len(vols); lo += 500 {
		must.NoError(tb, st.UpsertCSIVolumes(next(), vols[lo:min(lo+500, len(vols))]))
	}
	s.vols = vols

	// The allocations, placed in plans of 100 as the scheduler's would be.
	allocs := make([]*structs.Allocation, 2*nodes)
	for i := range allocs {
		allocs[i] = &structs.Allocation{
			ID: uuid.NewString(), Namespace: structs.DefaultNamespace,
			Name: fmt.Sprintf("sim.g[%d]", i), JobID: job.ID, Job: job, TaskGroup: "g",
			NodeID: s.nodes[i%nodes].ID, EvalID: jobEval.ID,
			DesiredStatus: structs.AllocDesiredStatusRun, ClientStatus: structs.AllocClientStatusRunning,
			Resources: &structs.Resources{CPU: 100, MemoryMB: 64},
		}
	}
	for lo := 0; lo < len(allocs); lo += 100 {
		must.NoError(tb, st.ApplyPlanResults(next(), nil, allocs[lo:min(lo+100, len(allocs))], nil))
	}
	s.allocs = allocs

	// Allocation i holds volume i (per_alloc), claimed and taken.
	for i, a := range allocs {
		must.NoError(tb, st.UpdateCSIVolumeClaim(next(), structs.DefaultNamespace, vols[i].ID, scaleClaim(a)))
	}
	return s
}

// buildScaleStateJob is the simulator's job at count allocations.
func buildScaleStateJob(count int) *structs.Job {
	return &structs.Job{
		Region: "global", Namespace: structs.DefaultNamespace, ID: "sim", Name: "sim",
		Type: structs.JobTypeService, Priority: 50, Datacenters: []string{"dc1"},
		TaskGroups: []*structs.TaskGroup{{
			Name: "g", Count: count,
			Volumes: map[string]*structs.VolumeRequest{"data": {
				Name: "data", Type: "csi", Source: "sim", PerAlloc: true,
				AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
			}},
			Tasks: []*structs.Task{{
				Name: "t", Driver: "raw_exec",
				Config:       map[string]any{"command": "/bin/true"},
				Resources:    &structs.Resources{CPU: 100, MemoryMB: 64},
				VolumeMounts: []*structs.VolumeMount{{Volume: "data", Destination: "data"}},
			}},
		}},
	}
}

func scaleClaim(a *structs.Allocation) *structs.CSIVolumeClaim {
	return &structs.CSIVolumeClaim{
		AllocationID: a.ID, NodeID: a.NodeID, ExternalNodeID: a.NodeID,
		Mode: structs.CSIVolumeClaimWrite, AccessMode: structs.CSIAccessModeSingleNodeWriter,
		AttachmentMode: structs.CSIAttachmentModeFilesystem, State: structs.CSIVolumeClaimStateTaken,
		PublishContext: map[string]string{"device": "/dev/roam00"}, UpdatedAt: 1700000000,
	}
}

// saveThroughFileStore is what SaveSnapshotFile does, without the Raft
// run loop: the FSM snapshot persisted into Raft's file snapshot store
// (buffered, checksummed and synced to disk), opened again, read whole
// and wrapped into a snapshot file.
func saveThroughFileStore(tb testing.TB, f *FSM, store *raft.FileSnapshotStore, index uint64) []byte {
	snap, err := f.Snapshot()
	must.NoError(tb, err)
	defer snap.Release()
	sink, err := store.Create(raft.SnapshotVersionMax, index, 1, raft.Configuration{}, 1, nil)
	must.NoError(tb, err)
	must.NoError(tb, snap.Persist(sink))
	meta, rc, err := store.Open(sink.ID())
	must.NoError(tb, err)
	defer rc.Close()
	body, err := io.ReadAll(rc)
	must.NoError(tb, err)
	_, file, err := buildSnapshotFile(meta.Index, meta.Term, int(meta.Version), "global", body)
	must.NoError(tb, err)
	return file
}

// countingReader counts what passes through it, as Raft's reader of a
// snapshot does: it hides the buffered reader's ReadByte.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// raftLikeReader is body as Raft hands a snapshot to FSM.Restore: a
// buffered file reader inside a counting one.
func raftLikeReader(body []byte) io.ReadCloser {
	return io.NopCloser(&countingReader{r: bufio.NewReader(bytes.NewReader(body))})
}

// benchScaleSnapshot measures each step between a state of that many
// nodes and a snapshot file, and back.
func benchScaleSnapshot(b *testing.B, nodes int) {
	s := buildScaleState(b, nodes)
	snap, err := s.fsm.Snapshot()
	must.NoError(b, err)
	var body memSink
	must.NoError(b, snap.Persist(&body))
	file := saveSnapshotFile(b, s.fsm)

	b.Run("persist", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			snap, err := s.fsm.Snapshot()
			if err != nil {
				b.Fatal(err)
			}
			if err := snap.Persist(&memSink{}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(body.Len()), "body-bytes")
	})
	b.Run("restore", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			dst, err := NewFSM(hclog.NewNullLogger())
			if err != nil {
				b.Fatal(err)
			}
			if err := dst.Restore(raftLikeReader(body.Bytes())); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("save-file", func(b *testing.B) {
		store, err := raft.NewFileSnapshotStoreWithLogger(b.TempDir(), 2, hclog.NewNullLogger())
		must.NoError(b, err)
		b.ReportAllocs()
		for b.Loop() {
			saveThroughFileStore(b, s.fsm, store, s.index)
		}
		b.ReportMetric(float64(len(file)), "file-bytes")
	})
	b.Run("read-file", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := ReadSnapshotFile(bytes.NewReader(file), 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkScaleSnapshot_1000Nodes and _5000Nodes are the scale issue's
// states: nodes × 4 volumes, half of them claimed by nodes × 2 running
// allocations, one plugin with 3 controllers and a node instance on every
// node. The target is persist + restore of 5,000 nodes under 2 s.
func BenchmarkScaleSnapshot_1000Nodes(b *testing.B) { benchScaleSnapshot(b, 1000) }
func BenchmarkScaleSnapshot_5000Nodes(b *testing.B) { benchScaleSnapshot(b, 5000) }

// BenchmarkScaleStateHeap_5000Nodes reports the heap the 5,000-node state
// holds, per node and per volume: the leader's memory floor at that size.
// With the server's event buffer attached it also reports the heap right
// after the 5,000 registrations, when the buffer holds the plugin as each
// of the last registrations left it.
func BenchmarkScaleStateHeap_5000Nodes(b *testing.B) {
	heap := func() float64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return float64(m.HeapAlloc)
	}
	for b.Loop() {
		before := heap()
		s := buildScaleState(b, 5000)
		grown := heap() - before
		runtime.KeepAlive(s)
		b.ReportMetric(grown/(1<<20), "heap-MiB")
		b.ReportMetric(grown/5000/1024, "KiB/node")
		b.ReportMetric(grown/20000/1024, "KiB/volume")
		s = nil

		before = heap()
		events := newEventBroker(DefaultEventBufferSize)
		var afterNodes float64
		s = buildScaleStateWith(b, 5000, events, func() { afterNodes = heap() - before })
		withEvents := heap() - before
		runtime.KeepAlive(s)
		runtime.KeepAlive(events)
		b.ReportMetric(afterNodes/(1<<20), "events-after-nodes-heap-MiB")
		b.ReportMetric(withEvents/(1<<20), "events-heap-MiB")
	}
}

func TestScaleState_Counts(t *testing.T) {
	s := buildScaleState(t, 20)
	st := s.fsm.State()
	p, err := st.CSIPluginByID(nil, scalePlugin)
	must.NoError(t, err)
	must.Eq(t, 3, p.ControllersHealthy)
	must.Eq(t, 20, p.NodesHealthy)
	hdr, body, err := ReadSnapshotFile(bytes.NewReader(saveSnapshotFile(t, s.fsm)), 0)
	must.NoError(t, err)
	must.Eq(t, 20, hdr.Counts["nodes"])
	must.Eq(t, 80, hdr.Counts["csi_volumes"])
	must.Eq(t, 40, hdr.Counts["allocs"])
	must.Eq(t, 21, hdr.Counts["evals"])
	dst := testFSM(t)
	must.NoError(t, dst.Restore(io.NopCloser(bytes.NewReader(body))))
	v, err := dst.State().CSIVolumeByID(nil, structs.DefaultNamespace, "sim[39]")
	must.NoError(t, err)
	must.MapLen(t, 1, v.Claims)
	v, err = dst.State().CSIVolumeByID(nil, structs.DefaultNamespace, "sim[40]")
	must.NoError(t, err)
	must.MapLen(t, 0, v.Claims)
}

// scaleLog is the Raft log that builds the scale state: what a follower
// that restarts without a recent snapshot applies again, entry by entry.
func scaleLog(tb testing.TB, nodes int) []*raft.Log {
	tb.Helper()
	var logs []*raft.Log
	add := func(typ structs.MessageType, req any) {
		buf, err := structs.Encode(typ, req)
		must.NoError(tb, err)
		logs = append(logs, &raft.Log{Type: raft.LogCommand, Index: uint64(len(logs) + 1), Data: buf})
	}
	nodeList := make([]*structs.Node, nodes)
	for i := range nodeList {
		nodeList[i] = scaleNode(i, i < 3)
		add(structs.NodeRegisterRequestType, &structs.NodeRegisterRequest{Node: nodeList[i]})
	}
	ref := buildScaleStateJob(2 * nodes)
	add(structs.JobRegisterRequestType, &structs.JobRegisterRequest{Job: ref})
	vols := scaleVolumes(4 * nodes)
	for lo := 0; lo < len(vols); lo += 500 {
		add(structs.CSIVolumeRegisterRequestType, &structs.CSIVolumeRegisterRequest{Volumes: vols[lo:min(lo+500, len(vols))]})
	}
	allocs := make([]*structs.Allocation, 2*nodes)
	for i := range allocs {
		allocs[i] = &structs.Allocation{
			ID: uuid.NewString(), Namespace: structs.DefaultNamespace,
			Name: fmt.Sprintf("sim.g[%d]", i), JobID: ref.ID, Job: ref, TaskGroup: "g",
			NodeID: nodeList[i%nodes].ID, DesiredStatus: structs.AllocDesiredStatusRun,
			ClientStatus: structs.AllocClientStatusRunning, Resources: &structs.Resources{CPU: 100, MemoryMB: 64},
		}
	}
	for lo := 0; lo < len(allocs); lo += 100 {
		add(structs.ApplyPlanResultsRequestType, &structs.ApplyPlanResultsRequest{AllocsPlaced: allocs[lo:min(lo+100, len(allocs))]})
	}
	for i, a := range allocs {
		add(structs.CSIVolumeClaimRequestType, &structs.CSIVolumeClaimUpdateRequest{
			Namespace: structs.DefaultNamespace, VolumeID: vols[i].ID, Claim: scaleClaim(a)})
	}
	return logs
}

// BenchmarkScaleReplay_5000Nodes applies the 5,000-node state's Raft log
// (5,000 registrations, the job, 40 volume batches, 100 plans, 10,000
// claims) to an empty FSM, as a follower does with the entries after its
// last snapshot, and reports it beside the snapshot restore of the same
// state in the same run.
func BenchmarkScaleReplay_5000Nodes(b *testing.B) {
	const nodes = 5000
	logs := scaleLog(b, nodes)
	var body memSink
	{
		f, err := NewFSM(hclog.NewNullLogger())
		must.NoError(b, err)
		for _, l := range logs {
			if err, ok := f.Apply(l).(error); ok {
				b.Fatal(err)
			}
		}
		snap, err := f.Snapshot()
		must.NoError(b, err)
		must.NoError(b, snap.Persist(&body))
	}
	var replay, restore, firstNodes, lastNodes time.Duration
	for b.Loop() {
		f, err := NewFSM(hclog.NewNullLogger())
		must.NoError(b, err)
		start := time.Now()
		for i, l := range logs {
			t0 := time.Now()
			if err, ok := f.Apply(l).(error); ok {
				b.Fatal(err)
			}
			switch {
			case i < 500:
				firstNodes += time.Since(t0)
			case i >= nodes-500 && i < nodes:
				lastNodes += time.Since(t0)
			}
		}
		replay += time.Since(start)
		start = time.Now()
		dst, err := NewFSM(hclog.NewNullLogger())
		must.NoError(b, err)
		must.NoError(b, dst.Restore(io.NopCloser(bytes.NewReader(body.Bytes()))))
		restore += time.Since(start)
	}
	n := float64(b.N)
	b.ReportMetric(float64(len(logs)), "entries")
	b.ReportMetric(replay.Seconds()/n, "replay-s")
	b.ReportMetric(restore.Seconds()/n, "restore-s")
	b.ReportMetric(float64(replay)/float64(restore), "replay/restore")
	b.ReportMetric(float64(firstNodes.Microseconds())/500/n, "register-us-first-500")
	b.ReportMetric(float64(lastNodes.Microseconds())/500/n, "register-us-last-500")
}

// benchScaleSnapshotServer measures the operator's save and restore on a
// three-server cluster on disk holding the scale state of nodes nodes:
// SaveSnapshotFile (a Raft snapshot forced, persisted to and read back
// from the file store, checked) and RestoreSnapshotFile (installed through
// Raft on every server). The state gets there by a restore first.
func benchScaleSnapshotServer(b *testing.B, nodes int) {
	file := saveSnapshotFile(b, buildScaleState(b, nodes).fsm)
	servers, leader := benchCluster(b, 3)
	_, err := leader.RestoreSnapshotFile(file)
	must.NoError(b, err)
	for _, s := range servers {
		must.Wait(b, benchNodeCount(s, nodes))
	}
	var save, restore time.Duration
	for b.Loop() {
		start := time.Now()
		_, got, err := leader.SaveSnapshotFile()
		if err != nil {
			b.Fatal(err)
		}
		save += time.Since(start)
		start = time.Now()
		if _, err := leader.RestoreSnapshotFile(got); err != nil {
			b.Fatal(err)
		}
		restore += time.Since(start)
	}
	b.ReportMetric(save.Seconds()/float64(b.N), "save-s")
	b.ReportMetric(restore.Seconds()/float64(b.N), "restore-s")
	b.ReportMetric(float64(len(file)), "file-bytes")
}

// benchNodeCount is satisfied once s holds want nodes.
func benchNodeCount(s *Server, want int) *wait.Constraint {
	return wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			list, err := s.State().Nodes(nil)
			if err != nil {
				return err
			}
			if len(list) != want {
				return fmt.Errorf("server %s holds %d of %d nodes", s.ID(), len(list), want)
			}
			return nil
		}),
		wait.Timeout(2*time.Minute),
		wait.Gap(20*time.Millisecond),
	)
}

func BenchmarkScaleSnapshotServer_1000Nodes(b *testing.B) { benchScaleSnapshotServer(b, 1000) }
func BenchmarkScaleSnapshotServer_5000Nodes(b *testing.B) { benchScaleSnapshotServer(b, 5000) }

// scaleVolumes returns n single-node-writer volumes of the scale plugin,
// named as the simulator names them.
func scaleVolumes(n int) []*structs.CSIVolume {
	vols := make([]*structs.CSIVolume, n)
	for i := range vols {
		vols[i] = &structs.CSIVolume{
			ID: fmt.Sprintf("sim[%d]", i), Namespace: structs.DefaultNamespace, Name: fmt.Sprintf("sim[%d]", i),
			ExternalID: fmt.Sprintf("ext-sim-%d", i), PluginID: scalePlugin,
			RequestedCapabilities: []*structs.CSIVolumeCapability{{
				AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
			}},
		}
	}
	return vols
}
