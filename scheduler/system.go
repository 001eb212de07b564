package scheduler

import (
	"github.com/roamhq/roam/structs"
)

// reconcileSystem is the system scheduler: every group runs once on every
// feasible node. Per group, in job order, stops for all groups first and
// then placements:
//
//   - A live allocation on a down or deregistered node is stopped as lost.
//   - On a draining node it stays when the drain has IgnoreSystemJobs and
//     is stopped ("alloc stopped since its node is draining") otherwise.
//   - On a node no longer in the job's datacenters it is stopped.
//   - A second live allocation of the group on one node is stopped.
//   - A node whose allocation the client reports failed or complete, while
//     the servers still want it running, gets no new one: system jobs are
//     not rescheduled, and the restart policy already ran on the client.
//   - Every node that passes the static checks (datacenter, ready,
//     eligible, not draining, drivers) and holds no live allocation of the
//     group gets one, named "<job>.<group>[0]", if resources and volumes
//     fit. A node that passes the static checks but lacks room is a failed
//     placement (FailedTGAllocs, Blocked); other nodes are simply not
//     wanted. Ineligible nodes keep the allocations they have.
func (p *planner) reconcileSystem(allocs []*structs.Allocation) error {
	if err := p.loadNodes(); err != nil {
		return err
	}
	byGroup := make(map[string][]*structs.Allocation)
	for _, a := range sortedByNode(allocs) {
		if p.job.LookupTaskGroup(a.TaskGroup) == nil {
			if !a.TerminalStatus() {
				p.stop(a, structs.AllocDesiredStatusStop, AllocDescNotNeeded, "")
			}
			continue
		}
		byGroup[a.TaskGroup] = append(byGroup[a.TaskGroup], a)
	}
	occupied := make(map[string]map[string]bool, len(p.job.TaskGroups))
	for _, tg := range p.job.TaskGroups {
		occ, err := p.systemStops(byGroup[tg.Name])
		if err != nil {
			return err
		}
		occupied[tg.Name] = occ
	}
	for _, tg := range p.job.TaskGroups {
		if err := p.systemPlace(tg, occupied[tg.Name]); err != nil {
			return err
		}
	}
	return nil
}

// systemStops stops the group's allocations that must go and returns the
// nodes that must not get a new one.
func (p *planner) systemStops(allocs []*structs.Allocation) (map[string]bool, error) {
	occupied := make(map[string]bool)
	for _, a := range allocs {
		if a.DesiredStatus == structs.AllocDesiredStatusStop || a.DesiredStatus == structs.AllocDesiredStatusEvict {
			continue
		}
		switch a.ClientStatus {
		case structs.AllocClientStatusFailed, structs.AllocClientStatusComplete:
			occupied[a.NodeID] = true
			continue
		case structs.AllocClientStatusLost:
			continue
		}
		n, err := p.node(a.NodeID)
		if err != nil {
			return nil, err
		}
		switch {
		case n == nil || n.Status == structs.NodeStatusDown:
			p.stop(a, structs.AllocDesiredStatusStop, AllocDescLost, structs.AllocClientStatusLost)
		case n.DrainStrategy != nil && !n.DrainStrategy.IgnoreSystemJobs && a.DesiredTransition.ShouldMigrate():
			// The drainer marks system allocations last, once the node's
			// other allocations are gone and their volumes released (a CSI
			// plugin among them must outlive those).
			p.stop(a, structs.AllocDesiredStatusStop, AllocDescNodeDraining, "")
		case !inDatacenters(p.job.Datacenters, n.Datacenter):
			p.stop(a, structs.AllocDesiredStatusStop, AllocDescNotInNodeSet, "")
		case occupied[a.NodeID]:
			p.stop(a, structs.AllocDesiredStatusStop, AllocDescDuplicate, "")
		default:
			occupied[a.NodeID] = true
		}
	}
	return occupied, nil
}

func (p *planner) systemPlace(tg *structs.TaskGroup, occupied map[string]bool) error {
	ask := groupAsk(tg)
	for _, n := range p.nodes {
		if occupied[n.ID] {
			continue
		}
		if ok, _ := staticCheck(p.job, tg, n); !ok {
			continue
		}
		m := &structs.AllocMetric{NodesEvaluated: 1, NodesAvailable: map[string]int{n.Datacenter: 1}}
		_, ok, err := p.fit(n, nil, 0, tg, ask, 0, nil, m)
		if err != nil {
			return err
		}
		if !ok {
			p.recordFailure(tg.Name, m)
			continue
		}
		p.place(p.newAlloc(tg, 0, n))
	}
	return nil
}

// sortedByNode orders allocations by node, then age, then ID.
func sortedByNode(allocs []*structs.Allocation) []*structs.Allocation {
	out := sortedAllocs(allocs)
	sortStable(out, func(a, b *structs.Allocation) bool {
		if a.NodeID != b.NodeID {
			return a.NodeID < b.NodeID
		}
		if a.CreateTime != b.CreateTime {
			return a.CreateTime < b.CreateTime
		}
		return a.ID < b.ID
	})
	return out
}
