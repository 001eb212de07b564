package nomad

import (
	"fmt"
	"hash/fnv"
	"slices"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/scheduler"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// schedCSIWorkload is the state of make scale's placement phase (phase B)
// at nodes nodes: every node ready with a healthy node instance of the
// plugin (MaxVolumes 1024) and room for 4 allocations, 4 volumes per node
// registered (the job's 2 per node, sim-free-* the rest), and a service
// job of count 2 x nodes whose group mounts a per-alloc single-node-writer
// volume. It returns the snapshot and the job's evaluation.
func schedCSIWorkload(tb testing.TB, nodes int) (*state.StateSnapshot, *structs.Evaluation) {
	tb.Helper()
	store, err := state.NewStateStore()
	must.NoError(tb, err)
	const plugin = "sim"
	index := uint64(10)
	for i := range nodes {
		id := fmt.Sprintf("%08x-0000-4000-8000-%012x", i*2654435761%(1<<32), i)
		n := &structs.Node{
			ID: id, SecretID: "s-" + id, Name: fmt.Sprintf("sim-%05d", i), Datacenter: "dc1",
			Attributes: map[string]string{
				"kernel.name": "linux", "driver.raw_exec": "1",
				"cpu.totalcompute": "400", "memory.totalbytes": fmt.Sprint(1 << 30),
			},
			Drivers: map[string]*structs.DriverInfo{"raw_exec": {Detected: true, Healthy: true}},
			CSINodePlugins: map[string]*structs.CSIInfo{plugin: {
				PluginID: plugin, Healthy: true, RequiresControllerPlugin: true,
				NodeInfo: &structs.CSINodeInfo{ID: id, MaxVolumes: 1024},
			}},
			Status:                structs.NodeStatusReady,
			SchedulingEligibility: structs.NodeSchedulingEligible,
		}
		index++
		must.NoError(tb, store.UpsertNode(index, n))
	}
	const jobID = "sim-job"
	vols := make([]*structs.CSIVolume, 0, 4*nodes)
	for i := range 4 * nodes {
		id := fmt.Sprintf("%s[%d]", jobID, i)
		if i >= 2*nodes {
			id = fmt.Sprintf("sim-free-%d", i-2*nodes)
		}
		vols = append(vols, &structs.CSIVolume{
			ID: id, Name: id, Namespace: structs.DefaultNamespace, PluginID: plugin, ExternalID: "ext-" + id,
			RequestedCapabilities: []*structs.CSIVolumeCapability{{
				AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem}},
		})
	}
	index++
	must.NoError(tb, store.UpsertCSIVolumes(index, vols))
	job := &structs.Job{
		Namespace: structs.DefaultNamespace, ID: jobID, Name: jobID, Type: structs.JobTypeService,
		Priority: 50, Datacenters: []string{"dc1"},
		TaskGroups: []*structs.TaskGroup{{
			Name: "g", Count: 2 * nodes,
			Volumes: map[string]*structs.VolumeRequest{"data": {
				Name: "data", Type: "csi", Source: jobID, PerAlloc: true,
				AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
			}},
			Tasks: []*structs.Task{{
				Name: "t", Driver: "raw_exec", Config: map[string]any{"command": "/bin/true"},
				Resources:    &structs.Resources{CPU: 100, MemoryMB: 64},
				VolumeMounts: []*structs.VolumeMount{{Volume: "data", Destination: "data"}},
			}},
		}},
	}
	index++
	must.NoError(tb, store.UpsertJob(index, job))
	eval := &structs.Evaluation{
		ID: "eval-sched-csi", Namespace: structs.DefaultNamespace, Priority: 50, Type: structs.JobTypeService,
		TriggeredBy: structs.EvalTriggerJobRegister, JobID: jobID, Status: structs.EvalStatusPending,
	}
	return store.Snapshot(), eval
}

// placementDigest is a hash of which node each placement went to, so two
// runs (before and after a change to the scheduler) can be compared for
// identical choices.
func placementDigest(plan *structs.Plan) (string, int) {
	var lines []string
	for nodeID, allocs := range plan.NodeAllocation {
		for _, a := range allocs {
			lines = append(lines, a.Name+"="+nodeID)
		}
	}
	slices.Sort(lines)
	h := fnv.New64a()
	for _, l := range lines {
		fmt.Fprintln(h, l)
	}
	return fmt.Sprintf("%016x", h.Sum64()), len(lines)
}

// BenchmarkSchedule_CSIPerAlloc runs one evaluation of make scale's
// placement phase through scheduler.Process with the server's volume
// checker over a real state snapshot, as the leader's worker does (no
// Raft, no plan apply): 2 x nodes placements, each over every node.
// placements/s is the scheduler's throughput; ns/placement/node is what
// one candidate node costs one placement. The digest logged with -v
// names the chosen nodes, to compare two builds.
func BenchmarkSchedule_CSIPerAlloc(b *testing.B) {
	for _, nodes := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			snap, eval := schedCSIWorkload(b, nodes)
			now := time.Unix(1_700_000_000, 0)
			placed := 0
			var digest string
			for b.Loop() {
				n := 0
				plan, res, err := scheduler.Process(snapshotState{snap}, eval, scheduler.Options{
					Now: now,
					NewID: func() string {
						n++
						return fmt.Sprintf("alloc-%06d", n)
					},
					Volumes: &volumeChecker{snap: snap, namespace: eval.Namespace},
				})
				must.NoError(b, err)
				must.False(b, res.Blocked, must.Sprintf("failed: %v", res.FailedTGAllocs))
				d, count := placementDigest(plan)
				must.Eq(b, 2*nodes, count)
				must.True(b, digest == "" || digest == d, must.Sprint("placements differ between iterations"))
				digest = d
				placed += count
			}
			secs := b.Elapsed().Seconds()
			b.ReportMetric(float64(placed)/secs, "placements/s")
			b.ReportMetric(secs*1e9/float64(placed)/float64(nodes), "ns/placement/node")
			b.Logf("nodes=%d placements=%d digest=%s", nodes, placed/b.N, digest)
		})
	}
}
