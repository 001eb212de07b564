package scheduler

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/roamhq/roam/structs"
)

// Filter reasons recorded in AllocMetric.ConstraintFiltered, and the
// dimensions recorded in AllocMetric.DimensionExhausted.
const (
	FilterDatacenter = "node not in job datacenters"
	FilterNotReady   = "node not ready"
	FilterIneligible = "node ineligible"
	FilterDraining   = "node draining"
	DimensionCPU     = "cpu"
	DimensionMemory  = "memory"
)

// Ranking weights. Bin-packing scores a node in [0, 2] (CPU fraction plus
// memory fraction after placing); the anti-affinity subtracts
// antiAffinityWeight * (allocs of the same job group already on the node)
// / group count, so a node holding every replica loses up to one point.
// Nodes a rescheduled allocation already failed on are not scored lower
// but ranked in later tiers: the tier is the number of failures of the
// allocation's lineage on that node (0 for others), and a lower tier
// always wins over a higher one. So any node without failures beats a
// failed-on node, a failed-on node is still used when nothing else fits,
// and when every fitting node has failures the one with the fewest wins.
const antiAffinityWeight = 1.0

// mib is a mebibyte; memory.totalbytes is divided by it.
const mib = 1 << 20

// filterMissingDriver and filterUnhealthyDriver name a task driver problem.
func filterMissingDriver(d string) string   { return fmt.Sprintf("missing driver %q", d) }
func filterUnhealthyDriver(d string) string { return fmt.Sprintf("unhealthy driver %q", d) }

// nodeUsage is what a node has and what is asked of it so far, counting
// the plan's own stops and placements.
type nodeUsage struct {
	capCPU, capMem   int
	usedCPU, usedMem int
	// groups counts non-terminal allocations per namespace/job/group.
	groups map[string]int
	// ports counts the holders of each host port; more than one is a
	// collision some earlier plan let through, and stays visible here.
	ports map[int]int
}

func newNodeUsage(n *structs.Node) *nodeUsage {
	u := &nodeUsage{groups: make(map[string]int), ports: make(map[int]int)}
	u.capCPU, u.capMem = nodeCapacity(n)
	return u
}

func groupKey(ns, job, group string) string { return ns + "\x00" + job + "\x00" + group }

func (u *nodeUsage) add(a *structs.Allocation) {
	r := allocAsk(a)
	u.usedCPU += r.CPU
	u.usedMem += r.MemoryMB
	u.groups[groupKey(a.Namespace, a.JobID, a.TaskGroup)]++
	for _, p := range a.Ports() {
		u.ports[p.Value]++
	}
}

func (u *nodeUsage) remove(a *structs.Allocation) {
	r := allocAsk(a)
	u.usedCPU -= r.CPU
	u.usedMem -= r.MemoryMB
	u.groups[groupKey(a.Namespace, a.JobID, a.TaskGroup)]--
	for _, p := range a.Ports() {
		if u.ports[p.Value]--; u.ports[p.Value] <= 0 {
			delete(u.ports, p.Value)
		}
	}
}

// allocAsk is what an allocation holds: its Resources, or its group's
// task resources when Resources was not filled in.
func allocAsk(a *structs.Allocation) structs.Resources {
	if a.Resources != nil {
		return *a.Resources
	}
	if a.Job != nil {
		if tg := a.Job.LookupTaskGroup(a.TaskGroup); tg != nil {
			return groupAsk(tg)
		}
	}
	return structs.Resources{}
}

// nodeCapacity is a node's CPU in MHz and memory in MiB: cpu.totalcompute
// if the client reported it, else cpu.numcores * 1000; memory.totalbytes
// / 1 MiB. Missing or malformed attributes count as zero capacity.
func nodeCapacity(n *structs.Node) (cpu, mem int) {
	if v, err := strconv.Atoi(n.Attributes["cpu.totalcompute"]); err == nil && v > 0 {
		cpu = v
	} else if c, err := strconv.Atoi(n.Attributes["cpu.numcores"]); err == nil && c > 0 {
		cpu = c * 1000
	}
	if b, err := strconv.ParseInt(n.Attributes["memory.totalbytes"], 10, 64); err == nil && b > 0 {
		mem = int(b / mib)
	}
	return cpu, mem
}

// usageOf loads a node's usage: its non-terminal allocations, minus those
// this plan stops, plus those it places.
func (p *planner) usageOf(n *structs.Node) (*nodeUsage, error) {
	if u, ok := p.usage[n.ID]; ok {
		return u, nil
	}
	allocs, err := p.st.AllocsByNode(n.ID)
	if err != nil {
		return nil, fmt.Errorf("reading allocations on node %q: %w", n.ID, err)
	}
	u := newNodeUsage(n)
	for _, a := range allocs {
		if a.TerminalStatus() || p.stopped[a.ID] {
			continue
		}
		u.add(a)
	}
	p.usage[n.ID] = u
	return u, nil
}

// matchDatacenter reports whether dc matches pattern, where '*' in pattern
// matches any run of characters ("*" matches every datacenter, "dc*"
// every one starting with "dc"). There is no other glob syntax.
func matchDatacenter(pattern, dc string) bool {
	if !strings.Contains(pattern, "*") {
		return pattern == dc
	}
	parts := strings.Split(pattern, "*")
	if !strings.HasPrefix(dc, parts[0]) {
		return false
	}
	rest := dc[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, mid := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, mid)
		if i < 0 {
			return false
		}
		rest = rest[i+len(mid):]
	}
	return len(rest) >= len(last) && strings.HasSuffix(rest, last)
}

func inDatacenters(dcs []string, dc string) bool {
	for _, p := range dcs {
		if matchDatacenter(p, dc) {
			return true
		}
	}
	return false
}

// staticCheck applies the checks that depend only on the node and the
// group, in a fixed order, and returns the first reason to reject.
func staticCheck(job *structs.Job, tg *structs.TaskGroup, n *structs.Node) (ok bool, reason string) {
	switch {
	case !inDatacenters(job.Datacenters, n.Datacenter):
		return false, FilterDatacenter
	case n.Status != structs.NodeStatusReady:
		return false, FilterNotReady
	case n.SchedulingEligibility != structs.NodeSchedulingEligible:
		return false, FilterIneligible
	case n.DrainStrategy != nil:
		return false, FilterDraining
	}
	for _, t := range tg.Tasks {
		d := n.Drivers[t.Driver]
		switch {
		case d == nil || !d.Detected:
			return false, filterMissingDriver(t.Driver)
		case !d.Healthy:
			return false, filterUnhealthyDriver(t.Driver)
		}
	}
	return true, ""
}

// staticFeasibility is a group's candidate nodes (sorted by ID) and the
// metric of the nodes ruled out before resources are looked at.
type staticFeasibility struct {
	candidates []*structs.Node
	metric     *structs.AllocMetric
	// usage[i] is candidates[i]'s entry in planner.usage once loaded:
	// every placement walks every candidate, and a slice index is cheaper
	// than a map lookup by node ID. The entries are the planner's own, so
	// stops and placements show here too.
	usage []*nodeUsage
	// volumes answers for candidates by position when Options.Volumes is
	// a CandidateVolumeChecker; nil otherwise.
	volumes NodeVolumeChecker
}

func (p *planner) staticFor(tg *structs.TaskGroup) (*staticFeasibility, error) {
	if s, ok := p.static[tg.Name]; ok {
		return s, nil
	}
	if err := p.loadNodes(); err != nil {
		return nil, err
	}
	s := &staticFeasibility{metric: &structs.AllocMetric{NodesAvailable: make(map[string]int)}}
	for _, n := range p.nodes {
		s.metric.NodesEvaluated++
		if inDatacenters(p.job.Datacenters, n.Datacenter) && n.Ready() {
			s.metric.NodesAvailable[n.Datacenter]++
		}
		if ok, reason := staticCheck(p.job, tg, n); !ok {
			s.metric.FilterNode(reason)
			continue
		}
		s.candidates = append(s.candidates, n)
	}
	s.usage = make([]*nodeUsage, len(s.candidates))
	if cv, ok := p.opts.Volumes.(CandidateVolumeChecker); ok {
		s.volumes = cv.ForNodes(s.candidates)
	}
	p.static[tg.Name] = s
	return s, nil
}

// fit checks the dynamic feasibility of one node: volumes, then CPU, then
// memory. It records a rejection in m and returns the node's usage when
// the node fits. When s is not nil, n is s.candidates[i], and the node's
// usage and volume answers are taken by position from s.
func (p *planner) fit(n *structs.Node, s *staticFeasibility, i int, tg *structs.TaskGroup, ask structs.Resources, idx int, replacing *structs.Allocation, m *structs.AllocMetric) (*nodeUsage, bool, error) {
	if p.opts.Volumes != nil {
		var (
			ok     bool
			reason string
		)
		if s != nil && s.volumes != nil {
			ok, reason = s.volumes.FeasibleVolumesAt(i, tg, idx, replacing)
		} else {
			ok, reason = p.opts.Volumes.FeasibleVolumes(n, tg, idx, replacing)
		}
		if !ok {
			m.FilterNode(reason)
			return nil, false, nil
		}
	}
	var u *nodeUsage
	if s != nil {
		u = s.usage[i]
	}
	if u == nil {
		var err error
		if u, err = p.usageOf(n); err != nil {
			return nil, false, err
		}
		if s != nil {
			s.usage[i] = u
		}
	}
	if _, reason := assignPorts(n, u, tg); reason != "" {
		m.FilterNode(reason)
		return nil, false, nil
	}
	switch {
	case u.usedCPU+ask.CPU > u.capCPU:
		m.ExhaustedNode(DimensionCPU)
		return nil, false, nil
	case u.usedMem+ask.MemoryMB > u.capMem:
		m.ExhaustedNode(DimensionMemory)
		return nil, false, nil
	}
	return u, true, nil
}

func fraction(x, capacity int) float64 {
	if capacity <= 0 {
		return 1
	}
	return float64(x) / float64(capacity)
}

// score ranks a fitting node: bin-packing minus anti-affinity.
func score(u *nodeUsage, ask structs.Resources, collocated, count int) float64 {
	s := fraction(u.usedCPU+ask.CPU, u.capCPU) + fraction(u.usedMem+ask.MemoryMB, u.capMem)
	if count < 1 {
		count = 1
	}
	return s - antiAffinityWeight*float64(collocated)/float64(count)
}

// selectNode picks the best node for allocation idx of tg, or returns nil
// and the metric explaining why none fits. Nodes are ranked by penalty
// tier (failures of the replaced lineage there, lower first), then score
// (higher first), then node ID (lower first).
func (p *planner) selectNode(tg *structs.TaskGroup, idx int, replacing *structs.Allocation, penalised map[string]int) (*structs.Node, *structs.AllocMetric, error) {
	s, err := p.staticFor(tg)
	if err != nil {
		return nil, nil, err
	}
	m := s.metric.Copy()
	ask := groupAsk(tg)
	key := groupKey(p.job.Namespace, p.job.ID, tg.Name)
	var (
		best      *structs.Node
		bestScore float64
		bestTier  int
	)
	for i, n := range s.candidates {
		u, ok, err := p.fit(n, s, i, tg, ask, idx, replacing, m)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			continue
		}
		sc := score(u, ask, u.groups[key], tg.Count)
		tier := 0
		if len(penalised) > 0 {
			tier = penalised[n.ID]
		}
		// Candidates are walked by ID, so keeping the first of equals
		// makes the lowest node ID the final tie-break.
		if best == nil || tier < bestTier || (tier == bestTier && sc > bestScore) {
			best, bestScore, bestTier = n, sc, tier
		}
	}
	return best, m, nil
}

// place records a new allocation in the plan and in the node's usage.
func (p *planner) place(a *structs.Allocation) {
	p.plan.AppendAlloc(a)
	if u := p.usage[a.NodeID]; u != nil {
		u.add(a)
	}
}

func sortNodes(nodes []*structs.Node) []*structs.Node {
	out := make([]*structs.Node, 0, len(nodes))
	for _, n := range nodes {
		if n != nil {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// sortedAllocs returns allocs ordered by index, then create time, then ID.
func sortedAllocs(allocs []*structs.Allocation) []*structs.Allocation {
	out := append([]*structs.Allocation(nil), allocs...)
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.TaskGroup != b.TaskGroup {
			return a.TaskGroup < b.TaskGroup
		}
		if ai, bi := a.Index(), b.Index(); ai != bi {
			return ai < bi
		}
		if a.CreateTime != b.CreateTime {
			return a.CreateTime < b.CreateTime
		}
		return a.ID < b.ID
	})
	return out
}

func sortStable(list []*structs.Allocation, less func(a, b *structs.Allocation) bool) {
	sort.SliceStable(list, func(i, j int) bool { return less(list[i], list[j]) })
}

// NodeFits is the plan applier's re-check, at apply time, that node can
// still take placing: it must be ready, eligible and not draining, and its
// non-terminal allocations, less those in stopping, plus placing, must fit
// its capacity and hold no host port twice. It returns the reason when it
// cannot.
func NodeFits(n *structs.Node, existing []*structs.Allocation, stopping map[string]bool, placing []*structs.Allocation) (bool, string) {
	switch {
	case n == nil:
		return false, "node no longer exists"
	case n.Status != structs.NodeStatusReady:
		return false, FilterNotReady
	case n.SchedulingEligibility != structs.NodeSchedulingEligible:
		return false, FilterIneligible
	case n.DrainStrategy != nil:
		return false, FilterDraining
	}
	u := newNodeUsage(n)
	for _, a := range existing {
		if !a.TerminalStatus() && !stopping[a.ID] {
			u.add(a)
		}
	}
	for _, a := range placing {
		// A port already held, by the node's allocations or an earlier
		// placement of this plan, is a collision: two schedulers picked
		// it at once.
		for _, p := range a.Ports() {
			if u.ports[p.Value] > 0 {
				return false, structs.PortCollision(p.Label, p.Value)
			}
		}
		u.add(a)
	}
	switch {
	case u.usedCPU > u.capCPU:
		return false, DimensionCPU
	case u.usedMem > u.capMem:
		return false, DimensionMemory
	}
	return true, ""
}
