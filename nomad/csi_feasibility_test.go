package nomad

import (
	"fmt"
	"slices"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// feasVolume is a registered hostpath volume with the given capability
// and claims.
func feasVolume(id, access string, claims ...*structs.CSIVolumeClaim) *structs.CSIVolume {
	v := testVolume(id)
	v.Namespace = structs.DefaultNamespace
	v.RequestedCapabilities[0].AccessMode = access
	v.Claims = make(map[string]*structs.CSIVolumeClaim)
	for _, c := range claims {
		v.Claims[c.AllocationID] = c
	}
	return v
}

func writeClaim(allocID, nodeID, access string) *structs.CSIVolumeClaim {
	return &structs.CSIVolumeClaim{AllocationID: allocID, NodeID: nodeID, Mode: structs.CSIVolumeClaimWrite,
		AccessMode: access, AttachmentMode: structs.CSIAttachmentModeFilesystem, State: structs.CSIVolumeClaimStateTaken}
}

func feasAlloc(id, nodeID, clientStatus string) *structs.Allocation {
	return &structs.Allocation{ID: id, Namespace: structs.DefaultNamespace, JobID: "db", TaskGroup: "db",
		Name: "db.db[0]", NodeID: nodeID, DesiredStatus: structs.AllocDesiredStatusRun, ClientStatus: clientStatus}
}

func csiGroup(reqs ...*structs.VolumeRequest) *structs.TaskGroup {
	tg := &structs.TaskGroup{Name: "db", Count: 1, Volumes: map[string]*structs.VolumeRequest{}}
	for i, r := range reqs {
		tg.Volumes[fmt.Sprintf("v%d", i)] = r
	}
	return tg
}

func TestVolumeChecker_FeasibleVolumes(t *testing.T) {
	const (
		snw  = structs.CSIAccessModeSingleNodeWriter
		mnsw = structs.CSIAccessModeMultiNodeSingleWriter
	)
	node := csiNode("n1")
	noPlugin := workNode("n2")
	unhealthy := csiNode("n3")
	unhealthy.CSINodePlugins["hostpath"].Healthy = false
	oneVolume := csiNode("n4")
	oneVolume.CSINodePlugins["hostpath"].NodeInfo.MaxVolumes = 1
	emptyOneVolume := csiNode("n5")
	emptyOneVolume.CSINodePlugins["hostpath"].NodeInfo.MaxVolumes = 1

	// The claims' nodes: a claim counts until its allocation's client
	// reports it terminal, unless its node is down or gone.
	other := workNode("other")
	other.ID = "other-node"
	down := workNode("down")
	down.ID, down.Status = "down-node", structs.NodeStatusDown

	stopping := feasAlloc("stopping", "other-node", structs.AllocClientStatusRunning)
	stopping.DesiredStatus = structs.AllocDesiredStatusStop
	stoppedDone := feasAlloc("stopped-done", "other-node", structs.AllocClientStatusComplete)
	stoppedDone.DesiredStatus = structs.AllocDesiredStatusStop
	allocs := []*structs.Allocation{
		feasAlloc("live", "other-node", structs.AllocClientStatusRunning),
		feasAlloc("old", "other-node", structs.AllocClientStatusRunning),
		feasAlloc("done", "other-node", structs.AllocClientStatusComplete),
		feasAlloc("here", oneVolume.ID, structs.AllocClientStatusRunning),
		stopping, stoppedDone,
		feasAlloc("lost-node", "down-node", structs.AllocClientStatusRunning),
	}
	vols := []*structs.CSIVolume{
		feasVolume("free", snw),
		feasVolume("taken", snw, writeClaim("live", "other-node", snw)),
		feasVolume("replaced", snw, writeClaim("old", "other-node", snw)),
		feasVolume("finished", snw, writeClaim("done", "other-node", snw)),
		feasVolume("gone", snw, writeClaim("no-such-alloc", "other-node", snw)),
		feasVolume("shared", mnsw, writeClaim("live", "other-node", mnsw)),
		feasVolume("vol[2]", snw),
		feasVolume("attached", snw, writeClaim("here", oneVolume.ID, snw)),
		feasVolume("stopping", snw, writeClaim("stopping", "other-node", snw)),
		feasVolume("stopped", snw, writeClaim("stopped-done", "other-node", snw)),
		feasVolume("on-down-node", snw, writeClaim("lost-node", "down-node", snw)),
		feasVolume("on-gone-node", snw, writeClaim("live", "no-such-node", snw)),
	}
	snap := feasSnapshot(t, allocs, vols, oneVolume, other, down)
	replacing := allocs[1]

	csi := func(source string) *structs.VolumeRequest {
		return &structs.VolumeRequest{Type: "csi", Source: source}
	}
	cases := []struct {
		name      string
		node      *structs.Node
		tg        *structs.TaskGroup
		index     int
		replacing *structs.Allocation
		reason    string // empty: feasible
	}{
		{name: "no volumes", node: noPlugin, tg: csiGroup()},
		{name: "free volume", node: node, tg: csiGroup(csi("free"))},
		{name: "volume missing", node: node, tg: csiGroup(csi("nope")), reason: `volume "nope" not registered`},
		{name: "node without plugin", node: noPlugin, tg: csiGroup(csi("free")), reason: `missing CSI node plugin "hostpath"`},
		{name: "unhealthy plugin", node: unhealthy, tg: csiGroup(csi("free")), reason: `unhealthy CSI node plugin "hostpath"`},
		{name: "claimed by live alloc", node: node, tg: csiGroup(csi("taken")), reason: `volume "taken" max claims reached`},
		{name: "claimed by live alloc, replacing another", node: node, tg: csiGroup(csi("taken")), replacing: replacing,
			reason: `volume "taken" max claims reached`},
		// The replaced allocation's task may still be inside its kill
		// timeout: the replacement waits for it.
		{name: "claimed by replaced alloc, still running", node: node, tg: csiGroup(csi("replaced")), replacing: replacing,
			reason: `volume "replaced": waiting for allocation old to stop`},
		{name: "claimed by alloc asked to stop, still running", node: node, tg: csiGroup(csi("stopping")),
			reason: `volume "stopping" max claims reached`},
		{name: "claimed by alloc asked to stop, client done", node: node, tg: csiGroup(csi("stopped"))},
		{name: "claimed on a down node", node: node, tg: csiGroup(csi("on-down-node"))},
		{name: "claimed on a node gone from state", node: node, tg: csiGroup(csi("on-gone-node"))},
		{name: "claimed by replaced alloc, no replacement", node: node, tg: csiGroup(csi("replaced")),
			reason: `volume "replaced" max claims reached`},
		{name: "claimed by terminal alloc", node: node, tg: csiGroup(csi("finished"))},
		{name: "claimed by alloc gone from state", node: node, tg: csiGroup(csi("gone"))},
		{name: "per alloc picks index", node: node, index: 2,
			tg: csiGroup(&structs.VolumeRequest{Type: "csi", Source: "vol", PerAlloc: true})},
		{name: "per alloc other index missing", node: node, index: 1,
			tg:     csiGroup(&structs.VolumeRequest{Type: "csi", Source: "vol", PerAlloc: true}),
			reason: `volume "vol[1]" not registered`},
		{name: "read-only beside a writer", node: node,
			tg: csiGroup(&structs.VolumeRequest{Type: "csi", Source: "shared", ReadOnly: true, AccessMode: mnsw})},
		{name: "second writer", node: node,
			tg:     csiGroup(&structs.VolumeRequest{Type: "csi", Source: "shared", AccessMode: mnsw}),
			reason: `volume "shared" max claims reached`},
		{name: "unsupported access mode", node: node,
			tg:     csiGroup(&structs.VolumeRequest{Type: "csi", Source: "free", AccessMode: mnsw}),
			reason: `does not support access mode`},
		{name: "max volumes reached", node: oneVolume, tg: csiGroup(csi("free")),
			reason: `CSI node plugin "hostpath" max volumes reached`},
		{name: "max volumes counts an attached volume once", node: oneVolume,
			tg: csiGroup(&structs.VolumeRequest{Type: "csi", Source: "attached", ReadOnly: true})},
		{name: "max volumes counts every request", node: emptyOneVolume, tg: csiGroup(csi("free"), csi("finished")),
			reason: `CSI node plugin "hostpath" max volumes reached`},
		{name: "max volumes one request", node: emptyOneVolume, tg: csiGroup(csi("finished"))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &volumeChecker{snap: snap, namespace: structs.DefaultNamespace}
			ok, reason := c.FeasibleVolumes(tc.node, tc.tg, tc.index, tc.replacing)
			if tc.reason == "" {
				must.True(t, ok, must.Sprintf("reason: %s", reason))
				must.Eq(t, "", reason)
				return
			}
			must.False(t, ok)
			must.StrContains(t, reason, tc.reason)
		})
	}
}

func feasSnapshot(t testing.TB, allocs []*structs.Allocation, vols []*structs.CSIVolume, nodes ...*structs.Node) *state.StateSnapshot {
	t.Helper()
	store, err := state.NewStateStore()
	must.NoError(t, err)
	for i, n := range nodes {
		must.NoError(t, store.UpsertNode(uint64(10+i), n))
	}
	must.NoError(t, store.UpsertAllocs(1, allocs))
	must.NoError(t, store.UpsertCSIVolumes(2, vols))
	return store.Snapshot()
}

func TestVolumeChecker_PlacesOnPluginNode(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	plain := workNode("plain")
	withPlugin := csiNode("csi")
	registerNodeRetry(t, s, plain)
	registerNodeRetry(t, s, withPlugin)

	vol := testVolume("shared")
	vol.RequestedCapabilities[0].AccessMode = structs.CSIAccessModeMultiNodeMultiWriter
	var rresp structs.CSIVolumeRegisterResponse
	must.NoError(t, s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{vol}}, &rresp))

	// Without the check, four allocations would land on both nodes.
	job := serviceJob("db", 4)
	job.TaskGroups[0].Volumes = map[string]*structs.VolumeRequest{"data": {
		Type: "csi", Source: "shared", AccessMode: structs.CSIAccessModeMultiNodeMultiWriter}}
	registerJob(t, s, job)
	live := waitAllocs(t, s, "db", countIs(4))
	for _, a := range live {
		must.Eq(t, withPlugin.ID, a.NodeID, must.Sprintf("alloc %s", a.Name))
	}
}

// scaleFeasibility is a snapshot of nodes nodes and 4 volumes of plugin
// hostpath per node, the first two of each node's claimed by a running
// allocation there, and the nodes.
func scaleFeasibility(tb testing.TB, nodes int) (*state.StateSnapshot, []*structs.Node) {
	tb.Helper()
	var (
		ns     []*structs.Node
		allocs []*structs.Allocation
		vols   []*structs.CSIVolume
	)
	for i := range nodes {
		n := csiNode(fmt.Sprintf("n%05d", i))
		n.ID = fmt.Sprintf("node-%05d", i)
		ns = append(ns, n)
		for j := range 4 {
			id := fmt.Sprintf("v%05d-%d", i, j)
			if j < 2 {
				a := feasAlloc("a-"+id, n.ID, structs.AllocClientStatusRunning)
				allocs = append(allocs, a)
				vols = append(vols, feasVolume(id, structs.CSIAccessModeSingleNodeWriter,
					writeClaim(a.ID, n.ID, structs.CSIAccessModeSingleNodeWriter)))
				continue
			}
			vols = append(vols, feasVolume(id, structs.CSIAccessModeSingleNodeWriter))
		}
	}
	return feasSnapshot(tb, allocs, vols, ns...), ns
}

// A node's per-plugin volume limit is checked against the volumes claimed
// on that node only, whichever node is asked first: the checker reads
// the plugin's volumes once and answers every node from that.
func TestVolumeChecker_MaxVolumesPerNode(t *testing.T) {
	snap, nodes := scaleFeasibility(t, 20)
	c := &volumeChecker{snap: snap, namespace: structs.DefaultNamespace}
	for i := len(nodes) - 1; i >= 0; i-- {
		n := nodes[i].Copy()
		n.CSINodePlugins["hostpath"].NodeInfo.MaxVolumes = 3
		// Two claimed on the node, one more fits; a volume of another
		// node (free) is the one asked for.
		free := fmt.Sprintf("v%05d-3", (i+1)%len(nodes))
		tg := csiGroup(&structs.VolumeRequest{Type: "csi", Source: free})
		ok, why := c.FeasibleVolumes(n, tg, 0, nil)
		must.True(t, ok, must.Sprintf("node %d: %s", i, why))
		n.CSINodePlugins["hostpath"].NodeInfo.MaxVolumes = 2
		ok, why = c.FeasibleVolumes(n, tg, 0, nil)
		must.False(t, ok, must.Sprintf("node %d", i))
		must.StrContains(t, why, "max volumes reached")
	}
}

// One placement's feasibility across every node of a 1,000-node state
// with 4,000 volumes: what the scheduler pays per placement.
func BenchmarkFeasibleVolumes_1000Nodes(b *testing.B) {
	snap, nodes := scaleFeasibility(b, 1000)
	tg := csiGroup(&structs.VolumeRequest{Type: "csi", Source: "v00000-3"})
	b.ReportAllocs()
	for b.Loop() {
		c := &volumeChecker{snap: snap, namespace: structs.DefaultNamespace}
		for _, n := range nodes {
			if ok, why := c.FeasibleVolumes(n, tg, 0, nil); !ok {
				b.Fatalf("node %s: %s", n.ID, why)
			}
		}
	}
}

// The same with one checker for every iteration, as one evaluation
// placing many allocations uses it: the cost of each placement after the
// first.
func BenchmarkFeasibleVolumes_1000NodesWarm(b *testing.B) {
	snap, nodes := scaleFeasibility(b, 1000)
	tg := csiGroup(&structs.VolumeRequest{Type: "csi", Source: "v00000-3"})
	c := &volumeChecker{snap: snap, namespace: structs.DefaultNamespace}
	b.ReportAllocs()
	for b.Loop() {
		for _, n := range nodes {
			if ok, why := c.FeasibleVolumes(n, tg, 0, nil); !ok {
				b.Fatalf("node %s: %s", n.ID, why)
			}
		}
	}
}

// The scheduler asks one checker about every node for one placement, then
// about every node for the next: the part of the answer kept between
// calls must be the placement's (group, index, replaced allocation), and
// what depends on the node (a claim on that same node) must still be
// asked per node.
func TestVolumeChecker_OneCheckerManyPlacements(t *testing.T) {
	const (
		snw = structs.CSIAccessModeSingleNodeWriter
		snr = structs.CSIAccessModeSingleNodeReader
	)
	nodeA, nodeB := csiNode("a"), csiNode("b")
	unhealthy, noPlugin, full := csiNode("c"), workNode("d"), csiNode("e")
	unhealthy.CSINodePlugins["hostpath"].Healthy = false
	full.CSINodePlugins["hostpath"].NodeInfo.MaxVolumes = 1
	reader := feasAlloc("reader", nodeA.ID, structs.AllocClientStatusRunning)
	old := feasAlloc("old", nodeB.ID, structs.AllocClientStatusRunning)
	readClaim := &structs.CSIVolumeClaim{AllocationID: reader.ID, NodeID: nodeA.ID, Mode: structs.CSIVolumeClaimRead,
		AccessMode: snr, AttachmentMode: structs.CSIAttachmentModeFilesystem, State: structs.CSIVolumeClaimStateTaken}
	vols := []*structs.CSIVolume{
		feasVolume("free", snw),
		feasVolume("taken", snw, writeClaim(reader.ID, nodeA.ID, snw)),
		feasVolume("read-on-a", snr, readClaim),
		feasVolume("replaced", snw, writeClaim(old.ID, nodeB.ID, snw)),
		feasVolume("vol[0]", snw),
	}
	snap := feasSnapshot(t, []*structs.Allocation{reader, old}, vols, nodeA, nodeB)

	free := csiGroup(&structs.VolumeRequest{Type: "csi", Source: "free"})
	taken := csiGroup(&structs.VolumeRequest{Type: "csi", Source: "taken"})
	readOnA := csiGroup(&structs.VolumeRequest{Type: "csi", Source: "read-on-a", ReadOnly: true, AccessMode: snr})
	replaced := csiGroup(&structs.VolumeRequest{Type: "csi", Source: "replaced"})
	perAlloc := csiGroup(&structs.VolumeRequest{Type: "csi", Source: "vol", PerAlloc: true})

	steps := []struct {
		name      string
		node      *structs.Node
		tg        *structs.TaskGroup
		index     int
		replacing *structs.Allocation
		reason    string // empty: feasible
	}{
		{name: "free", node: nodeA, tg: free},
		{name: "another group, same index", node: nodeA, tg: taken, reason: `volume "taken" max claims reached`},
		{name: "first group again", node: nodeB, tg: free},
		{name: "unhealthy plugin", node: unhealthy, tg: free, reason: `unhealthy CSI node plugin "hostpath"`},
		{name: "no plugin", node: noPlugin, tg: free, reason: `missing CSI node plugin "hostpath"`},
		{name: "two volumes, room for one", node: full, tg: csiGroup(
			&structs.VolumeRequest{Type: "csi", Source: "free"}, &structs.VolumeRequest{Type: "csi", Source: "vol[0]"}),
			reason: `CSI node plugin "hostpath" max volumes reached`},
		{name: "one volume, room for one", node: full, tg: free},
		// A single-node reader volume read on node a admits another
		// reader there and nowhere else: the node decides.
		{name: "reader on the claim's node", node: nodeA, tg: readOnA},
		{name: "reader on another node", node: nodeB, tg: readOnA, reason: `volume "read-on-a" max claims reached`},
		{name: "reader on the claim's node again", node: nodeA, tg: readOnA},
		{name: "per alloc index 0", node: nodeA, tg: perAlloc},
		{name: "per alloc index 1", node: nodeA, tg: perAlloc, index: 1, reason: `volume "vol[1]" not registered`},
		{name: "per alloc index 0 again", node: nodeB, tg: perAlloc},
		{name: "claimed, nothing replaced", node: nodeA, tg: replaced, reason: `volume "replaced" max claims reached`},
		{name: "claimed by the replaced alloc", node: nodeA, tg: replaced, replacing: old,
			reason: `volume "replaced": waiting for allocation old to stop`},
		{name: "claimed, nothing replaced again", node: nodeB, tg: replaced, reason: `volume "replaced" max claims reached`},
	}
	// Asked node by node, and by position through ForNodes as the
	// scheduler asks: the same answers.
	c := &volumeChecker{snap: snap, namespace: structs.DefaultNamespace}
	nodes := []*structs.Node{nodeA, nodeB, unhealthy, noPlugin, full}
	byPosition := (&volumeChecker{snap: snap, namespace: structs.DefaultNamespace}).ForNodes(nodes)
	for round := range 2 {
		for _, st := range steps {
			ok, reason := c.FeasibleVolumes(st.node, st.tg, st.index, st.replacing)
			okAt, reasonAt := byPosition.FeasibleVolumesAt(slices.Index(nodes, st.node), st.tg, st.index, st.replacing)
			must.Eq(t, ok, okAt, must.Sprintf("round %d, %s: by position", round, st.name))
			must.Eq(t, reason, reasonAt, must.Sprintf("round %d, %s: by position", round, st.name))
			if st.reason == "" {
				must.True(t, ok, must.Sprintf("round %d, %s: %s", round, st.name, reason))
				must.Eq(t, "", reason)
				continue
			}
			must.False(t, ok, must.Sprintf("round %d, %s", round, st.name))
			must.Eq(t, st.reason, reason, must.Sprintf("round %d, %s", round, st.name))
		}
		slices.Reverse(steps)
	}
}
