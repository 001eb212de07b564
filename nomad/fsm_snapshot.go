package nomad

import (
	"fmt"
	"io"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// snapshotRecord types, one per table, written before each object.
type snapshotRecord uint8

const (
	snapIndex snapshotRecord = iota + 1
	snapNode
	snapEnd
	snapJob
	snapAlloc
	snapEval
	snapCSIVolume
	snapCSIPlugin
	snapClusterMeta
	snapACLPolicy
	snapACLToken
	snapCSIFence
)

// Snapshot captures the store as it is now; Persist streams it later
// without blocking Apply.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	return &fsmSnapshot{snap: f.State().Snapshot()}, nil
}

// Restore replaces the store with the snapshot's contents and wakes every
// blocked query on the old store.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	fresh, _, err := restoreStore(rc)
	if err != nil {
		return err
	}
	f.mu.Lock()
	old := f.state
	f.state = fresh
	events := f.events
	f.mu.Unlock()
	old.Abandon()
	if events != nil {
		// The restore's contents come without events: a subscriber from
		// before it would miss them.
		fresh.SetChangeHook(events.storeHook)
		latest, _ := fresh.LatestIndex()
		events.restored(latest)
	}
	return nil
}

// snapshotTables names each record type's table, as counts are reported.
var snapshotTables = map[snapshotRecord]string{
	snapIndex:       "index",
	snapNode:        "nodes",
	snapJob:         "jobs",
	snapAlloc:       "allocs",
	snapEval:        "evals",
	snapCSIVolume:   "csi_volumes",
	snapCSIPlugin:   "csi_plugins",
	snapClusterMeta: "cluster_meta",
	snapACLPolicy:   "acl_policies",
	snapACLToken:    "acl_tokens",
	snapCSIFence:    "csi_fences",
}

// restoreStore reads a snapshot stream (as Persist writes it) into a new
// store and counts the objects of each table. The stream must end with its
// end record: a stream cut short is an error, and nothing of it is kept.
func restoreStore(r io.Reader) (*state.StateStore, map[string]int, error) {
	fresh, err := state.NewStateStore()
	if err != nil {
		return nil, nil, err
	}
	restore := fresh.Restore()
	defer restore.Abort()
	counts := make(map[string]int, len(snapshotTables))
	for _, table := range snapshotTables {
		counts[table] = 0
	}

	dec := codec.NewDecoder(r, structs.MsgpackHandle)
	for {
		var rec snapshotRecord
		if err := dec.Decode(&rec); err != nil {
			return nil, nil, fmt.Errorf("fsm: restore: read record type: %w", err)
		}
		if rec == snapEnd {
			restore.Commit()
			return fresh, counts, nil
		}
		table, ok := snapshotTables[rec]
		if !ok {
			return nil, nil, fmt.Errorf("fsm: restore: unknown record type %d", rec)
		}
		if err := restoreRecord(dec, restore, rec); err != nil {
			return nil, nil, fmt.Errorf("fsm: restore %s: %w", table, err)
		}
		counts[table]++
	}
}

// restoreRecord decodes one object of type rec and adds it to restore.
func restoreRecord(dec *codec.Decoder, restore *state.Restore, rec snapshotRecord) error {
	switch rec {
	case snapIndex:
		var e state.IndexEntry
		if err := dec.Decode(&e); err != nil {
			return err
		}
		return restore.IndexEntry(&e)
	case snapNode:
		var n structs.Node
		if err := dec.Decode(&n); err != nil {
			return err
		}
		return restore.Node(&n)
	case snapJob:
		var j structs.Job
		if err := dec.Decode(&j); err != nil {
			return err
		}
		return restore.Job(&j)
	case snapAlloc:
		var a structs.Allocation
		if err := dec.Decode(&a); err != nil {
			return err
		}
		return restore.Alloc(&a)
	case snapEval:
		var e structs.Evaluation
		if err := dec.Decode(&e); err != nil {
			return err
		}
		return restore.Eval(&e)
	case snapCSIVolume:
		var v structs.CSIVolume
		if err := dec.Decode(&v); err != nil {
			return err
		}
		return restore.CSIVolume(&v)
	case snapCSIPlugin:
		var p structs.CSIPlugin
		if err := dec.Decode(&p); err != nil {
			return err
		}
		return restore.CSIPlugin(&p)
	case snapClusterMeta:
		var m structs.ClusterMetadata
		if err := dec.Decode(&m); err != nil {
			return err
		}
		return restore.ClusterMetadata(&m)
	case snapACLPolicy:
		var p structs.ACLPolicy
		if err := dec.Decode(&p); err != nil {
			return err
		}
		return restore.ACLPolicy(&p)
	case snapACLToken:
		var t structs.ACLToken
		if err := dec.Decode(&t); err != nil {
			return err
		}
		return restore.ACLToken(&t)
	case snapCSIFence:
		var f structs.CSIControllerFence
		if err := dec.Decode(&f); err != nil {
			return err
		}
		return restore.CSIControllerFence(&f)
	}
	return fmt.Errorf("unknown record type %d", rec)
}

type fsmSnapshot struct {
	snap *state.StateSnapshot
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := s.persist(sink); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *fsmSnapshot) persist(w io.Writer) error {
	enc := codec.NewEncoder(w, structs.MsgpackHandle)
	write := func(rec snapshotRecord, obj any) error {
		if err := enc.Encode(rec); err != nil {
			return fmt.Errorf("fsm: snapshot: %w", err)
		}
		if obj == nil {
			return nil
		}
		if err := enc.Encode(obj); err != nil {
			return fmt.Errorf("fsm: snapshot: %w", err)
		}
		return nil
	}

	indexes, err := s.snap.Indexes()
	if err != nil {
		return err
	}
	for _, e := range indexes {
		if err := write(snapIndex, e); err != nil {
			return err
		}
	}
	nodes, err := s.snap.Nodes(nil)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if err := write(snapNode, n); err != nil {
			return err
		}
	}
	jobs, err := s.snap.Jobs(nil, structs.DefaultNamespace, "")
	if err != nil {
		return err
	}
	for _, j := range jobs {
		if err := write(snapJob, j); err != nil {
			return err
		}
	}
	allocs, err := s.snap.Allocs(nil, "")
	if err != nil {
		return err
	}
	for _, a := range allocs {
		if err := write(snapAlloc, a); err != nil {
			return err
		}
	}
	evals, err := s.snap.Evals(nil, "")
	if err != nil {
		return err
	}
	for _, e := range evals {
		if err := write(snapEval, e); err != nil {
			return err
		}
	}
	vols, err := s.snap.CSIVolumes(nil, structs.DefaultNamespace, "")
	if err != nil {
		return err
	}
	for _, v := range vols {
		if err := write(snapCSIVolume, v); err != nil {
			return err
		}
	}
	plugins, err := s.snap.CSIPlugins(nil, "")
	if err != nil {
		return err
	}
	for _, p := range plugins {
		if err := write(snapCSIPlugin, p); err != nil {
			return err
		}
	}
	fences, err := s.snap.CSIControllerFences(nil)
	if err != nil {
		return err
	}
	for _, f := range fences {
		if err := write(snapCSIFence, f); err != nil {
			return err
		}
	}
	meta, err := s.snap.ClusterMetadata(nil)
	if err != nil {
		return err
	}
	if meta != nil {
		if err := write(snapClusterMeta, meta); err != nil {
			return err
		}
	}
	policies, err := s.snap.ACLPolicies(nil)
	if err != nil {
		return err
	}
	for _, p := range policies {
		if err := write(snapACLPolicy, p); err != nil {
			return err
		}
	}
	tokens, err := s.snap.ACLTokens(nil)
	if err != nil {
		return err
	}
	for _, t := range tokens {
		if err := write(snapACLToken, t); err != nil {
			return err
		}
	}
	return write(snapEnd, nil)
}

func (s *fsmSnapshot) Release() {}
