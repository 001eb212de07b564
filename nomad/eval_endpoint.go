package nomad

import (
	memdb "github.com/hashicorp/go-memdb"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// Eval serves evaluation reads.
type Eval struct {
	srv *Server
}

// List returns evaluations, filtered by ID prefix.
func (e *Eval) List(args *structs.EvalListRequest, reply *structs.EvalListResponse) error {
	if done, err := e.srv.forward("Eval.List", args, args, reply); done {
		return err
	}
	return e.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		evals, err := store.Evals(ws, args.Prefix)
		if err != nil {
			return err
		}
		reply.Evaluations = evals
		if reply.Evaluations == nil {
			reply.Evaluations = []*structs.Evaluation{}
		}
		reply.Index, err = store.Index(state.TableEvals)
		return err
	})
}

// GetEval returns one evaluation; nil when unknown.
func (e *Eval) GetEval(args *structs.EvalSpecificRequest, reply *structs.SingleEvalResponse) error {
	if done, err := e.srv.forward("Eval.GetEval", args, args, reply); done {
		return err
	}
	return e.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		ev, err := store.EvalByID(ws, args.EvalID)
		if err != nil {
			return err
		}
		reply.Eval = ev
		if ev == nil {
			reply.Index, err = store.Index(state.TableEvals)
			return err
		}
		reply.Index = ev.ModifyIndex
		return nil
	})
}
