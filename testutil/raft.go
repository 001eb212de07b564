package testutil

import (
	"time"

	"github.com/hashicorp/raft"
)

// loneElection is the heartbeat and election timeout of a server that
// bootstraps alone. Raft makes a follower wait one to two heartbeat
// timeouts before it stands; a lone voter then wins at once, so that wait
// is all a test pays for its leader.
const loneElection = 20 * time.Millisecond

// LoneServerTimers shortens rc's heartbeat and election timeouts and its
// leader lease, for a server that bootstraps alone (bootstrap_expect = 1,
// no retry_join). Its first election then takes tens of milliseconds
// rather than the hundreds the cluster timers cost. A lone voter never
// loses its lease: it is the quorum. Do not use it for a server others
// join: with timers this short a loaded machine makes a leader of a real
// cluster step down.
func LoneServerTimers(rc *raft.Config) {
	rc.HeartbeatTimeout = loneElection
	rc.ElectionTimeout = loneElection
	rc.LeaderLeaseTimeout = loneElection
}
