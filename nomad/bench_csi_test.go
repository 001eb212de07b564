package nomad

// Benchmarks of the CSI claim path on a three-server cluster whose Raft
// logs are on disk (see benchCluster), with a real client connected to the
// leader running P hostpath plugins as monoliths, each its own controller.
// Claims come from a synthetic node B whose node plugin instances share
// each plugin's state dir, as a second machine would.
//
// A cycle is one claim (State taken: reserve, controller publish through
// the plugin's lane, mark taken) and one release (State unpublishing:
// controller unpublish through the lane, free) of one volume by one
// allocation. claimBenchWorkers goroutines run cycles at once; each owns
// one volume and one allocation, and workers are spread round-robin over
// the plugins, so with 8 plugins the lanes can run side by side.
//
// The Raft apply baseline (raftBaseline: Node.Register from the same
// number of goroutines) runs on the same cluster before the cycles and is
// reported as raft-ops/s next to them, with cycles-per-raft-op. Reported:
//
//   - cycles/s, cycle-p50-ms, cycle-p99-ms: whole cycles;
//   - claim-p50-ms, claim-p99-ms: the claim half alone;
//   - raft-ops/s, cycles-per-raft-op: the baseline and cycles/s over it;
//   - ns/op per cycle.
//
//	go test -run '^$' -bench CSIClaim -benchtime 1x ./nomad/

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/roamhq/roam/client"
	"github.com/roamhq/roam/internal/tlsutil/tlstest"
	"github.com/roamhq/roam/plugins/csi/hostpath"
	"github.com/roamhq/roam/structs"
)

const (
	// claimBenchWorkers run cycles concurrently. With one plugin they all
	// queue on its lane; node B's device pool (MaxVolumesPerNode, 16) holds
	// one attached volume per worker.
	claimBenchWorkers = 16
	// raftBaselineOps is the size of the Raft apply baseline batch.
	raftBaselineOps = 3000
)

// claimBench is a benchmark cluster with P plugins ready to publish.
type claimBench struct {
	servers   []*Server
	leader    *Server
	nodeB     *structs.Node
	stateDirs map[string]string // plugin ID to state dir
	volumes   []*structs.CSIVolume
	allocs    []*structs.Allocation
	// aclToken is the management secret when the cluster runs ACLs.
	aclToken string
}

// benchStartPlugin starts one in-process hostpath instance on a unix socket
// under tb.TempDir and stops it at cleanup.
func benchStartPlugin(tb testing.TB, stateDir, nodeID string, mode hostpath.Mode, latency time.Duration) *hostpath.Plugin {
	tb.Helper()
	cfg := hostpath.DefaultConfig()
	cfg.Endpoint = "unix://" + filepath.Join(tb.TempDir(), "csi.sock")
	cfg.NodeID = nodeID
	cfg.StateDir = stateDir
	cfg.Mode = mode
	cfg.PublishLatency = latency
	p, err := hostpath.New(cfg)
	must.NoError(tb, err)
	must.NoError(tb, p.Start())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	tb.Cleanup(func() {
		cancel()
		_ = p.Stop(context.Background())
		<-done
	})
	return p
}

// newClaimBench starts the cluster, the plugins and the client, registers
// node B, and creates, registers and places one volume and one allocation
// per worker.
func newClaimBench(tb testing.TB, plugins int, latency time.Duration) *claimBench {
	tb.Helper()
	return newClaimBenchTLS(tb, plugins, latency, nil)
}

// newClaimBenchTLS is newClaimBench with mutual TLS on every RPC port
// when certs is set: the servers use its server certificate, the client
// its client certificate.
func newClaimBenchTLS(tb testing.TB, plugins int, latency time.Duration, certs *tlstest.Files) *claimBench {
	tb.Helper()
	return newClaimBenchWith(tb, plugins, latency, certs, false)
}

// newClaimBenchWith is newClaimBenchTLS with ACLs on every server when
// withACL is set: the cluster is bootstrapped and cb.aclToken holds the
// management secret, with which the volumes are registered.
func newClaimBenchWith(tb testing.TB, plugins int, latency time.Duration, certs *tlstest.Files, withACL bool) *claimBench {
	tb.Helper()
	return newClaimBenchOn(tb, plugins, latency, certs, withACL, nil)
}

// newClaimBenchOn is newClaimBenchWith on a cluster that first restores
// the snapshot file preload (when not nil): the benchmark's plugins, node
// and volumes are added beside that state.
func newClaimBenchOn(tb testing.TB, plugins int, latency time.Duration, certs *tlstest.Files, withACL bool, preload []byte) *claimBench {
	tb.Helper()
	servers, leader := benchClusterWith(tb, 3, func(c *Config) {
		if certs != nil {
			c.TLS = certs.Configurator(tb, certs.Server, false)
		}
		c.ACLEnabled = withACL
	})
	if preload != nil {
		_, err := leader.RestoreSnapshotFile(preload)
		must.NoError(tb, err)
		must.Wait(tb, wait.InitialSuccess(wait.ErrorFunc(func() error {
			if !leader.IsLeader() {
				return fmt.Errorf("leadership not back after the restore")
			}
			return nil
		}), wait.Timeout(time.Minute), wait.Gap(20*time.Millisecond)))
	}
	cb := &claimBench{servers: servers, leader: leader, stateDirs: map[string]string{}}
	if withACL {
		var boot structs.ACLTokenUpsertResponse
		must.NoError(tb, leader.RPC("ACL.Bootstrap", &structs.ACLTokenBootstrapRequest{}, &boot))
		cb.aclToken = boot.Tokens[0].SecretID
	}

	controllers := map[string]csi.ControllerClient{}
	pluginCfgs := map[string]*client.CSIPluginConfig{}
	nodeB := workNode("node-b")
	nodeB.CSINodePlugins = map[string]*structs.CSIInfo{}
	for i := range plugins {
		id := fmt.Sprintf("hp%d", i)
		dir := tb.TempDir()
		cb.stateDirs[id] = dir
		pa := benchStartPlugin(tb, dir, "node-a", hostpath.ModeMonolith, latency)
		benchStartPlugin(tb, dir, "node-b", hostpath.ModeNode, latency)
		pluginCfgs[id] = &client.CSIPluginConfig{ID: id, Type: client.CSIPluginTypeMonolith,
			Socket: pa.Endpoint()[len("unix://"):]}
		conn, err := grpc.NewClient(pa.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		must.NoError(tb, err)
		tb.Cleanup(func() { conn.Close() })
		controllers[id] = csi.NewControllerClient(conn)
		nodeB.CSINodePlugins[id] = &structs.CSIInfo{PluginID: id, Healthy: true,
			NodeInfo: &structs.CSINodeInfo{ID: "node-b", MaxVolumes: 16, RequiresNodeStageVolume: true}}
	}

	cfg := client.DefaultConfig()
	cfg.DataDir = tb.TempDir()
	cfg.Servers = []string{leader.Addr()}
	cfg.MinRetryBackoff = 10 * time.Millisecond
	cfg.MaxRetryBackoff = 200 * time.Millisecond
	cfg.CSIPlugins = pluginCfgs
	if certs != nil {
		cfg.TLS = certs.Configurator(tb, certs.Client, false)
	}
	c, err := client.NewClient(cfg)
	must.NoError(tb, err)
	tb.Cleanup(func() { _ = c.Shutdown(context.Background()) })

	must.Wait(tb, wait.InitialSuccess(wait.ErrorFunc(func() error {
		for id := range pluginCfgs {
			p, err := leader.State().CSIPluginByID(nil, id)
			if err != nil || p == nil || p.ControllersHealthy != 1 {
				return fmt.Errorf("plugin %s: %+v (%v)", id, p, err)
			}
		}
		if _, ok := leader.nodeSession(c.NodeID()); !ok {
			return fmt.Errorf("client session not recorded yet")
		}
		return nil
	}), wait.Timeout(30*time.Second), wait.Gap(20*time.Millisecond)))

	must.Wait(tb, wait.InitialSuccess(wait.ErrorFunc(func() error {
		var resp structs.NodeUpdateResponse
		return leader.RPC("Node.Register", &structs.NodeRegisterRequest{Node: nodeB.Copy()}, &resp)
	}), wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond)))
	cb.nodeB = nodeB

	mode := &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}
	var placed []*structs.Allocation
	for w := range claimBenchWorkers {
		pluginID := fmt.Sprintf("hp%d", w%plugins)
		name := fmt.Sprintf("%s-vol-%d", pluginID, w)
		resp, err := controllers[pluginID].CreateVolume(context.Background(), &csi.CreateVolumeRequest{
			Name: name,
			VolumeCapabilities: []*csi.VolumeCapability{{
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
				AccessMode: mode,
			}},
		})
		must.NoError(tb, err)
		vol := testVolume(name)
		vol.PluginID = pluginID
		vol.ExternalID = resp.Volume.VolumeId
		var rresp structs.CSIVolumeRegisterResponse
		must.NoError(tb, leader.RPC("CSIVolume.Register",
			&structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{vol},
				WriteRequest: structs.WriteRequest{AuthToken: cb.aclToken}}, &rresp))
		cb.volumes = append(cb.volumes, vol)
		placed = append(placed, &structs.Allocation{ID: fmt.Sprintf("bench-alloc-%d", w),
			Namespace: structs.DefaultNamespace, JobID: "db", TaskGroup: "g", NodeID: nodeB.ID,
			DesiredStatus: structs.AllocDesiredStatusRun, ClientStatus: structs.AllocClientStatusRunning})
	}
	_, _, err = leader.raftApply(structs.ApplyPlanResultsRequestType,
		&structs.ApplyPlanResultsRequest{AllocsPlaced: placed})
	must.NoError(tb, err)
	cb.allocs = placed
	return cb
}

func (cb *claimBench) claim(volID, allocID string, state structs.CSIClaimState) error {
	var resp structs.CSIVolumeClaimResponse
	return cb.leader.RPC("CSIVolume.Claim", &structs.CSIVolumeClaimRequest{
		VolumeID: volID, AllocationID: allocID, Mode: structs.CSIVolumeClaimWrite,
		AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
		State: state, WriteRequest: structs.WriteRequest{AuthToken: cb.nodeB.SecretID},
	}, &resp)
}

// cycles runs n cycles over workers goroutines (at most
// claimBenchWorkers), each worker on its own volume and
// allocation, and records claim and whole-cycle durations.
func (cb *claimBench) cycles(workers, n int, claimLat, cycleLat *latencies) error {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for w := range workers {
		count := n / workers
		if w < n%workers {
			count++
		}
		vol, alloc := cb.volumes[w], cb.allocs[w]
		wg.Add(1)
		go func() {
			defer wg.Done()
			claims := make([]time.Duration, 0, count)
			whole := make([]time.Duration, 0, count)
			defer func() { claimLat.add(claims...); cycleLat.add(whole...) }()
			for i := range count {
				start := time.Now()
				err := cb.claim(vol.ID, alloc.ID, structs.CSIVolumeClaimStateTaken)
				claimed := time.Since(start)
				if err == nil {
					err = cb.claim(vol.ID, alloc.ID, structs.CSIVolumeClaimStateUnpublishing)
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("worker %d cycle %d on %s: %w", w, i, vol.ID, err)
					}
					mu.Unlock()
					return
				}
				claims = append(claims, claimed)
				whole = append(whole, time.Since(start))
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// check fails tb unless every volume is free and no plugin instance saw an
// overlapping attachment.
func (cb *claimBench) check(tb testing.TB) {
	tb.Helper()
	for _, v := range cb.volumes {
		got, err := cb.leader.State().CSIVolumeByID(nil, structs.DefaultNamespace, v.ID)
		must.NoError(tb, err)
		must.MapEmpty(tb, got.Claims, must.Sprintf("volume %s still claimed", v.ID))
	}
	for id, dir := range cb.stateDirs {
		for _, node := range []string{"node-a", "node-b"} {
			n, err := hostpath.ReadOverlaps(dir, node)
			must.NoError(tb, err)
			must.Eq(tb, int64(0), n, must.Sprintf("plugin %s, %s: overlaps", id, node))
		}
	}
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func sortedCopy(l *latencies) []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := slices.Clone(l.d)
	slices.Sort(s)
	return s
}

// benchClaimCycle measures the Raft apply baseline, then batches of
// cycles, on one cluster with plugins plugins of the given publish latency.
func benchClaimCycle(b *testing.B, plugins, workers int, latency time.Duration, batch int) {
	cb := newClaimBench(b, plugins, latency)

	raftRate := raftBaseline(b, cb.leader)

	claimLat, cycleLat := &latencies{}, &latencies{}
	var cycleElapsed time.Duration
	for b.Loop() {
		start := time.Now()
		if err := cb.cycles(workers, batch, claimLat, cycleLat); err != nil {
			b.Fatal(err)
		}
		cycleElapsed += time.Since(start)
	}
	b.StopTimer()
	cb.check(b)

	claims := sortedCopy(claimLat)
	whole := sortedCopy(cycleLat)
	if len(whole) == 0 {
		b.Fatal("no cycles recorded")
	}
	rate := float64(len(whole)) / cycleElapsed.Seconds()
	b.ReportMetric(rate, "cycles/s")
	b.ReportMetric(msOf(percentile(claims, 0.50)), "claim-p50-ms")
	b.ReportMetric(msOf(percentile(claims, 0.99)), "claim-p99-ms")
	b.ReportMetric(msOf(percentile(whole, 0.50)), "cycle-p50-ms")
	b.ReportMetric(msOf(percentile(whole, 0.99)), "cycle-p99-ms")
	reportRaftRatio(b, rate, raftRate, "cycles")
	b.ReportMetric(float64(cycleElapsed.Nanoseconds())/float64(len(whole)), "ns/op")
}

// Batch sizes are cycles per iteration, sized for a few seconds to a few
// tens of seconds on a 2-core machine. With 10 ms publish latency one lane
// allows at most 50 cycles/s (publish and unpublish both take the lane).

func BenchmarkCSIClaimCycle_1Plugin(b *testing.B) {
	benchClaimCycle(b, 1, claimBenchWorkers, 0, 2000)
}
func BenchmarkCSIClaimCycle_8Plugins(b *testing.B) {
	benchClaimCycle(b, 8, claimBenchWorkers, 0, 2000)
}
func BenchmarkCSIClaimCycle_1Plugin_10ms(b *testing.B) {
	benchClaimCycle(b, 1, claimBenchWorkers, 10*time.Millisecond, 300)
}
func BenchmarkCSIClaimCycle_8Plugins_10ms(b *testing.B) {
	benchClaimCycle(b, 8, claimBenchWorkers, 10*time.Millisecond, 1200)
}

// BenchmarkScaleClaimCycle runs the 16-worker, one-plugin
// cycles on two clusters in turn, one empty and one holding the state of
// a 5,000-node scale run (20,000 volumes, 10,000 claims, restored from a
// snapshot), and reports the claim p99 of the second over the first: the
// scale issue's target is at most 1.5. Not in make bench: building and
// restoring the state takes most of its three minutes.
func BenchmarkScaleClaimCycle(b *testing.B) {
	preload := saveSnapshotFile(b, buildScaleState(b, 5000).fsm)
	p99 := map[bool]time.Duration{}
	for _, big := range []bool{false, true} {
		var file []byte
		if big {
			file = preload
		}
		cb := newClaimBenchOn(b, 1, 0, nil, false, file)
		claimLat, cycleLat := &latencies{}, &latencies{}
		if err := cb.cycles(claimBenchWorkers, 1000, claimLat, cycleLat); err != nil {
			b.Fatal(err)
		}
		cb.check(b)
		p99[big] = percentile(sortedCopy(claimLat), 0.99)
	}
	for b.Loop() {
		// The figures are the two runs above; the loop only satisfies the
		// benchmark harness.
	}
	b.ReportMetric(msOf(p99[false]), "empty-claim-p99-ms")
	b.ReportMetric(msOf(p99[true]), "scale-claim-p99-ms")
	b.ReportMetric(float64(p99[true])/float64(max(p99[false], 1)), "p99-ratio")
}

// BenchmarkCSIClaimCycle_1Plugin_Serial runs cycles one at a time: the
// latency of an uncontended claim, with no queue in front of the lane.
func BenchmarkCSIClaimCycle_1Plugin_Serial(b *testing.B) {
	benchClaimCycle(b, 1, 1, 0, 500)
}
