package nomad

import (
	"context"
	"fmt"
	"time"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// Alloc serves allocation reads.
type Alloc struct {
	srv *Server
}

// List returns allocation stubs, filtered by ID prefix.
func (a *Alloc) List(args *structs.AllocListRequest, reply *structs.AllocListResponse) error {
	if done, err := a.srv.forward("Alloc.List", args, args, reply); done {
		return err
	}
	return a.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		allocs, err := store.Allocs(ws, args.Prefix)
		if err != nil {
			return err
		}
		reply.Allocations = make([]*structs.AllocListStub, 0, len(allocs))
		for _, al := range allocs {
			reply.Allocations = append(reply.Allocations, al.Stub())
		}
		reply.Index, err = store.Index(state.TableAllocs)
		return err
	})
}

// GetAlloc returns one allocation; nil when unknown.
func (a *Alloc) GetAlloc(args *structs.AllocSpecificRequest, reply *structs.SingleAllocResponse) error {
	if done, err := a.srv.forward("Alloc.GetAlloc", args, args, reply); done {
		return err
	}
	return a.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		al, err := store.AllocByID(ws, args.AllocID)
		if err != nil {
			return err
		}
		reply.Alloc = al
		if al == nil {
			reply.Index, err = store.Index(state.TableAllocs)
			return err
		}
		reply.Index = al.ModifyIndex
		return nil
	})
}

// Bounds on one relayed call to an allocation's node.
const (
	allocLogsTimeout  = 30 * time.Second
	allocStatsTimeout = 10 * time.Second
)

// nodeCall finds the allocation a relayed call is about, and the context
// of the call to its node: bounded by timeout and by the server's
// shutdown. The caller calls done when the call is over. Relayed calls
// travel over the node's own session (through the server that holds it),
// never to an address the node reported about itself, and without the
// caller's token: the node has no use for it.
func (a *Alloc) nodeCall(ctx context.Context, allocID string, timeout time.Duration) (*structs.Allocation, context.Context, func(), error) {
	if allocID == "" {
		return nil, nil, nil, fmt.Errorf("%w: missing allocation ID", structs.ErrInvalidRequest)
	}
	alloc, err := a.srv.State().AllocByID(nil, allocID)
	if err != nil {
		return nil, nil, nil, err
	}
	if alloc == nil {
		return nil, nil, nil, fmt.Errorf("%w: alloc %s", structs.ErrNotFound, allocID)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	stop := context.AfterFunc(a.srv.shutdownCtx, cancel)
	return alloc, ctx, func() { stop(); cancel() }, nil
}

// Logs reads a piece of a task's log from the allocation's node.
func (a *Alloc) Logs(args *structs.AllocLogsRequest, reply *structs.AllocLogsResponse) error {
	if done, err := a.srv.forward("Alloc.Logs", args, args, reply); done {
		return err
	}
	alloc, ctx, done, err := a.nodeCall(args.Context(), args.AllocID, allocLogsTimeout)
	if err != nil {
		return err
	}
	defer done()
	req := structs.AllocLogsRequest{
		AllocID: alloc.ID,
		Task:    args.Task,
		Stream:  args.Stream,
		Origin:  args.Origin,
		Offset:  args.Offset,
		Limit:   args.Limit,
	}
	req.Region = a.srv.config.Region
	return a.srv.clientRPC(ctx, alloc.NodeID, "ClientAllocs.Logs", &req, reply)
}

// Stats measures an allocation's resource usage on its node.
func (a *Alloc) Stats(args *structs.AllocStatsRequest, reply *structs.AllocResourceUsage) error {
	if done, err := a.srv.forward("Alloc.Stats", args, args, reply); done {
		return err
	}
	alloc, ctx, done, err := a.nodeCall(args.Context(), args.AllocID, allocStatsTimeout)
	if err != nil {
		return err
	}
	defer done()
	req := structs.AllocStatsRequest{AllocID: alloc.ID}
	req.Region = a.srv.config.Region
	return a.srv.clientRPC(ctx, alloc.NodeID, "ClientAllocs.Stats", &req, reply)
}

// FS reads an allocation's directory on its node (ls, stat, or a piece of
// a file).
func (a *Alloc) FS(args *structs.AllocFSRequest, reply *structs.AllocFSResponse) error {
	if done, err := a.srv.forward("Alloc.FS", args, args, reply); done {
		return err
	}
	alloc, ctx, done, err := a.nodeCall(args.Context(), args.AllocID, allocLogsTimeout)
	if err != nil {
		return err
	}
	defer done()
	req := structs.AllocFSRequest{AllocID: alloc.ID, Op: args.Op, Path: args.Path, Offset: args.Offset, Limit: args.Limit}
	req.Region = a.srv.config.Region
	return a.srv.clientRPC(ctx, alloc.NodeID, "ClientAllocs.FS", &req, reply)
}
