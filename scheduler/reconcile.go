package scheduler

import (
	"sort"
	"time"

	"github.com/roamhq/roam/structs"
)

// slotKind is the role an existing allocation plays in its group.
type slotKind int

// Kinds in the order duplicates of one index are preferred: when two
// allocations claim an index the one with the lower kind keeps it.
const (
	slotRunning         slotKind = iota // live, client running
	slotPending                         // live, client pending
	slotMigrate                         // live, drain asked it to move
	slotFailedDone                      // failed, no more reschedules
	slotComplete                        // batch, finished successfully
	slotRescheduleLater                 // failed, delay not yet passed
	slotRescheduleNow                   // failed, replace in this plan
	slotLost                            // live on a down or missing node
)

func (k slotKind) live() bool { return k == slotRunning || k == slotPending || k == slotMigrate }

// slot is an existing allocation that holds an index of its group.
type slot struct {
	alloc *structs.Allocation
	idx   int
	kind  slotKind
	// at and delay come from the reschedule decision.
	at    time.Time
	delay time.Duration
}

// placement is a new allocation to find a node for.
type placement struct {
	tg  *structs.TaskGroup
	idx int
	// prev is the allocation replaced, if any; prevUpdate is the plan's
	// copy of it (a stop in NodeUpdate or a field update in
	// NodeAllocation) that gets NextAllocation once placed.
	prev       *structs.Allocation
	prevUpdate *structs.Allocation
	// event, when set, is appended to the reschedule tracker.
	event     *structs.RescheduleEvent
	penalised map[string]int
}

// reconcileGeneric is the service and batch scheduler. All stops of every
// group are decided first, so that the capacity they free is seen by the
// placements that follow.
func (p *planner) reconcileGeneric(allocs []*structs.Allocation) error {
	byGroup := make(map[string][]*structs.Allocation)
	for _, a := range sortedAllocs(allocs) {
		if p.job.LookupTaskGroup(a.TaskGroup) == nil {
			if !a.TerminalStatus() {
				p.stop(a, structs.AllocDesiredStatusStop, AllocDescNotNeeded, "")
			}
			continue
		}
		byGroup[a.TaskGroup] = append(byGroup[a.TaskGroup], a)
	}
	var places []*placement
	for _, tg := range p.job.TaskGroups {
		ps, err := p.reconcileGroup(tg, byGroup[tg.Name])
		if err != nil {
			return err
		}
		places = append(places, ps...)
	}
	for _, pl := range places {
		if err := p.placeOne(pl); err != nil {
			return err
		}
	}
	return nil
}

// reconcileGroup stops what must stop and returns what must be placed, by
// these rules, in order:
//
//  1. Allocations the servers already stopped are history only. Failed
//     ones already replaced (NextAllocation set, or named as another's
//     PreviousAllocation) too. Complete ones are done for batch (they keep
//     their index, never replaced) and free their index for service.
//  2. Every other allocation holds its index as a slot: live (pending or
//     running), migrate (live with DesiredTransition.Migrate), lost (live
//     on a down or deregistered node), failed to reschedule now, later, or
//     never (policy exhausted), or batch-complete.
//  3. Two slots on one index: the better kind keeps it (running, pending,
//     migrate, failed-done, complete, reschedule-later, reschedule-now,
//     lost), then the older allocation; a losing live allocation is
//     stopped.
//  4. More slots than Count: the highest indexes go first. Live ones are
//     stopped; failed ones are not rescheduled.
//  5. Lost slots are stopped with client status lost and replaced at their
//     index. Failed slots are rescheduled or get a follow-up evaluation.
//  6. Migrations: see migrationsAllowed. The allowed number of migrate
//     slots, lowest index first, are stopped ("alloc is being migrated")
//     and replaced at their index.
//  7. Fewer slots than Count: the lowest free indexes are placed.
func (p *planner) reconcileGroup(tg *structs.TaskGroup, allocs []*structs.Allocation) ([]*placement, error) {
	replaced := make(map[string]bool)
	for _, a := range allocs {
		if a.PreviousAllocation != "" {
			replaced[a.PreviousAllocation] = true
		}
	}
	batch := p.job.Type == structs.JobTypeBatch

	var slots []*slot
	for _, a := range allocs {
		if a.DesiredStatus == structs.AllocDesiredStatusStop || a.DesiredStatus == structs.AllocDesiredStatusEvict {
			continue
		}
		s := &slot{alloc: a, idx: a.Index()}
		switch a.ClientStatus {
		case structs.AllocClientStatusComplete:
			if !batch {
				continue
			}
			s.kind = slotComplete
		case structs.AllocClientStatusFailed:
			if a.NextAllocation != "" || replaced[a.ID] {
				continue
			}
			kind, at, delay := decideReschedule(a, tg.ReschedulePolicy, p.opts.Now)
			switch kind {
			case rescheduleNone:
				s.kind = slotFailedDone
			case rescheduleNow:
				s.kind = slotRescheduleNow
			case rescheduleLater:
				s.kind = slotRescheduleLater
			}
			s.at, s.delay = at, delay
		case structs.AllocClientStatusLost:
			continue
		default:
			n, err := p.node(a.NodeID)
			if err != nil {
				return nil, err
			}
			switch {
			case n == nil || n.Status == structs.NodeStatusDown:
				s.kind = slotLost
			case a.DesiredTransition.ShouldMigrate():
				s.kind = slotMigrate
			case a.ClientStatus == structs.AllocClientStatusRunning:
				s.kind = slotRunning
			default:
				s.kind = slotPending
			}
		}
		slots = append(slots, s)
	}

	// Rule 3: one slot per index. allocs are sorted by index then age, so
	// a stable sort by kind within an index keeps the older of equals.
	sort.SliceStable(slots, func(i, j int) bool {
		if slots[i].idx != slots[j].idx {
			return slots[i].idx < slots[j].idx
		}
		return slots[i].kind < slots[j].kind
	})
	kept := slots[:0:0]
	for i, s := range slots {
		if i > 0 && slots[i-1].idx == s.idx {
			p.drop(s, AllocDescDuplicate)
			continue
		}
		kept = append(kept, s)
	}
	slots = kept

	// Rule 4: trim from the top; slots are sorted by index.
	count := max(tg.Count, 0)
	for len(slots) > count {
		p.drop(slots[len(slots)-1], AllocDescNotNeeded)
		slots = slots[:len(slots)-1]
	}

	// Rule 5.
	var places []*placement
	var migrate []*slot
	for _, s := range slots {
		a := s.alloc
		switch s.kind {
		case slotLost:
			c := p.stop(a, structs.AllocDesiredStatusStop, AllocDescLost, structs.AllocClientStatusLost)
			places = append(places, &placement{tg: tg, idx: s.idx, prev: a, prevUpdate: c})
		case slotRescheduleNow:
			c := a.Copy()
			c.ModifyTime = p.now
			places = append(places, &placement{
				tg: tg, idx: s.idx, prev: a, prevUpdate: c,
				event: &structs.RescheduleEvent{
					RescheduleTime: p.now,
					PrevAllocID:    a.ID,
					PrevNodeID:     a.NodeID,
					Delay:          s.delay,
				},
				penalised: penalisedNodes(a),
			})
		case slotRescheduleLater:
			p.scheduleFollowup(a, s.at)
		case slotMigrate:
			migrate = append(migrate, s)
		}
	}

	// Rule 6.
	allowed := p.migrationsAllowed(tg, allocs)
	for _, s := range migrate {
		if allowed <= 0 {
			break
		}
		allowed--
		c := p.stop(s.alloc, structs.AllocDesiredStatusStop, AllocDescMigrating, "")
		places = append(places, &placement{tg: tg, idx: s.idx, prev: s.alloc, prevUpdate: c})
	}

	// Rule 7.
	used := make(map[int]bool, len(slots))
	for _, s := range slots {
		used[s.idx] = true
	}
	for idx := 0; len(used) < count; idx++ {
		if used[idx] {
			continue
		}
		used[idx] = true
		places = append(places, &placement{tg: tg, idx: idx, prev: unreplacedAt(allocs, idx, replaced)})
	}
	sort.SliceStable(places, func(i, j int) bool { return places[i].idx < places[j].idx })
	return places, nil
}

// drop removes a slot: a live allocation is stopped with desc, a lost one
// is stopped as lost, and a failed or complete one is left as it is.
func (p *planner) drop(s *slot, desc string) {
	switch {
	case s.kind.live():
		p.stop(s.alloc, structs.AllocDesiredStatusStop, desc, "")
	case s.kind == slotLost:
		p.stop(s.alloc, structs.AllocDesiredStatusStop, AllocDescLost, structs.AllocClientStatusLost)
	}
}

// migrationsAllowed is how many more of the group's allocations may start
// migrating in this plan: max_parallel minus those in flight.
//
// A migration is in flight while its replacement has not started: an
// allocation counts when it is live (not terminal, not stopped by this
// plan), its client status is still pending, and its PreviousAllocation is
// an allocation of the group that carries DesiredTransition.Migrate. An
// allocation waiting to migrate (Migrate set, not yet stopped) does not
// count: counting it would let no migration ever start. The stop of the
// old allocation is not waited for; it is already desired-stop.
//
// max_parallel comes from the group's migrate block; a missing block or a
// value below 1 means 1, so a drain always makes progress.
func (p *planner) migrationsAllowed(tg *structs.TaskGroup, allocs []*structs.Allocation) int {
	maxParallel := 1
	if tg.Migrate != nil && tg.Migrate.MaxParallel > 1 {
		maxParallel = tg.Migrate.MaxParallel
	}
	migrated := make(map[string]bool)
	for _, a := range allocs {
		if a.DesiredTransition.ShouldMigrate() {
			migrated[a.ID] = true
		}
	}
	inFlight := 0
	for _, a := range allocs {
		if !a.TerminalStatus() && !p.stopped[a.ID] &&
			a.ClientStatus == structs.AllocClientStatusPending && migrated[a.PreviousAllocation] {
			inFlight++
		}
	}
	return maxParallel - inFlight
}

// unreplacedAt finds the allocation a fresh placement at idx stands in
// for: one the servers stopped because it was lost or migrating, that no
// allocation replaces yet (its own replacement found no node). Linking it
// keeps the lineage and lets the migration count in flight.
func unreplacedAt(allocs []*structs.Allocation, idx int, replaced map[string]bool) *structs.Allocation {
	var found *structs.Allocation
	for _, a := range allocs {
		if a.Index() != idx || replaced[a.ID] || a.NextAllocation != "" || a.DesiredStatus != structs.AllocDesiredStatusStop {
			continue
		}
		if a.DesiredTransition.ShouldMigrate() || a.ClientStatus == structs.AllocClientStatusLost {
			found = a // allocs are sorted oldest first: keep the newest
		}
	}
	return found
}

// placeOne finds a node for pl and adds the allocation to the plan, or
// records why no node fits.
func (p *planner) placeOne(pl *placement) error {
	node, metric, err := p.selectNode(pl.tg, pl.idx, pl.prev, pl.penalised)
	if err != nil {
		return err
	}
	if node == nil {
		p.recordFailure(pl.tg.Name, metric)
		return nil
	}
	a := p.newAlloc(pl.tg, pl.idx, node)
	if pl.prev != nil {
		a.PreviousAllocation = pl.prev.ID
		var events []*structs.RescheduleEvent
		if pl.prev.RescheduleTracker != nil {
			events = append(events, pl.prev.RescheduleTracker.Events...)
		}
		if pl.event != nil {
			events = append(events, pl.event)
		}
		if len(events) > 0 {
			a.RescheduleTracker = &structs.RescheduleTracker{Events: events}
		}
	}
	p.place(a)
	if pl.prevUpdate != nil {
		pl.prevUpdate.NextAllocation = a.ID
		if pl.event != nil {
			// A rescheduled alloc stays failed and desired-run; its
			// NextAllocation is recorded by a field update.
			p.plan.AppendAlloc(pl.prevUpdate)
		}
	}
	return nil
}
