package nomad

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// FSM applies committed Raft entries to the state store. Apply touches
// nothing but the store.
type FSM struct {
	logger hclog.Logger

	// mu guards state, which a restore swaps, hook and events.
	mu    sync.RWMutex
	state *state.StateStore
	hook  ApplyHook
	// events, when set, gets the events of every applied entry.
	events *eventBroker

	// applied is the index of the last entry Apply returned from, or after
	// a restore the last index the restored state records: every command
	// up to it is in the state. Raft's own AppliedIndex moves when entries
	// are handed to the FSM's goroutine, before they are applied; this
	// moves after.
	applied atomic.Uint64
	// waiters counts waitApplied calls, so that Apply takes appliedMu only
	// when someone waits; appliedCh is closed (and replaced) when applied
	// moves while someone waits.
	waiters   atomic.Int32
	appliedMu sync.Mutex
	appliedCh chan struct{}
}

var _ raft.FSM = (*FSM)(nil)

// NewFSM returns an FSM over an empty store.
func NewFSM(logger hclog.Logger) (*FSM, error) {
	st, err := state.NewStateStore()
	if err != nil {
		return nil, err
	}
	return &FSM{logger: logger.Named("fsm"), state: st, appliedCh: make(chan struct{})}, nil
}

// State returns the current store.
func (f *FSM) State() *state.StateStore {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.state
}

// errUnknownMessage is returned for a log entry no handler knows. Every
// server hits it at the same index, so state stays identical; it means a
// newer server wrote an entry this build does not understand.
var errUnknownMessage = errors.New("fsm: unknown message type")

// Apply applies one committed entry and returns nil or an error value,
// which the writer receives from its apply future.
func (f *FSM) Apply(l *raft.Log) any {
	defer f.setApplied(l.Index)
	if l.Type != raft.LogCommand || len(l.Data) == 0 {
		return nil
	}
	t := structs.MessageType(l.Data[0])
	apply, ok := fsmAppliers[t]
	if !ok {
		f.logger.Error("unknown message type in raft log", "type", uint8(t), "index", l.Index)
		return fmt.Errorf("%w %d at index %d", errUnknownMessage, t, l.Index)
	}
	evals, err := apply(f.State(), l.Index, l.Data[1:])
	if err != nil {
		return err
	}
	if hook := f.applyHook(); hook != nil {
		hook(t, evals)
	}
	return nil
}

// wakeWaiters wakes every waitApplied call, if any, to read applied again.
func (f *FSM) wakeWaiters() {
	if f.waiters.Load() == 0 {
		return
	}
	f.appliedMu.Lock()
	close(f.appliedCh)
	f.appliedCh = make(chan struct{})
	f.appliedMu.Unlock()
}

// setApplied records that every command up to index is in the state (an
// entry applied, or a restore) and wakes whoever waits.
func (f *FSM) setApplied(index uint64) {
	f.applied.Store(index)
	f.wakeWaiters()
}

// Applied returns the index of the last entry applied.
func (f *FSM) Applied() uint64 { return f.applied.Load() }

// waitApplied waits until the entry at index (or a later one) has been
// applied, or ctx ends.
func (f *FSM) waitApplied(ctx context.Context, index uint64) error {
	f.waiters.Add(1)
	defer f.waiters.Add(-1)
	for {
		// The channel is taken before applied is read, so an Apply that
		// this read misses closes it, unless an earlier Apply already has.
		f.appliedMu.Lock()
		ch := f.appliedCh
		f.appliedMu.Unlock()
		if f.applied.Load() >= index {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ApplyHook is told, on every server, of each applied entry and the
// evaluations it stored. The leader uses it to queue evaluations for its
// workers and to unblock evaluations when capacity changes. It must not
// block.
type ApplyHook func(t structs.MessageType, evals []*structs.Evaluation)

// SetEventBroker makes every write to the store, now and after a restore,
// publish its events to b.
func (f *FSM) SetEventBroker(b *eventBroker) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = b
	f.state.SetChangeHook(b.storeHook)
}

// SetApplyHook sets (or, with nil, clears) the hook.
func (f *FSM) SetApplyHook(h ApplyHook) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hook = h
}

func (f *FSM) applyHook() ApplyHook {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.hook
}

// fsmApplier decodes one entry's body and applies it at index, returning
// the evaluations it stored.
type fsmApplier func(st *state.StateStore, index uint64, body []byte) ([]*structs.Evaluation, error)

// decodeApply wraps a typed apply function as an fsmApplier.
func decodeApply[T any](t structs.MessageType, fn func(st *state.StateStore, index uint64, req *T) ([]*structs.Evaluation, error)) fsmApplier {
	return func(st *state.StateStore, index uint64, body []byte) ([]*structs.Evaluation, error) {
		req := new(T)
		if err := structs.Decode(body, req); err != nil {
			return nil, fmt.Errorf("fsm: decode %s: %w", t, err)
		}
		return fn(st, index, req)
	}
}

var fsmAppliers = map[structs.MessageType]fsmApplier{
	structs.NodeRegisterRequestType: decodeApply(structs.NodeRegisterRequestType,
		func(st *state.StateStore, index uint64, req *structs.NodeRegisterRequest) ([]*structs.Evaluation, error) {
			return req.Evals, st.UpsertNode(index, req.Node, req.Evals...)
		}),
	structs.NodeUpdateStatusRequestType: decodeApply(structs.NodeUpdateStatusRequestType,
		func(st *state.StateStore, index uint64, req *structs.NodeUpdateStatusRequest) ([]*structs.Evaluation, error) {
			return req.Evals, st.UpdateNodeStatus(index, req.NodeID, req.Status, req.UpdatedAt, req.Evals...)
		}),
	structs.NodeDeregisterRequestType: decodeApply(structs.NodeDeregisterRequestType,
		func(st *state.StateStore, index uint64, req *structs.NodeDeregisterRequest) ([]*structs.Evaluation, error) {
			return nil, st.DeleteNodes(index, req.NodeIDs)
		}),
	structs.JobRegisterRequestType: decodeApply(structs.JobRegisterRequestType,
		func(st *state.StateStore, index uint64, req *structs.JobRegisterRequest) ([]*structs.Evaluation, error) {
			return []*structs.Evaluation{req.Eval}, st.RegisterJob(index, req.Job, req.Eval)
		}),
	structs.JobDeregisterRequestType: decodeApply(structs.JobDeregisterRequestType,
		func(st *state.StateStore, index uint64, req *structs.JobDeregisterRequest) ([]*structs.Evaluation, error) {
			ns := structs.DefaultNamespace
			if req.Eval != nil {
				ns = req.Eval.Namespace
			}
			return []*structs.Evaluation{req.Eval}, st.DeregisterJob(index, ns, req.JobID, req.Purge, req.Eval)
		}),
	structs.EvalUpdateRequestType: decodeApply(structs.EvalUpdateRequestType,
		func(st *state.StateStore, index uint64, req *structs.EvalUpdateRequest) ([]*structs.Evaluation, error) {
			return req.Evals, st.UpsertEvals(index, req.Evals)
		}),
	structs.AllocClientUpdateRequestType: decodeApply(structs.AllocClientUpdateRequestType,
		func(st *state.StateStore, index uint64, req *structs.AllocUpdateRequest) ([]*structs.Evaluation, error) {
			return req.Evals, st.UpdateAllocsFromClientWithEvals(index, req.Alloc, req.Evals)
		}),
	structs.ApplyPlanResultsRequestType: decodeApply(structs.ApplyPlanResultsRequestType,
		func(st *state.StateStore, index uint64, req *structs.ApplyPlanResultsRequest) ([]*structs.Evaluation, error) {
			return req.Evals, st.ApplyPlanResults(index, req.AllocsStopped, req.AllocsPlaced, req.Evals)
		}),
	structs.AllocUpdateDesiredTransitionRequestType: decodeApply(structs.AllocUpdateDesiredTransitionRequestType,
		func(st *state.StateStore, index uint64, req *structs.AllocUpdateDesiredTransitionRequest) ([]*structs.Evaluation, error) {
			return req.Evals, st.UpdateAllocDesiredTransitions(index, req.Allocs, req.Evals)
		}),
	structs.NodeUpdateDrainRequestType: decodeApply(structs.NodeUpdateDrainRequestType,
		func(st *state.StateStore, index uint64, req *structs.NodeUpdateDrainRequest) ([]*structs.Evaluation, error) {
			return req.Evals, st.UpdateNodeDrain(index, req.NodeID, req.DrainStrategy, req.MarkEligible, req.Complete, req.UpdatedAt, req.Evals)
		}),
	structs.CSIVolumeRegisterRequestType: decodeApply(structs.CSIVolumeRegisterRequestType,
		func(st *state.StateStore, index uint64, req *structs.CSIVolumeRegisterRequest) ([]*structs.Evaluation, error) {
			return nil, st.UpsertCSIVolumes(index, req.Volumes)
		}),
	structs.CSIVolumeDeregisterRequestType: decodeApply(structs.CSIVolumeDeregisterRequestType,
		func(st *state.StateStore, index uint64, req *structs.CSIVolumeDeregisterRequest) ([]*structs.Evaluation, error) {
			return nil, st.DeleteCSIVolumes(index, structs.DefaultNamespace, req.VolumeIDs, req.Force)
		}),
	structs.CSIVolumeClaimRequestType: decodeApply(structs.CSIVolumeClaimRequestType,
		func(st *state.StateStore, index uint64, req *structs.CSIVolumeClaimUpdateRequest) ([]*structs.Evaluation, error) {
			return nil, st.UpdateCSIVolumeClaim(index, req.Namespace, req.VolumeID, req.Claim)
		}),
	structs.ClusterMetadataRequestType: decodeApply(structs.ClusterMetadataRequestType,
		func(st *state.StateStore, index uint64, req *structs.ClusterMetadataRequest) ([]*structs.Evaluation, error) {
			return nil, st.SetClusterMetadata(index, &req.Metadata)
		}),
	structs.ACLPolicyUpsertRequestType: decodeApply(structs.ACLPolicyUpsertRequestType,
		func(st *state.StateStore, index uint64, req *structs.ACLPolicyUpsertRequest) ([]*structs.Evaluation, error) {
			return nil, st.UpsertACLPolicies(index, req.Policies)
		}),
	structs.ACLPolicyDeleteRequestType: decodeApply(structs.ACLPolicyDeleteRequestType,
		func(st *state.StateStore, index uint64, req *structs.ACLPolicyDeleteRequest) ([]*structs.Evaluation, error) {
			return nil, st.DeleteACLPolicies(index, req.Names)
		}),
	structs.ACLTokenUpsertRequestType: decodeApply(structs.ACLTokenUpsertRequestType,
		func(st *state.StateStore, index uint64, req *structs.ACLTokenUpsertRequest) ([]*structs.Evaluation, error) {
			return nil, st.UpsertACLTokens(index, req.Tokens)
		}),
	structs.ACLTokenDeleteRequestType: decodeApply(structs.ACLTokenDeleteRequestType,
		func(st *state.StateStore, index uint64, req *structs.ACLTokenDeleteRequest) ([]*structs.Evaluation, error) {
			return nil, st.DeleteACLTokens(index, req.AccessorIDs)
		}),
	structs.ACLTokenBootstrapRequestType: decodeApply(structs.ACLTokenBootstrapRequestType,
		func(st *state.StateStore, index uint64, req *structs.ACLTokenBootstrapRequest) ([]*structs.Evaluation, error) {
			return nil, st.BootstrapACLToken(index, req.ResetIndex, req.Token)
		}),
	structs.CSIControllerFenceRequestType: decodeApply(structs.CSIControllerFenceRequestType,
		func(st *state.StateStore, index uint64, req *structs.CSIControllerFenceRequest) ([]*structs.Evaluation, error) {
			return nil, st.UpsertCSIControllerFence(index, &req.Fence)
		}),
	structs.NodeUpdateEligibilityRequestType: decodeApply(structs.NodeUpdateEligibilityRequestType,
		func(st *state.StateStore, index uint64, req *structs.NodeUpdateEligibilityRequest) ([]*structs.Evaluation, error) {
			return req.Evals, st.UpdateNodeEligibility(index, req.NodeID, req.Eligibility, req.UpdatedAt, req.Evals)
		}),
}
