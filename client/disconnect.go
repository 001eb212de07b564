package client

import (
	"fmt"
	"time"

	"github.com/roamhq/roam/structs"
)

// StopMargin is the room left between the moment a cut-off client's
// claim-holding tasks are dead and the moment the servers may free their
// claims: the node unpublish, clock drift between machines, and a check
// interval.
const StopMargin = 2 * time.Second

// StopWindow returns how long after its last successful heartbeat a client
// may wait before it kills its claim-holding allocations, given the
// configured stopAfter, the servers' freeAfter (0 if not yet known) and
// the longest kill timeout among those allocations' tasks. The windows
// must nest:
//
//	stop + longest kill timeout + StopMargin < free
//
// When the configured value does not fit, the largest one that does is
// returned with fits false, so that the client stays safe and says why.
// A stopAfter of 0 means never: it returns 0 and enabled false.
func StopWindow(stopAfter, freeAfter, longestKill time.Duration) (stop time.Duration, enabled, fits bool) {
	if stopAfter <= 0 {
		return 0, false, true
	}
	if freeAfter <= 0 {
		return stopAfter, true, true
	}
	limit := freeAfter - longestKill - StopMargin
	if stopAfter < limit {
		return stopAfter, true, true
	}
	return max(limit-time.Millisecond, 0), true, false
}

// outageStop is how long after the last contact outageWatch stops the
// claim-holding allocations: StopWindow's, but never less than a heartbeat
// TTL (a healthy client goes up to a TTL between two heartbeats; servers
// whose window leaves no room for that are misconfigured, and fits says
// so). With fromDisk, the last contact is from before this client
// started: it was down, its tasks running on, and stop_on_client_after
// may be behind it already. Its first heartbeat may show that nothing is
// wrong, so it gets the time the servers' window still leaves (free, less
// the kill timeout and the margin), and no more.
func outageStop(stopAfter, free, longest, ttl time.Duration, fromDisk bool) (time.Duration, bool) {
	stop, _, fits := StopWindow(stopAfter, free, longest)
	if fromDisk && free > 0 {
		stop = max(stop, free-longest-StopMargin)
	}
	return max(stop, ttl), fits
}

// outageWatch stops the claim-holding allocations once no server has been
// reached for the stop window. It runs until shutdown.
func (c *Client) outageWatch() {
	if c.config.StopOnClientAfter <= 0 {
		c.logger.Warn("stop_on_client_after is 0: a client cut off from the servers keeps its volume writers running " +
			"after the servers have freed their claims")
		return
	}
	tick := min(c.config.StopOnClientAfter/4, time.Second)
	t := time.NewTicker(max(tick, 50*time.Millisecond))
	defer t.Stop()
	var warnedFor time.Duration
	for {
		select {
		case <-c.shutdownCtx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		last, free, ttl, stopped, fromDisk := c.lastContact, c.freeClaimsAfter, c.heartbeatTTL, c.outageStopped, c.contactFromDisk
		c.mu.Unlock()
		if last.IsZero() || stopped {
			continue
		}
		longest := c.allocs.longestVolumeKillTimeout()
		stop, fits := outageStop(c.config.StopOnClientAfter, free, longest, ttl, fromDisk)
		if !fits && warnedFor != free+longest {
			warnedFor = free + longest
			c.logger.Error("stop_on_client_after does not fit inside the servers' claim window; stopping sooner",
				"stop_on_client_after", c.config.StopOnClientAfter, "longest_kill_timeout", longest,
				"margin", StopMargin, "servers_free_claims_after", free, "stopping_after", stop)
		}
		since := time.Since(last)
		if since < stop {
			continue
		}
		c.mu.Lock()
		if c.lastContact != last { // a heartbeat got through meanwhile
			c.mu.Unlock()
			continue
		}
		c.outageStopped = true
		c.mu.Unlock()
		reason := fmt.Sprintf("no server reached for %s (stop_on_client_after %s)", since.Round(time.Millisecond), stop)
		ids := c.allocs.stopVolumeHolders(reason)
		c.logger.Warn("cut off from the servers; stopped allocations holding volume claims",
			"since_last_heartbeat", since.Round(time.Millisecond), "allocs", ids)
	}
}

// controllerLease is until when a leader's controller call may run on
// this client: the servers' window from the last heartbeat that got
// through (counted from when it was sent, so from no later than the
// servers armed their timer) to the earliest moment they may declare
// the node down, less a margin for the cancel to reach the plugin. The
// zero time while that window is not known.
//
// Like outageStop it is never less than the heartbeat TTL: the leader
// that handed out the TTL waits at least that long, plus its grace. A
// new leader waits its failover TTL; servers whose failover TTL is below
// the TTL they hand out would declare healthy nodes down, and are
// misconfigured (outageWatch says so).
func (c *Client) controllerLease() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return controllerLease(c.lastContact, c.freeClaimsAfter, c.heartbeatTTL)
}

// controllerLease is Client.controllerLease's rule.
func controllerLease(last time.Time, free, ttl time.Duration) time.Time {
	if last.IsZero() || free <= 0 {
		return time.Time{}
	}
	return last.Add(max(free-min(StopMargin, free/4), ttl))
}

// noteContact records a heartbeat sent at sent that succeeded, and
// reports false, changing nothing, when one sent later was recorded
// already (the heartbeat loop and renewLease can overlap).
func (c *Client) noteContact(sent time.Time, resp *structs.NodeUpdateResponse) bool {
	// The term may be written to the state DB: not under c.mu.
	if resp.LeaderTermResetFrom != 0 {
		c.csi.resetTerm(resp.LeaderTermResetFrom, resp.LeaderTerm)
	} else {
		c.csi.learnTerm(resp.LeaderTerm)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if sent.Before(c.lastContact) && !c.contactFromDisk {
		return false
	}
	c.csi.SetMinServerVersion(resp.MinServerVersion)
	c.lastContact, c.contactFromDisk = sent, false
	if resp.FreeClaimsAfter > 0 {
		c.freeClaimsAfter = resp.FreeClaimsAfter
	}
	if c.outageStopped {
		c.outageStopped = false
		c.logger.Info("servers reached again; allocations stopped during the outage stay stopped")
	}
	return true
}

// holdsVolumes reports whether the allocation's group asks for a CSI
// volume.
func holdsVolumes(a *structs.Allocation) bool {
	if a == nil || a.Job == nil {
		return false
	}
	tg := a.Job.LookupTaskGroup(a.TaskGroup)
	if tg == nil {
		return false
	}
	for _, v := range tg.Volumes {
		if v != nil && v.Type == "csi" {
			return true
		}
	}
	return false
}

// volumeHolders returns the runners whose allocations hold CSI volumes and
// still have a task that is not dead.
func (m *allocManager) volumeHolders() []*allocRunner {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*allocRunner
	for _, ar := range m.runners {
		if holdsVolumes(ar.Alloc()) && !ar.allDead() {
			out = append(out, ar)
		}
	}
	return out
}

// longestVolumeKillTimeout is the longest kill timeout of any task of an
// allocation that holds volumes.
func (m *allocManager) longestVolumeKillTimeout() time.Duration {
	var longest time.Duration
	for _, ar := range m.volumeHolders() {
		for _, tr := range ar.tasks {
			longest = max(longest, tr.killTimeout())
		}
	}
	return longest
}

// stopVolumeHolders kills every allocation that holds volumes; each one's
// runner then unpublishes its volumes once its tasks are dead. The runner
// stays, so later answers from the servers that still want it running do
// not start it again (allocManager.reconcile only updates a known
// runner).
func (m *allocManager) stopVolumeHolders(reason string) []string {
	var ids []string
	for _, ar := range m.volumeHolders() {
		ids = append(ids, ar.id)
		ar.stopOnOwn(reason)
	}
	return ids
}
