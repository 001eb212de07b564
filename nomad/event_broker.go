package nomad

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/roamhq/roam/structs"
)

// DefaultEventBufferSize is how many Raft indexes' events a server keeps
// for event stream subscribers by default.
const DefaultEventBufferSize = 2048

// eventBroker keeps the latest batches of events, one batch per Raft
// index, in a bounded buffer that every subscriber reads at its own pace.
// Publishing never waits for a subscriber: a subscriber that falls so far
// behind that the batch it needs next has been evicted gets
// structs.ErrEventsDropped and must start again, rather than holding
// memory or the FSM back. A subscriber asking to start at an index older
// than the buffer gets the same error, never a silent gap.
type eventBroker struct {
	size int

	// mu guards the fields below.
	mu sync.Mutex
	// batches are the buffered batches, oldest first, by rising index.
	batches []structs.EventBatch
	// dropped is the highest index whose events may have been lost: the
	// newest evicted batch, or the index a snapshot restore jumped to.
	dropped uint64
	// latest is the highest index published (with events or not).
	latest uint64
	// notify is closed, and replaced, on every publish.
	notify chan struct{}
}

func newEventBroker(size int) *eventBroker {
	if size <= 0 {
		size = DefaultEventBufferSize
	}
	return &eventBroker{size: size, notify: make(chan struct{})}
}

// publish adds the events of one index. Batches come in rising index
// order, from the FSM; one with no events only advances latest.
func (b *eventBroker) publish(index uint64, events []structs.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if index <= b.latest && b.latest != 0 {
		return
	}
	b.latest = index
	if len(events) > 0 {
		b.batches = append(b.batches, structs.EventBatch{Index: index, Events: events})
		if over := len(b.batches) - b.size; over > 0 {
			b.dropped = b.batches[over-1].Index
			// Copy so the evicted batches' memory is not kept alive.
			b.batches = slices.Clone(b.batches[over:])
		}
	}
	close(b.notify)
	b.notify = make(chan struct{})
}

// restored says the store was replaced by a snapshot at index: events up
// to it were never seen here.
func (b *eventBroker) restored(index uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batches = nil
	b.dropped = max(b.dropped, index)
	b.latest = max(b.latest, index)
	close(b.notify)
	b.notify = make(chan struct{})
}

// head returns the latest index published.
func (b *eventBroker) head() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.latest
}

// checkFrom refuses to serve events after index after if some of them
// were dropped.
func (b *eventBroker) checkFromLocked(after uint64) error {
	if after < b.dropped {
		oldest := b.dropped + 1
		return fmt.Errorf("%w: events after index %d were wanted but the buffer (%d indexes) starts after index %d; "+
			"read the current state and stream again from index %d or from now",
			structs.ErrEventsDropped, after, b.size, b.dropped, oldest)
	}
	return nil
}

// checkFrom is checkFromLocked for a caller about to subscribe.
func (b *eventBroker) checkFrom(after uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.checkFromLocked(after)
}

// next returns the buffered batches with an index above after, waiting
// until there is at least one or ctx ends. With events after it dropped,
// it returns structs.ErrEventsDropped.
func (b *eventBroker) next(ctx context.Context, after uint64) ([]structs.EventBatch, error) {
	for {
		b.mu.Lock()
		if err := b.checkFromLocked(after); err != nil {
			b.mu.Unlock()
			return nil, err
		}
		i, _ := slices.BinarySearchFunc(b.batches, after+1, func(e structs.EventBatch, t uint64) int {
			switch {
			case e.Index < t:
				return -1
			case e.Index > t:
				return 1
			}
			return 0
		})
		if i < len(b.batches) {
			out := slices.Clone(b.batches[i:])
			b.mu.Unlock()
			return out, nil
		}
		wait := b.notify
		b.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
