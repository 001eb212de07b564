package nomad

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/roamhq/roam/nomad/csiclaim"
	"github.com/roamhq/roam/scheduler"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// volumeChecker answers the scheduler's CSI feasibility questions from the
// same state snapshot the evaluation is scheduled against.
//
// It sees only claims already in state, not the other placements of the
// plan being built: two allocations of one evaluation asking for one
// single-writer volume may both pass here. Claim admission (CanClaim at
// claim time and again at Raft apply time) stays the authority; this check
// only keeps the scheduler from placing where a claim cannot succeed.
//
// One checker serves one evaluation, from one goroutine.
type volumeChecker struct {
	snap *state.StateSnapshot
	// namespace is the evaluated job's; volumes are looked up in it.
	namespace string
	// attached caches, per plugin, the volumes (namespace/ID) with a claim
	// that still counts on each node, read once from snap: the scheduler
	// asks for every candidate node of every placement, and reading all of
	// a plugin's volumes each time made an evaluation cost placements x
	// nodes x volumes (hours at 1,000 nodes and 4,000 volumes).
	attached map[string]map[string]map[string]bool
	// live caches, per namespace/ID, the volume with only the claims that
	// still count (liveClaims), or nil for a volume not registered: it
	// does not depend on the node asked about.
	live map[string]*structs.CSIVolume
	// last is the node-independent part of the placement asked about
	// last; see FeasibleVolumes.
	last *placementVolumes
}

var _ scheduler.CandidateVolumeChecker = (*volumeChecker)(nil)

// volumeSource is the volume ID a request resolves to for the allocation
// with index allocIndex.
func volumeSource(req *structs.VolumeRequest, allocIndex int) string {
	if req.PerAlloc {
		return req.Source + fmt.Sprintf("[%d]", allocIndex)
	}
	return req.Source
}

// claimFor is the claim an allocation on node would make for req.
func claimFor(req *structs.VolumeRequest, nodeID string) *structs.CSIVolumeClaim {
	c := &structs.CSIVolumeClaim{
		NodeID:         nodeID,
		Mode:           structs.CSIVolumeClaimWrite,
		AccessMode:     req.AccessMode,
		AttachmentMode: req.AttachmentMode,
	}
	if req.ReadOnly {
		c.Mode = structs.CSIVolumeClaimRead
	}
	if c.AccessMode == "" {
		c.AccessMode = structs.CSIAccessModeSingleNodeWriter
	}
	if c.AttachmentMode == "" {
		c.AttachmentMode = structs.CSIAttachmentModeFilesystem
	}
	return c
}

// FeasibleVolumes implements scheduler.VolumeChecker. For each CSI volume
// the group requests, the volume must be registered, the node must run a
// healthy node instance of its plugin, the volume must have room for the
// claim, and the plugin's per-node volume limit (MaxVolumes) must not be
// exceeded. A claim counts as free once csiclaim.Releasable allows its
// release (the client reported its allocation terminal, or its node is
// down or gone): the volume watcher, or the new claim itself, finishes
// it. The claim of the allocation being replaced counts until then too:
// its task may still be inside its kill timeout, writing, so the
// replacement waits (a blocked evaluation) instead of racing it.
//
// The scheduler asks about every candidate node for one placement in a
// row: what does not depend on the node (which volumes, their free
// claims, the reasons to give) is resolved once per placement
// (placementVolumes), and only the node's own part is checked per node.
func (c *volumeChecker) FeasibleVolumes(node *structs.Node, tg *structs.TaskGroup, allocIndex int, replacing *structs.Allocation) (bool, string) {
	if len(tg.Volumes) == 0 {
		return true, ""
	}
	pv := c.forPlacement(tg, allocIndex, replacing)
	var buf [2]nodePlugin
	plugins := buf[:0]
	for k := range pv.plugins {
		plugins = append(plugins, nodePluginOf(node, pv.plugins[k].id))
	}
	return c.check(pv, node, plugins)
}

// nodePlugin is what the check reads of a node's instance of a plugin.
type nodePlugin struct {
	// info is the node's instance, nil when it has none.
	info    *structs.CSIInfo
	healthy bool
	// maxVolumes is the instance's volume limit; <= 0 is none.
	maxVolumes int64
}

func nodePluginOf(node *structs.Node, pluginID string) nodePlugin {
	info := node.CSINodePlugins[pluginID]
	np := nodePlugin{info: info}
	if info != nil {
		np.healthy = info.Healthy
		if info.NodeInfo != nil {
			np.maxVolumes = info.NodeInfo.MaxVolumes
		}
	}
	return np
}

// check answers FeasibleVolumes for pv on node, whose instances of
// pv.plugins are plugins (plugins[k] for pv.plugins[k]).
func (c *volumeChecker) check(pv *placementVolumes, node *structs.Node, plugins []nodePlugin) (bool, string) {
	for i := range pv.reqs {
		r := &pv.reqs[i]
		if r.fail != "" {
			return false, r.fail
		}
		np := &plugins[r.plugin]
		switch {
		case np.info == nil:
			return false, r.missingPlugin
		case !np.healthy:
			return false, r.unhealthyPlugin
		}
		if why := outsideTopology(r.free, np.info); why != "" {
			return false, why
		}
		err := r.claimErr
		if !r.claimKnown {
			claim := r.claim
			claim.NodeID = node.ID
			err = r.free.CanClaim(&claim)
		}
		if err != nil {
			if errors.Is(err, structs.ErrCSIMaxClaims) {
				return false, r.maxClaims
			}
			return false, fmt.Sprintf("volume %q: %v", r.id, err)
		}
	}
	for k := range pv.plugins {
		pl := &pv.plugins[k]
		limit := plugins[k].maxVolumes
		if limit <= 0 {
			continue
		}
		if pl.byNode == nil {
			byNode, err := c.attachedByNode(pl.id)
			if err != nil {
				return false, pl.readFailed
			}
			pl.byNode = byNode
		}
		var attached map[string]bool
		if len(pl.byNode) > 0 {
			attached = pl.byNode[node.ID]
		}
		count := len(attached)
		for _, key := range pl.keys {
			if !attached[key] {
				count++
			}
		}
		if int64(count) > limit {
			return false, pl.maxVolumes
		}
	}
	return true, ""
}

// ForNodes implements scheduler.CandidateVolumeChecker: each node's
// instance of a plugin is read once for the list, and kept in a slice
// walked in the scheduler's order, instead of looked up in the node's
// plugin map for every placement (at 5,000 nodes those scattered reads
// were most of a placement's cost).
func (c *volumeChecker) ForNodes(nodes []*structs.Node) scheduler.NodeVolumeChecker {
	return &candidateVolumes{c: c, nodes: nodes, columns: make(map[string][]nodePlugin)}
}

// candidateVolumes answers for a list of nodes by position.
type candidateVolumes struct {
	c     *volumeChecker
	nodes []*structs.Node
	// columns holds, per plugin ID, every node's instance of the plugin,
	// in the order of nodes.
	columns map[string][]nodePlugin
	// cols are last's plugins' columns, in last.plugins order.
	last *placementVolumes
	cols [][]nodePlugin
}

// FeasibleVolumesAt implements scheduler.NodeVolumeChecker.
func (cv *candidateVolumes) FeasibleVolumesAt(i int, tg *structs.TaskGroup, allocIndex int, replacing *structs.Allocation) (bool, string) {
	if len(tg.Volumes) == 0 {
		return true, ""
	}
	pv := cv.c.forPlacement(tg, allocIndex, replacing)
	if pv != cv.last {
		cv.cols = cv.cols[:0]
		for k := range pv.plugins {
			cv.cols = append(cv.cols, cv.column(pv.plugins[k].id))
		}
		cv.last = pv
	}
	var plugins []nodePlugin
	switch len(cv.cols) {
	case 0:
	case 1:
		plugins = cv.cols[0][i : i+1]
	default:
		var buf [4]nodePlugin
		plugins = buf[:0]
		for k := range cv.cols {
			plugins = append(plugins, cv.cols[k][i])
		}
	}
	return cv.c.check(pv, cv.nodes[i], plugins)
}

func (cv *candidateVolumes) column(pluginID string) []nodePlugin {
	if col, ok := cv.columns[pluginID]; ok {
		return col
	}
	col := make([]nodePlugin, len(cv.nodes))
	for i, n := range cv.nodes {
		col[i] = nodePluginOf(n, pluginID)
	}
	cv.columns[pluginID] = col
	return col
}

// placementVolumes is what FeasibleVolumes needs for one placement (task
// group, allocation index, allocation replaced) that does not depend on
// the node asked about.
type placementVolumes struct {
	tg         *structs.TaskGroup
	allocIndex int
	replacing  *structs.Allocation
	// reqs are the group's CSI requests, by volume name: checked in this
	// order so the reason recorded for a rejection is stable.
	reqs []resolvedRequest
	// plugins are the plugins of reqs, by ID, with the volumes the
	// placement would attach through each, for the MaxVolumes check.
	plugins []placementPlugin
}

// resolvedRequest is one CSI volume request of a placement.
type resolvedRequest struct {
	// id is the volume ID the request resolves to.
	id string
	// plugin is the position of the volume's plugin in
	// placementVolumes.plugins.
	plugin int
	// fail, when not empty, rejects every node: the volume is not
	// registered or could not be read. The other fields are then unset.
	fail string
	// free is the volume with only its claims that still count.
	free *structs.CSIVolume
	// claim is the claim the placement would make, without its node.
	claim structs.CSIVolumeClaim
	// claimKnown says claimErr is free.CanClaim(claim) on every node:
	// with no claim counting, the node does not change the answer.
	claimKnown bool
	claimErr   error
	// Rejection reasons, formatted once.
	missingPlugin, unhealthyPlugin, maxClaims string
}

// placementPlugin is a plugin through which a placement attaches volumes.
type placementPlugin struct {
	id string
	// keys are the volumes (namespace/ID) the placement attaches, each once.
	keys                   []string
	readFailed, maxVolumes string
	// byNode is attachedByNode(id), once read.
	byNode map[string]map[string]bool
}

// forPlacement returns the node-independent part of the placement's
// check, built on the first node asked about and kept while the
// scheduler asks about the same placement.
func (c *volumeChecker) forPlacement(tg *structs.TaskGroup, allocIndex int, replacing *structs.Allocation) *placementVolumes {
	if pv := c.last; pv != nil && pv.tg == tg && pv.allocIndex == allocIndex && pv.replacing == replacing {
		return pv
	}
	ns := c.namespace
	if ns == "" {
		ns = structs.DefaultNamespace
	}
	pv := &placementVolumes{tg: tg, allocIndex: allocIndex, replacing: replacing}
	byPlugin := make(map[string]map[string]bool)
	for _, name := range slices.Sorted(maps.Keys(tg.Volumes)) {
		req := tg.Volumes[name]
		if req == nil || req.Type != "csi" {
			continue
		}
		id := volumeSource(req, allocIndex)
		r := resolvedRequest{id: id}
		vol, free, err := c.volume(ns, id)
		switch {
		case err != nil:
			r.fail = fmt.Sprintf("volume %q: state read failed", id)
		case vol == nil:
			r.fail = fmt.Sprintf("volume %q not registered", id)
		}
		if r.fail != "" {
			// Nothing after it is looked at on any node.
			pv.reqs = append(pv.reqs, r)
			break
		}
		r.free = free
		r.claim = *claimFor(req, "")
		if len(free.Claims) == 0 {
			r.claimKnown = true
			r.claimErr = free.CanClaim(&r.claim)
		}
		r.missingPlugin = fmt.Sprintf("missing CSI node plugin %q", vol.PluginID)
		r.unhealthyPlugin = fmt.Sprintf("unhealthy CSI node plugin %q", vol.PluginID)
		r.maxClaims = fmt.Sprintf("volume %q max claims reached", id)
		if replacing != nil && free.Claims[replacing.ID] != nil {
			r.maxClaims = fmt.Sprintf("volume %q: waiting for allocation %s to stop", id, replacing.ID)
		}
		pv.reqs = append(pv.reqs, r)
		if byPlugin[vol.PluginID] == nil {
			byPlugin[vol.PluginID] = make(map[string]bool)
		}
		byPlugin[vol.PluginID][vol.Namespace+"/"+vol.ID] = true
	}
	for _, id := range slices.Sorted(maps.Keys(byPlugin)) {
		pv.plugins = append(pv.plugins, placementPlugin{
			id:         id,
			keys:       slices.Sorted(maps.Keys(byPlugin[id])),
			readFailed: fmt.Sprintf("CSI node plugin %q: state read failed", id),
			maxVolumes: fmt.Sprintf("CSI node plugin %q max volumes reached", id),
		})
	}
	for i := range pv.reqs {
		r := &pv.reqs[i]
		if r.fail == "" {
			r.plugin = slices.IndexFunc(pv.plugins, func(pl placementPlugin) bool { return pl.id == r.free.PluginID })
		}
	}
	c.last = pv
	return pv
}

// volume returns the volume ns/id (nil if not registered) and the same
// with only its claims that still count, read from the snapshot once per
// checker.
func (c *volumeChecker) volume(ns, id string) (vol, free *structs.CSIVolume, err error) {
	key := ns + "/" + id
	if free, ok := c.live[key]; ok {
		if free == nil {
			return nil, nil, nil
		}
		return free, free, nil
	}
	vol, err = c.snap.CSIVolumeByID(nil, ns, id)
	if err != nil {
		return nil, nil, err
	}
	if vol != nil {
		free = c.liveClaims(vol)
	}
	if c.live == nil {
		c.live = make(map[string]*structs.CSIVolume)
	}
	c.live[key] = free
	return vol, free, nil
}

// liveClaims returns vol, or a copy of it, holding only the claims that
// still count: those csiclaim.Releasable does not yet allow to release.
func (c *volumeChecker) liveClaims(vol *structs.CSIVolume) *structs.CSIVolume {
	var drop []string
	for allocID, cl := range vol.Claims {
		if c.releasable(allocID, cl.NodeID) {
			drop = append(drop, allocID)
		}
	}
	if len(drop) == 0 {
		return vol
	}
	cp := vol.Copy()
	for _, id := range drop {
		delete(cp.Claims, id)
	}
	return cp
}

// releasable reports whether a claim of the allocation on the node may be
// released: csiclaim.Releasable, read from the snapshot.
func (c *volumeChecker) releasable(allocID, nodeID string) bool {
	a, err := c.snap.AllocByID(nil, allocID)
	if err != nil {
		return false // unknown: keep counting the claim
	}
	n, err := c.snap.NodeByID(nil, nodeID)
	if err != nil {
		return false
	}
	return csiclaim.Releasable(a, n)
}

// attachedByNode returns, per node ID, the plugin's volumes
// (namespace/ID) with a claim that still counts on the node. The maps are
// the checker's own: read them, never change them.
func (c *volumeChecker) attachedByNode(pluginID string) (map[string]map[string]bool, error) {
	byNode, ok := c.attached[pluginID]
	if !ok {
		vols, err := c.snap.CSIVolumesByPlugin(nil, pluginID)
		if err != nil {
			return nil, err
		}
		byNode = make(map[string]map[string]bool)
		for _, v := range vols {
			for allocID, cl := range v.Claims {
				if c.releasable(allocID, cl.NodeID) {
					continue
				}
				if byNode[cl.NodeID] == nil {
					byNode[cl.NodeID] = make(map[string]bool)
				}
				byNode[cl.NodeID][v.Namespace+"/"+v.ID] = true
			}
		}
		if c.attached == nil {
			c.attached = make(map[string]map[string]map[string]bool)
		}
		c.attached[pluginID] = byNode
	}
	return byNode, nil
}

// outsideTopology says why a node whose plugin instance is info may not
// hold vol: it lies outside every topology the volume is accessible in.
// It is "" when the node may (or the volume has no topology).
func outsideTopology(vol *structs.CSIVolume, info *structs.CSIInfo) string {
	if len(vol.Topologies) == 0 {
		return ""
	}
	var at *structs.CSITopology
	if info != nil && info.NodeInfo != nil {
		at = info.NodeInfo.AccessibleTopology
	}
	for _, t := range vol.Topologies {
		if t.Contains(at) {
			return ""
		}
	}
	return fmt.Sprintf("volume %q is accessible only in topology %s; the node is in %s",
		vol.ID, structs.TopologiesString(vol.Topologies), at.String())
}
