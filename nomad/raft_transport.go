package nomad

import (
	"github.com/hashicorp/raft"
)

// raftTransport is Raft's network transport without pipelined
// replication.
//
// Raft's pipelined replication can block for good in a pipeline's
// AppendEntries: once the replication's decoder stops (a peer answered
// with a newer term or a refusal, say a follower that a leadership
// transfer made a candidate), the pipeline's queues fill and the send
// waits on a channel that only the pipeline's own Close releases, which
// the stuck goroutine itself was to call. The leader then never
// replicates to that peer again while its heartbeats keep the peer from
// calling an election, and Raft's shutdown waits for the send forever
// (seen here as TestBlocking_StaleReadOnFollower hanging in Shutdown;
// reported against hashicorp/raft as issue #612). Without a pipeline,
// Raft replicates with one AppendEntries at a time, each carrying every
// entry not yet sent, and every send is bounded by the transport's
// timeout.
type raftTransport struct {
	*raft.NetworkTransport
}

var _ raft.WithClose = (*raftTransport)(nil)

func newRaftTransport(t *raft.NetworkTransport) *raftTransport {
	return &raftTransport{NetworkTransport: t}
}

// AppendEntriesPipeline tells Raft to replicate without a pipeline.
func (t *raftTransport) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}
