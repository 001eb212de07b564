package nomad

import (
	"sort"
	"time"

	"github.com/roamhq/roam/structs"
)

// drainStopDescription is the desired description of an allocation a drain
// stops rather than migrates.
const drainStopDescription = "alloc stopped: node drain reached its deadline"

// drainInput is what one drain pass knows about one draining node. It is
// read from a state snapshot by the server; planDrain decides from it alone.
type drainInput struct {
	// Strategy is the node's drain in progress; never nil.
	Strategy *structs.DrainStrategy
	// Allocs are every allocation on the node, terminal ones included, in
	// the store's order.
	Allocs []*structs.Allocation
	// Jobs holds the current version of each allocation's job where the
	// store still has it; an allocation's own copy stands in otherwise.
	Jobs map[jobKey]*structs.Job
	// Claims are the volume claims, in any state, that name the node.
	Claims []drainClaim
	// ClaimGrace is how long past a forced drain's start the node's system
	// allocations wait for claims to go (Config.DrainClaimGrace).
	ClaimGrace time.Duration
	// Now is the pass's clock.
	Now time.Time
}

// drainClaim is a volume claim that names the draining node.
type drainClaim struct {
	VolumeID string
	AllocID  string
}

// drainPlan is what one drain pass does to one node.
type drainPlan struct {
	// Migrate are the IDs of allocations to mark for migration.
	Migrate []string
	// Stop are updated copies of allocations to stop now.
	Stop []*structs.Allocation
	// Evaluate are the jobs that need an evaluation, one each, by
	// namespace then ID.
	Evaluate []*structs.Job
	// Complete means nothing is left to move: the drain ends.
	Complete bool
	// System says what happens to the node's system allocations.
	System systemVerdict
	// ClaimVolumes are the volumes whose claims of other allocations name
	// the node, when System is systemWaitClaims or systemForced.
	ClaimVolumes []string
}

// systemVerdict is what a drain pass does with a node's system
// allocations, which go last because the node's CSI plugins are among them.
type systemVerdict int

const (
	// systemNone: there are none to drain (none live, or the drain
	// ignores them).
	systemNone systemVerdict = iota
	// systemWaitAllocs: other allocations on the node are not yet
	// client-terminal.
	systemWaitAllocs
	// systemWaitClaims: claims of other allocations still name the node,
	// and their release needs the node's plugins.
	systemWaitClaims
	// systemDrain: nothing holds them back.
	systemDrain
	// systemForced: claims still name the node, but the drain is forced
	// and its claim grace is over.
	systemForced
)

func (v systemVerdict) String() string {
	switch v {
	case systemNone:
		return "none"
	case systemWaitAllocs:
		return "wait-allocs"
	case systemWaitClaims:
		return "wait-claims"
	case systemDrain:
		return "drain"
	case systemForced:
		return "forced"
	}
	return "unknown"
}

// planDrain decides one drain pass over one node. It reads nothing but its
// input and changes nothing in it.
//
// Every allocation not yet client-terminal is "remaining", including one
// the servers already asked to stop: its task may still be running, and
// still using its volume. Non-system allocations are marked for migration,
// or stopped at once when the drain is forced (a negative deadline, or its
// force deadline has come). System allocations go last: among them are the
// node's CSI plugins, through which the volumes of the allocations that
// just left must still be unpublished. So they are drained only once every
// other allocation is client-terminal and no claim of another allocation
// names the node; a forced drain waits for those claims ClaimGrace at most,
// so a claim that cannot be released does not hold the drain forever. The
// drain is complete once nothing remains.
func planDrain(in drainInput) drainPlan {
	d := in.Strategy
	force := drainForced(d, in.Now)

	var (
		plan      drainPlan
		remaining int
		system    []*structs.Allocation
		jobs      = make(map[jobKey]*structs.Job)
	)
	drain := func(a *structs.Allocation) {
		if a.DesiredStatus != structs.AllocDesiredStatusRun {
			return // already stopping; wait for the client
		}
		switch {
		case force:
			c := a.Copy()
			c.DesiredStatus = structs.AllocDesiredStatusStop
			c.DesiredDescription = drainStopDescription
			c.ModifyTime = in.Now.UnixNano()
			t := true
			c.DesiredTransition.Migrate = &t
			plan.Stop = append(plan.Stop, c)
		case !a.DesiredTransition.ShouldMigrate():
			plan.Migrate = append(plan.Migrate, a.ID)
		default:
			return // already marked; the scheduler moves it
		}
		job := a.Job
		if current := in.Jobs[jobKey{a.Namespace, a.JobID}]; current != nil {
			job = current
		}
		if job != nil {
			jobs[jobKey{job.Namespace, job.ID}] = job
		}
	}

	for _, a := range in.Allocs {
		if a.ClientTerminalStatus() {
			continue
		}
		if a.Job != nil && a.Job.Type == structs.JobTypeSystem {
			if !d.IgnoreSystemJobs {
				remaining++
				system = append(system, a)
			}
			continue
		}
		remaining++
		drain(a)
	}

	switch {
	case len(system) == 0:
		plan.System = systemNone
	case remaining > len(system):
		plan.System = systemWaitAllocs
	default:
		own := make(map[string]bool, len(system))
		for _, a := range system {
			own[a.ID] = true
		}
		plan.ClaimVolumes = claimVolumes(in.Claims, own)
		switch {
		case len(plan.ClaimVolumes) == 0:
			plan.System = systemDrain
		case force && in.Now.Sub(forcedAt(d)) > in.ClaimGrace:
			plan.System = systemForced
		default:
			plan.System = systemWaitClaims
		}
		if plan.System != systemWaitClaims {
			for _, a := range system {
				drain(a)
			}
		}
	}

	for _, job := range jobs {
		plan.Evaluate = append(plan.Evaluate, job)
	}
	sort.Slice(plan.Evaluate, func(i, j int) bool {
		a, b := plan.Evaluate[i], plan.Evaluate[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.ID < b.ID
	})
	plan.Complete = remaining == 0
	return plan
}

// drainForced reports whether a drain stops what is left rather than
// migrating it: forced from the outset, or past its force deadline.
func drainForced(d *structs.DrainStrategy, now time.Time) bool {
	return d.Deadline < 0 || (!d.ForceDeadline.IsZero() && !now.Before(d.ForceDeadline))
}

// forcedAt is when a drain began forcing: its deadline, or its start for a
// drain forced from the outset.
func forcedAt(d *structs.DrainStrategy) time.Time {
	if d.Deadline < 0 || d.ForceDeadline.IsZero() {
		return d.StartedAt
	}
	return d.ForceDeadline
}

// claimVolumes returns, sorted and once each, the volumes with a claim of
// an allocation not in except; nil if there are none.
func claimVolumes(claims []drainClaim, except map[string]bool) []string {
	seen := make(map[string]bool)
	var out []string
	for _, c := range claims {
		if except[c.AllocID] || seen[c.VolumeID] {
			continue
		}
		seen[c.VolumeID] = true
		out = append(out, c.VolumeID)
	}
	sort.Strings(out)
	return out
}
