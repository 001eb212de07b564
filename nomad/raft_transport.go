package nomad

import (
	"sync"

	"github.com/hashicorp/raft"
)

// raftTransport is a Raft transport (the network transport, or the
// in-memory one in unit tests) without pipelined
// replication, and with every incoming Raft RPC vetted before Raft sees
// it.
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
//
// A server's probe for a connection (linkProbe) is answered here, once
// vetted, and never reaches Raft.
//
// Anyone who can open the RPC port can write a Raft frame; vet refuses
// the ones whose sender is not a server this one trusts (see
// peer_trust.go), answering with the error and never handing them to
// Raft, so a refused AppendEntries neither changes the term nor appends
// an entry.
type raftTransport struct {
	RaftTransport

	// vet returns nil for an RPC Raft may see; nil vet lets every RPC
	// through (unit tests that build a bare transport).
	vet func(raft.RPC) error

	consumeCh chan raft.RPC
	// hbMu guards heartbeat: Raft's heartbeat handler, which the relay
	// calls itself for a transport that has no fast path of its own
	// (raft.InmemTransport), so that a follower's run loop, busy with
	// entries or starved of CPU, does not delay its answer to a heartbeat
	// past the leader's lease.
	hbMu      sync.Mutex
	heartbeat func(raft.RPC)
	startOnce sync.Once
	closeOnce sync.Once
	done      chan struct{}
	wg        sync.WaitGroup
}

var _ raft.WithClose = (*raftTransport)(nil)

// RaftTransport is what the server needs of a Raft transport: Raft's
// network transport in production, raft.InmemTransport in unit tests.
type RaftTransport interface {
	raft.Transport
	raft.WithClose
}

var (
	_ RaftTransport = (*raft.NetworkTransport)(nil)
	_ RaftTransport = (*raft.InmemTransport)(nil)
)

func newRaftTransport(t RaftTransport, vet func(raft.RPC) error) *raftTransport {
	return &raftTransport{
		RaftTransport: t,
		vet:           vet,
		consumeCh:     make(chan raft.RPC),
		done:          make(chan struct{}),
	}
}

// AppendEntriesPipeline tells Raft to replicate without a pipeline.
func (t *raftTransport) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

// Consumer returns the vetted RPCs. The relay from the inner transport
// starts with the first call and stops on Close.
func (t *raftTransport) Consumer() <-chan raft.RPC {
	if t.vet == nil {
		return t.RaftTransport.Consumer()
	}
	t.startOnce.Do(func() {
		t.wg.Add(1)
		go t.relay()
	})
	return t.consumeCh
}

func (t *raftTransport) relay() {
	defer t.wg.Done()
	in := t.RaftTransport.Consumer()
	for {
		select {
		case rpc := <-in:
			if err := t.vet(rpc); err != nil {
				rpc.Respond(nil, err)
				continue
			}
			if isLinkProbe(rpc) {
				rpc.Respond(&raft.AppendEntriesResponse{}, nil)
				continue
			}
			if hb := t.heartbeatHandler(); hb != nil && isHeartbeat(rpc) {
				hb(rpc)
				continue
			}
			select {
			case t.consumeCh <- rpc:
			case <-t.done:
				rpc.Respond(nil, raft.ErrTransportShutdown)
				return
			}
		case <-t.done:
			return
		}
	}
}

// SetHeartbeatHandler vets heartbeats too: the network transport hands
// them to Raft on a fast path that skips Consumer, and a heartbeat with a
// higher term is enough to depose a leader.
func (t *raftTransport) SetHeartbeatHandler(cb func(raft.RPC)) {
	if _, inmem := t.RaftTransport.(*raft.InmemTransport); inmem && t.vet != nil {
		// The relay vets, then calls cb itself.
		t.hbMu.Lock()
		t.heartbeat = cb
		t.hbMu.Unlock()
		return
	}
	if t.vet == nil || cb == nil {
		t.RaftTransport.SetHeartbeatHandler(cb)
		return
	}
	t.RaftTransport.SetHeartbeatHandler(func(rpc raft.RPC) {
		if err := t.vet(rpc); err != nil {
			rpc.Respond(nil, err)
			return
		}
		cb(rpc)
	})
}

// Close stops the relay, then the inner transport.
func (t *raftTransport) Close() error {
	t.closeOnce.Do(func() { close(t.done) })
	err := t.RaftTransport.Close()
	t.wg.Wait()
	return err
}

func (t *raftTransport) heartbeatHandler() func(raft.RPC) {
	t.hbMu.Lock()
	defer t.hbMu.Unlock()
	return t.heartbeat
}

// isHeartbeat reports whether rpc is a leader's heartbeat: an
// AppendEntries that carries no entries, no previous entry and no commit
// index, only the leader's term and identity.
func isHeartbeat(rpc raft.RPC) bool {
	req, ok := rpc.Command.(*raft.AppendEntriesRequest)
	return ok && req.Term != 0 && len(req.Entries) == 0 &&
		req.PrevLogEntry == 0 && req.PrevLogTerm == 0 && req.LeaderCommitIndex == 0
}
