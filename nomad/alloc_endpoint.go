package nomad

import (
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
