package client

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/roamhq/roam/structs"
)

// allocUpdater batches allocation status updates to Node.UpdateAlloc: the
// latest update per allocation wins, and a batch goes out every interval,
// or at once when an allocation turns terminal.
type allocUpdater struct {
	rpc      rpcer
	interval time.Duration
	logger   hclog.Logger
	// kick wakes the flush loop early; it holds at most one wake-up.
	kick chan struct{}

	// mu guards pending.
	mu      sync.Mutex
	pending map[string]*structs.Allocation
}

func newAllocUpdater(rpc rpcer, interval time.Duration, logger hclog.Logger) *allocUpdater {
	return &allocUpdater{
		rpc:      rpc,
		interval: interval,
		logger:   logger.Named("alloc_updater"),
		kick:     make(chan struct{}, 1),
		pending:  make(map[string]*structs.Allocation),
	}
}

// update queues an allocation's status; terminal flushes the batch now.
func (u *allocUpdater) update(alloc *structs.Allocation, terminal bool) {
	u.mu.Lock()
	u.pending[alloc.ID] = alloc
	u.mu.Unlock()
	if terminal {
		select {
		case u.kick <- struct{}{}:
		default:
		}
	}
}

// run flushes batches until ctx ends. Nothing is sent before the node is
// registered: until then the servers would refuse the node's token.
func (u *allocUpdater) run(ctx context.Context, registered <-chan struct{}) {
	select {
	case <-registered:
	case <-ctx.Done():
		return
	}
	t := time.NewTicker(u.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-u.kick:
		}
		u.flush(ctx)
	}
}

func (u *allocUpdater) flush(ctx context.Context) {
	u.mu.Lock()
	if len(u.pending) == 0 {
		u.mu.Unlock()
		return
	}
	batch := u.pending
	u.pending = make(map[string]*structs.Allocation)
	u.mu.Unlock()

	allocs := make([]*structs.Allocation, 0, len(batch))
	for _, a := range batch {
		allocs = append(allocs, a)
	}
	err := u.send(allocs)
	if err != nil && rejected(err) {
		// One allocation the servers refuse (garbage collected, say) must
		// not hold back the others: send them one by one and drop those
		// refused.
		var retry []*structs.Allocation
		for _, a := range allocs {
			if err := u.send([]*structs.Allocation{a}); err != nil {
				if rejected(err) {
					u.logger.Warn("servers refused allocation update; dropping it", "alloc_id", a.ID, "error", err)
					continue
				}
				retry = append(retry, a)
			}
		}
		allocs, err = retry, nil
		if len(retry) > 0 {
			err = errors.New("some updates failed")
		}
	}
	if err == nil {
		return
	}
	if ctx.Err() != nil || errors.Is(err, ErrShutdown) {
		return
	}
	u.logger.Error("failed to update allocations; will retry", "count", len(allocs), "error", err)
	// Put back what no newer update replaced meanwhile.
	u.mu.Lock()
	for _, a := range allocs {
		if _, ok := u.pending[a.ID]; !ok {
			u.pending[a.ID] = a
		}
	}
	u.mu.Unlock()
}

func (u *allocUpdater) send(allocs []*structs.Allocation) error {
	var resp structs.GenericResponse
	return u.rpc.RPC("Node.UpdateAlloc", &structs.AllocUpdateRequest{Alloc: allocs}, &resp)
}

// rejected reports an answer that sending the same update again will not
// change.
func rejected(err error) bool {
	return errors.Is(err, structs.ErrNotFound) || errors.Is(err, structs.ErrPermissionDenied) || errors.Is(err, structs.ErrInvalidRequest)
}
