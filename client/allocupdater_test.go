package client

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// refusingRPC refuses any batch holding a refused allocation, as the
// servers do for one they no longer have.
type refusingRPC struct {
	refused string
	mu      sync.Mutex
	got     []string
	fail    error
}

func (r *refusingRPC) RPC(method string, args, reply any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	req := args.(*structs.AllocUpdateRequest)
	for _, a := range req.Alloc {
		if a.ID == r.refused {
			return fmt.Errorf("%w: allocation %s", structs.ErrNotFound, a.ID)
		}
	}
	for _, a := range req.Alloc {
		r.got = append(r.got, a.ID+"="+a.ClientStatus)
	}
	return nil
}

func TestAllocUpdater_CoalescesAndDropsRefused(t *testing.T) {
	rpc := &refusingRPC{refused: "gone"}
	u := newAllocUpdater(rpc, 1, hclog.NewNullLogger())
	ctx := context.Background()

	u.update(&structs.Allocation{ID: "a", ClientStatus: "pending"}, false)
	u.update(&structs.Allocation{ID: "a", ClientStatus: "running"}, false)
	u.update(&structs.Allocation{ID: "gone", ClientStatus: "complete"}, true)
	u.flush(ctx)
	must.Eq(t, []string{"a=running"}, rpc.got, must.Sprint("latest update per alloc; the refused one dropped"))
	must.MapEmpty(t, u.pending)

	// A failure that may pass keeps the updates for the next flush.
	rpc.fail = fmt.Errorf("%w: try later", structs.ErrNoLeader)
	u.update(&structs.Allocation{ID: "b", ClientStatus: "running"}, false)
	u.flush(ctx)
	must.MapLen(t, 1, u.pending)
	rpc.fail = nil
	u.flush(ctx)
	must.Eq(t, []string{"a=running", "b=running"}, rpc.got)
}
