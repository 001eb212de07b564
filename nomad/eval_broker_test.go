package nomad

import (
	"context"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func brokerEval(id, job string) *structs.Evaluation {
	return &structs.Evaluation{ID: id, Namespace: structs.DefaultNamespace, JobID: job, Status: structs.EvalStatusPending}
}

func dequeueNow(t *testing.T, b *evalBroker) *structs.Evaluation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := b.dequeue(ctx)
	must.NoError(t, err)
	return e
}

// nothingReady asserts that dequeue has nothing to hand out.
func nothingReady(t *testing.T, b *evalBroker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := b.dequeue(ctx)
	must.ErrorIs(t, err, context.Canceled)
}

func TestEvalBroker_OnePerJobInFlight(t *testing.T) {
	b := newEvalBroker()
	b.setEnabled(true)
	b.enqueue(brokerEval("a1", "a"), brokerEval("a2", "a"), brokerEval("b1", "b"))
	b.enqueue(brokerEval("a1", "a")) // a duplicate is dropped

	first := dequeueNow(t, b)
	must.Eq(t, "a1", first.ID)
	// a2 waits while a1 runs; b1 does not.
	must.Eq(t, "b1", dequeueNow(t, b).ID)
	nothingReady(t, b)
	b.ack(first)
	must.Eq(t, "a2", dequeueNow(t, b).ID)
	nothingReady(t, b)
}

func TestEvalBroker_DisabledDropsEverything(t *testing.T) {
	b := newEvalBroker()
	b.enqueue(brokerEval("x", "x")) // disabled: ignored
	b.setEnabled(true)
	nothingReady(t, b)
	b.enqueue(brokerEval("y", "y"))
	b.setEnabled(false)
	b.setEnabled(true)
	nothingReady(t, b)

	// Evaluations that are not pending or blocked are ignored.
	done := brokerEval("z", "z")
	done.Status = structs.EvalStatusComplete
	b.enqueue(done)
	nothingReady(t, b)
}

func TestEvalBroker_DelayedAndBlocked(t *testing.T) {
	b := newEvalBroker()
	b.setEnabled(true)
	delayed := brokerEval("d", "d")
	delayed.WaitUntil = time.Now().Add(100 * time.Millisecond)
	b.enqueue(delayed)
	nothingReady(t, b)
	// It becomes ready by itself once its time comes.
	must.Eq(t, "d", dequeueNow(t, b).ID)
	must.False(t, time.Now().Before(delayed.WaitUntil))

	blocked := brokerEval("blk", "j")
	b.block(blocked, b.unblockGen())
	other := brokerEval("oth", "k")
	b.block(other, b.unblockGen())
	_, _, nBlocked := b.stats()
	must.Eq(t, 2, nBlocked)
	// Unblocking except job j re-queues only k's evaluation, as pending.
	b.unblock(jobKey{structs.DefaultNamespace, "j"})
	got := dequeueNow(t, b)
	must.Eq(t, "oth", got.ID)
	must.Eq(t, structs.EvalStatusPending, got.Status)
	nothingReady(t, b)
	b.unblock()
	must.Eq(t, "blk", dequeueNow(t, b).ID)
}

// An evaluation scheduled against a snapshot older than the latest
// unblock (capacity freed while it ran, say a volume claim) is queued
// again instead of blocked: it would otherwise miss the change.
func TestEvalBroker_BlockAfterUnblockRequeues(t *testing.T) {
	b := newEvalBroker()
	b.setEnabled(true)
	gen := b.unblockGen() // the worker takes its snapshot here
	b.unblock()           // a claim frees meanwhile
	b.block(brokerEval("late", "j"), gen)
	_, _, nBlocked := b.stats()
	must.Zero(t, nBlocked)
	got := dequeueNow(t, b)
	must.Eq(t, "late", got.ID)
	must.Eq(t, structs.EvalStatusPending, got.Status)

	// With no unblock in between it stays blocked.
	b.ack(got)
	b.block(brokerEval("calm", "k"), b.unblockGen())
	_, _, nBlocked = b.stats()
	must.Eq(t, 1, nBlocked)
	nothingReady(t, b)
}
