package nomad

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	memdb "github.com/hashicorp/go-memdb"
	metrics "github.com/hashicorp/go-metrics"
	"github.com/hashicorp/raft"
	"github.com/roamhq/roam/nomad/readgate"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// forward sends a request to the leader unless this server should answer it:
// it is the leader, or the request is a stale read and this server has
// caught up since it started (see staleReadable). It reports whether the
// request was handled (forwarded, or failed). While there is no leader it
// waits up to the hold timeout, then fails with ErrNoLeader.
func (s *Server) forward(method string, info structs.RPCInfo, args, reply any) (bool, error) {
	if r := info.RequestRegion(); r != "" && r != s.config.Region {
		return true, fmt.Errorf("%w: %q (this cluster is %q)", structs.ErrWrongRegion, r, s.config.Region)
	}
	if info.IsRead() && info.AllowStaleRead() && s.staleReadable() {
		return false, nil
	}
	// A server that shuts down lets the writes it holds reach the next
	// leader first (see Shutdown). Reads are safe to resend and may block
	// for minutes, so they are not waited for.
	if !info.IsRead() {
		s.forwarding.add()
		defer s.forwarding.done()
	}

	caller := callerContext(args)
	hold := time.NewTimer(s.config.RPCHoldTimeout)
	defer hold.Stop()
	for {
		changed := s.leaderChanged()
		if s.IsLeader() {
			if s.heartbeats.running() {
				return false, nil
			}
			// Raft elected us but the leader's duties are still starting:
			// hold the request, as a follower would while there is no
			// leader, rather than fail it.
		}
		leaderAddr, _ := s.Leader()
		if leaderAddr != "" && leaderAddr != s.advertise {
			metrics.IncrCounter([]string{"rpc", "forward"}, 1)
			err := s.forwardTo(caller, leaderAddr, method, info, args, reply)
			if !forwardRetryable(err) {
				return true, err
			}
			// The leader was unreachable, or answered that it is stepping
			// down before applying anything: wait for the next one. A
			// read abandoned because the leader moved may have waited long
			// at the old one; the wait for the new one starts now.
			if errors.Is(err, errLeaderMoved) {
				hold.Reset(s.config.RPCHoldTimeout)
			}
		}
		select {
		case <-changed:
		case <-time.After(jitter(s.config.RPCHoldTimeout/20, 2)):
		case <-s.shutdownCtx.Done():
			return true, structs.ErrShutdown
		case <-caller.Done():
			return true, fmt.Errorf("%s: caller gone while waiting for a leader: %w", method, caller.Err())
		case <-hold.C:
			return true, fmt.Errorf("%w: waited %s for %s", structs.ErrNoLeader, s.config.RPCHoldTimeout, method)
		}
	}
}

// forwardRetryable says whether a forwarded call surely did not run, so
// forward may send it again: there was no connection, or the leader refused
// before writing. A lost connection or lost leadership mid-write goes back
// to the caller as retryable instead. An error carries every sentinel its
// sender's error wrapped, so one that says "no leader" may also say the
// outcome is unknown, or that the call was carried out in part
// (structs.ErrPartlyDone); those win.
func forwardRetryable(err error) bool {
	if errors.Is(err, errDial) {
		return true
	}
	return errors.Is(err, structs.ErrNoLeader) && !errors.Is(err, structs.ErrOutcomeUnknown) &&
		!errors.Is(err, structs.ErrPartlyDone) &&
		!errors.Is(err, errConnLost) && !errors.Is(err, context.DeadlineExceeded)
}

// callerContext is the context a request's caller tied it to (see
// structs.QueryOptions.SetContext), or context.Background.
func callerContext(args any) context.Context {
	if q, ok := args.(interface{ Context() context.Context }); ok {
		return q.Context()
	}
	return context.Background()
}

// forwardTo calls the leader. The call's own bound is the query's blocking
// time for reads, plus slack for the leader's reply; it is abandoned when
// caller ends.
func (s *Server) forwardTo(caller context.Context, addr, method string, info structs.RPCInfo, args, reply any) error {
	ctx, cancel := context.WithTimeout(s.shutdownCtx, structs.RPCCallTimeout(info))
	defer cancel()
	defer context.AfterFunc(caller, cancel)()
	moved, stopWatching := s.abandonWhenLeaderMoves(addr, cancel)
	defer stopWatching()
	// A blocking query whose caller may leave is named, so that it can be
	// ended on the leader without closing the connection it shares.
	cancelID := ""
	if q, ok := info.(interface{ TimeToBlock() time.Duration }); ok && q.TimeToBlock() > 0 && caller.Done() != nil {
		if qc, ok := args.(queryCanceller); ok {
			cancelID = uuid.NewString()
			qc.SetQueryCancelID(cancelID)
		}
	}
	err := s.connPool.RPC(ctx, addr, method, args, reply)
	if cancelID != "" && caller.Err() != nil {
		s.cancelForwarded(addr, cancelID)
	}
	if err != nil && s.shutdownCtx.Err() != nil {
		return fmt.Errorf("%w: while forwarding %s", structs.ErrShutdown, method)
	}
	if err != nil && moved() && caller.Err() == nil {
		if info.IsRead() {
			// Safe to send again: forward retries it with the new leader.
			return fmt.Errorf("%w: %s: %w", structs.ErrNoLeader, method, errLeaderMoved)
		}
		// The old leader may have committed it before it was cut off.
		return fmt.Errorf("%w: %w: %s: %w", structs.ErrNoLeader, structs.ErrOutcomeUnknown, method, errLeaderMoved)
	}
	if errors.Is(err, errConnLost) || errors.Is(err, context.DeadlineExceeded) {
		// Whether the leader ran the call is unknown, so the caller gets a
		// retryable error instead of a silent second attempt here.
		return fmt.Errorf("%w: %w", structs.ErrNoLeader, err)
	}
	return err
}

// errLeaderMoved says a forwarded call was abandoned because the server it
// went to stopped being the leader this server sees.
var errLeaderMoved = errors.New("the leader changed while the call was forwarded to it")

// abandonWhenLeaderMoves calls abandon once this server has seen a leader
// other than addr, or none, for longer than the hold timeout. A leader
// that is cut off from the other servers keeps its connections open but
// answers nothing: a call forwarded to it would hang until its own timeout
// (30 s for a write, the blocking time for a read) while the rest of the
// cluster has a new leader. A client whose heartbeat or allocation query
// hangs that way is declared down, or never hears that its allocations
// were stopped. A leader handing over gracefully answers what it holds
// within that time, so its callers still get their answers. moved reports
// whether abandon was called; stop ends the watch.
func (s *Server) abandonWhenLeaderMoves(addr string, abandon func()) (moved func() bool, stop func()) {
	var gone atomic.Bool
	done := make(chan struct{})
	grace := s.config.RPCHoldTimeout
	go func() {
		var since time.Time // when the leader was first seen elsewhere
		for {
			changed := s.leaderChanged()
			var expire <-chan time.Time
			if leader, _ := s.Leader(); leader == addr {
				since = time.Time{}
			} else {
				if since.IsZero() {
					since = time.Now()
				}
				left := grace - time.Since(since)
				if left <= 0 {
					gone.Store(true)
					abandon()
					return
				}
				expire = time.After(left)
			}
			select {
			case <-changed:
			case <-expire:
			case <-done:
				return
			}
		}
	}()
	return gone.Load, func() { close(done) }
}

// forwardCancelTimeout bounds a Status.CancelQuery sent for a forwarded
// query whose caller left. Should it fail, the query still ends with its
// own wait, or its connection.
const forwardCancelTimeout = 2 * time.Second

// cancelForwarded ends the query named id that this server forwarded to
// addr, whose caller has left.
func (s *Server) cancelForwarded(addr, id string) {
	ctx, cancel := context.WithTimeout(s.shutdownCtx, forwardCancelTimeout)
	defer cancel()
	var reply structs.QueryCancelResponse
	err := s.connPool.RPC(ctx, addr, "Status.CancelQuery", &structs.QueryCancelRequest{CancelID: id}, &reply)
	if err != nil {
		s.logger.Debug("could not end a forwarded blocking query whose caller left; it ends with its wait",
			"server", addr, "error", err)
	}
}

// leaderChanged returns a channel closed at the next observed leader change.
func (s *Server) leaderChanged() <-chan struct{} {
	return *s.leaderChangeCh.Load()
}

// notifyLeaderChange wakes everything waiting for a leader. Only the
// leadership owner calls it, so the swap needs no lock.
func (s *Server) notifyLeaderChange() {
	next := make(chan struct{})
	close(*s.leaderChangeCh.Swap(&next))
}

// raftApply commits msg through Raft and returns the FSM's response and
// the entry's index. Losing leadership mid-apply is ErrNoLeader.
func (s *Server) raftApply(t structs.MessageType, msg any) (any, uint64, error) {
	defer metrics.MeasureSince([]string{"raft", "apply", t.String()}, time.Now())
	buf, err := structs.Encode(t, msg)
	if err != nil {
		return nil, 0, fmt.Errorf("encode %s: %w", t, err)
	}
	future := s.raft.Apply(buf, 30*time.Second)
	if err := s.waitFuture(future); err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress),
			errors.Is(err, raft.ErrEnqueueTimeout):
			// Refused before it entered the log: safe to send again.
			return nil, 0, fmt.Errorf("%w: %s not applied: %v", structs.ErrNoLeader, t, err)
		case errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrRaftShutdown):
			// In the log, perhaps committed by the next leader.
			return nil, 0, fmt.Errorf("%w: %s: %v", structs.ErrOutcomeUnknown, t, err)
		}
		return nil, 0, fmt.Errorf("raft apply %s: %w", t, err)
	}
	resp := future.Response()
	if err, ok := resp.(error); ok && err != nil {
		return nil, future.Index(), err
	}
	return resp, future.Index(), nil
}

// queryFn reads from store, adding what it read to ws, and fills the reply
// including its index.
type queryFn func(ws memdb.WatchSet, store *state.StateStore) error

// blockingRPC runs fn, and while the result's index is not past
// MinQueryIndex, waits for what fn read to change and runs it again.
func (s *Server) blockingRPC(opts *structs.QueryOptions, meta *structs.QueryMeta, fn queryFn) error {
	// The wait ends with the caller (an HTTP client that hung up, an RPC
	// connection that closed), so an abandoned query holds nothing.
	caller := opts.Context()
	// A little jitter spreads the wake-ups of many identical queries.
	ctx, cancel := context.WithTimeout(caller, jitter(opts.TimeToBlock(), structs.BlockingJitterFraction))
	defer cancel()
	defer context.AfterFunc(s.shutdownCtx, cancel)()
	for {
		// One point in time for the whole answer: read from the live store,
		// a write landing between the query's read of its rows and of its
		// table's index would be claimed by the index but missing from the
		// rows, and a caller blocking from that index would not see it
		// until the next change. A snapshot's watch channels are the live
		// store's, so the wait below still wakes on any later write.
		snap := s.fsm.State().Snapshot()
		store := &snap.StateStore
		ws := memdb.NewWatchSet()
		ws.Add(store.AbandonCh())
		if err := fn(ws, store); err != nil {
			return err
		}
		s.setQueryMeta(meta)
		if meta.Index == 0 {
			// An index of 0 would turn a client's blocking loop into a busy one.
			meta.Index = 1
		}
		if opts.MinQueryIndex == 0 || meta.Index > opts.MinQueryIndex {
			return nil
		}
		if err := ws.WatchCtx(ctx); err != nil {
			if cerr := caller.Err(); cerr != nil {
				return fmt.Errorf("blocking query ended: its caller is gone: %w", cerr)
			}
			return nil // timed out: answer with what we have
		}
	}
}

// setQueryMeta fills in what the answering server knows of the leader.
func (s *Server) setQueryMeta(m *structs.QueryMeta) {
	if s.IsLeader() {
		m.LastContact = 0
		m.KnownLeader = true
		return
	}
	if last := s.raft.LastContact(); !last.IsZero() {
		m.LastContact = time.Since(last)
	}
	addr, _ := s.Leader()
	m.KnownLeader = addr != ""
}

// staleReadable reports whether this server may answer a stale read from
// its own state (see readgate), and latches once it may. Until then
// forward sends stale reads on as default ones.
func (s *Server) staleReadable() bool {
	if s.staleReadsLocal.Load() {
		return true
	}
	r := s.raft
	// The FSM's applied index first: if the commit index moves on between
	// the reads, the view is behind and the answer no.
	v := readgate.View{Applied: s.fsm.Applied(), Floor: s.staleFloor, State: r.State(), Leading: s.heartbeats.running(),
		Contacted: !r.LastContact().IsZero(), CommitAtStart: s.staleCommitAtStart}
	v.Commit = r.CommitIndex()
	v.Target = v.Commit
	if idx, ok := s.commands.lastCommandThrough(v.Commit); ok {
		v.Target = idx
	}
	if !readgate.CaughtUp(v) {
		return false
	}
	if s.staleReadsLocal.CompareAndSwap(false, true) {
		s.logger.Info("caught up since start; stale reads are answered from this server's state",
			"applied_index", v.Applied, "commit_index", v.Commit)
	}
	return true
}
