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

// allocLogsTimeout bounds one Alloc.Logs call to the node.
const allocLogsTimeout = 30 * time.Second

// Logs reads a piece of a task's log from the allocation's node. The
// request travels over the node's own session (through the server that
// holds it), never to an address the node reported about itself, and
// without the caller's token: the node has no use for it.
func (a *Alloc) Logs(args *structs.AllocLogsRequest, reply *structs.AllocLogsResponse) error {
	if done, err := a.srv.forward("Alloc.Logs", args, args, reply); done {
		return err
	}
	if args.AllocID == "" {
		return fmt.Errorf("%w: missing allocation ID", structs.ErrInvalidRequest)
	}
	alloc, err := a.srv.State().AllocByID(nil, args.AllocID)
	if err != nil {
		return err
	}
	if alloc == nil {
		return fmt.Errorf("%w: alloc %s", structs.ErrNotFound, args.AllocID)
	}
	req := structs.AllocLogsRequest{
		AllocID: alloc.ID,
		Task:    args.Task,
		Stream:  args.Stream,
		Origin:  args.Origin,
		Offset:  args.Offset,
		Limit:   args.Limit,
	}
	req.Region = a.srv.config.Region
	ctx, cancel := context.WithTimeout(args.Context(), allocLogsTimeout)
	defer cancel()
	defer context.AfterFunc(a.srv.shutdownCtx, cancel)()
	return a.srv.clientRPC(ctx, alloc.NodeID, "ClientAllocs.Logs", &req, reply)
}

// allocStatsTimeout bounds one Alloc.Stats call to the node.
const allocStatsTimeout = 10 * time.Second

// Stats measures an allocation's resource usage on its node, over the
// node's own session, as Logs does.
func (a *Alloc) Stats(args *structs.AllocStatsRequest, reply *structs.AllocResourceUsage) error {
	if done, err := a.srv.forward("Alloc.Stats", args, args, reply); done {
		return err
	}
	if args.AllocID == "" {
		return fmt.Errorf("%w: missing allocation ID", structs.ErrInvalidRequest)
	}
	alloc, err := a.srv.State().AllocByID(nil, args.AllocID)
	if err != nil {
		return err
	}
	if alloc == nil {
		return fmt.Errorf("%w: alloc %s", structs.ErrNotFound, args.AllocID)
	}
	req := structs.AllocStatsRequest{AllocID: alloc.ID}
	req.Region = a.srv.config.Region
	ctx, cancel := context.WithTimeout(args.Context(), allocStatsTimeout)
	defer cancel()
	defer context.AfterFunc(a.srv.shutdownCtx, cancel)()
	return a.srv.clientRPC(ctx, alloc.NodeID, "ClientAllocs.Stats", &req, reply)
}

// FS reads an allocation's directory on its node (ls, stat, or a piece of
// a file), over the node's own session, as Logs does.
func (a *Alloc) FS(args *structs.AllocFSRequest, reply *structs.AllocFSResponse) error {
	if done, err := a.srv.forward("Alloc.FS", args, args, reply); done {
		return err
	}
	if args.AllocID == "" {
		return fmt.Errorf("%w: missing allocation ID", structs.ErrInvalidRequest)
	}
	alloc, err := a.srv.State().AllocByID(nil, args.AllocID)
	if err != nil {
		return err
	}
	if alloc == nil {
		return fmt.Errorf("%w: alloc %s", structs.ErrNotFound, args.AllocID)
	}
	req := structs.AllocFSRequest{AllocID: alloc.ID, Op: args.Op, Path: args.Path, Offset: args.Offset, Limit: args.Limit}
	req.Region = a.srv.config.Region
	ctx, cancel := context.WithTimeout(args.Context(), allocLogsTimeout)
	defer cancel()
	defer context.AfterFunc(a.srv.shutdownCtx, cancel)()
	return a.srv.clientRPC(ctx, alloc.NodeID, "ClientAllocs.FS", &req, reply)
}
