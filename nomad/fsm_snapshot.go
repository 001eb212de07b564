package nomad

import (
	"bufio"
	"bytes"
	"errors"
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
	// snapAllocJob is a job version that the snapAllocShared records after
	// it name by ordinal (0 for the first snapAllocJob of the stream).
	snapAllocJob
	// snapAllocShared is an allocation written without its job, with the
	// ordinal of its snapAllocJob: the scale run's 10,000 allocations of
	// one job otherwise carry 10,000 copies of it, which made up most of
	// the snapshot, of its decode time and of a restored server's heap.
	snapAllocShared
	// snapVersion carries the stream's format version (a uint). It is the
	// first record of every stream written since versions began, and may
	// be nowhere else: a version read after some records would come too
	// late to say how to read them.
	snapVersion
)

// snapshotFormatVersion is the format version of the snapshot stream this
// build writes, and the newest it reads. Bump it when a change to the
// stream cannot be read by an older build (a new record type, a record
// whose body an older build would misread), so that the older build
// refuses the stream by name instead of failing on, or misreading, some
// record in the middle of it. A change an older build reads correctly (a
// new field that msgpack skips) leaves it. A stream without a version
// record is from a build before versions, version 0, and reads as it
// always did.
const snapshotFormatVersion uint = 1

// ErrSnapshotNewer is wrapped by the error for a snapshot stream (or
// snapshot file) in a format newer than this build reads: no older build
// can restore it, only an upgraded one.
var ErrSnapshotNewer = errors.New("upgrade this server first")

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
	latest, err := fresh.LatestIndex()
	if err != nil {
		return err
	}
	f.mu.Lock()
	old := f.state
	f.state = fresh
	events := f.events
	f.mu.Unlock()
	// Every command up to the snapshot's index is in the state now, and
	// none after it (the snapshot may even be older than what was applied
	// before). Raft does not say that index; the last index any table
	// records is at most it, so the count never claims too much.
	f.setApplied(latest)
	old.Abandon()
	if events != nil {
		// The restore's contents come without events: a subscriber from
		// before it would miss them.
		fresh.SetChangeHook(events.storeHook)
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
	snapAllocJob:    "allocs",
	snapAllocShared: "allocs",
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
	counts, err := decodeSnapshot(r, restore)
	if err != nil {
		return nil, nil, err
	}
	restore.Commit()
	return fresh, counts, nil
}

// countSnapshot decodes a snapshot stream completely and counts its
// objects without building a store: the check for a stream this server
// has just written from its own state, where a store built to be thrown
// away cost as much again as the decode.
func countSnapshot(r io.Reader) (map[string]int, error) {
	return decodeSnapshot(r, nil)
}

// decodeSnapshot decodes every record of a snapshot stream, adds each
// object to restore unless it is nil, and counts them by table.
func decodeSnapshot(r io.Reader, restore *state.Restore) (map[string]int, error) {
	counts := make(map[string]int, len(snapshotTables))
	for _, table := range snapshotTables {
		counts[table] = 0
	}
	// Raft hands Restore a reader that is neither buffered nor a
	// ByteScanner, and the decoder then reads it a byte at a time through
	// several interfaces: a third of a 5,000-node restore went there.
	if _, ok := r.(io.ByteScanner); !ok {
		r = bufio.NewReaderSize(r, snapshotReadBuffer)
	}
	d := &snapshotDecoder{dec: codec.NewDecoder(r, structs.MsgpackHandle), restore: restore}
	for first := true; ; first = false {
		var rec snapshotRecord
		if err := d.dec.Decode(&rec); err != nil {
			return nil, fmt.Errorf("fsm: restore: read record type: %w", err)
		}
		if rec == snapVersion {
			if !first {
				return nil, fmt.Errorf("fsm: restore: format version record after the first record")
			}
			if err := d.checkVersion(); err != nil {
				return nil, err
			}
			continue
		}
		if rec == snapEnd {
			return counts, nil
		}
		table, ok := snapshotTables[rec]
		if !ok {
			return nil, fmt.Errorf("fsm: restore: unknown record type %d", rec)
		}
		if err := d.record(rec); err != nil {
			return nil, fmt.Errorf("fsm: restore %s: %w", table, err)
		}
		if rec != snapAllocJob {
			counts[table]++
		}
	}
}

// snapshotReadBuffer is the read buffer of a snapshot stream's decoder.
const snapshotReadBuffer = 256 << 10

// snapshotDecoder is the state of one decodeSnapshot.
type snapshotDecoder struct {
	dec     *codec.Decoder
	restore *state.Restore // nil: decode and count only
	// jobs are the snapAllocJob records so far, by ordinal.
	jobs []*structs.Job
}

// checkVersion reads a snapVersion record's body and refuses a format
// newer than this build's, before any record of it is misread.
func (d *snapshotDecoder) checkVersion() error {
	var v uint
	if err := d.dec.Decode(&v); err != nil {
		return fmt.Errorf("fsm: restore: read format version: %w", err)
	}
	if v > snapshotFormatVersion {
		return fmt.Errorf("fsm: restore: snapshot format version %d is newer than this build reads (%d): %w",
			v, snapshotFormatVersion, ErrSnapshotNewer)
	}
	return nil
}

// sharedAlloc is a snapAllocShared record's body.
type sharedAlloc struct {
	Job   int
	Alloc *structs.Allocation
}

// record decodes one object of type rec and adds it to the restore.
func (d *snapshotDecoder) record(rec snapshotRecord) error {
	switch rec {
	case snapAllocJob:
		var j structs.Job
		if err := d.dec.Decode(&j); err != nil {
			return err
		}
		d.jobs = append(d.jobs, &j)
		return nil
	case snapAllocShared:
		var sa sharedAlloc
		if err := d.dec.Decode(&sa); err != nil {
			return err
		}
		if sa.Alloc == nil {
			return fmt.Errorf("shared-job allocation record without an allocation")
		}
		if sa.Job < 0 || sa.Job >= len(d.jobs) {
			return fmt.Errorf("allocation %q names job record %d, the stream has %d so far", sa.Alloc.ID, sa.Job, len(d.jobs))
		}
		// Allocations share the one job value, as they share their
		// job's value on the server that wrote them: objects in the
		// store are never mutated.
		sa.Alloc.Job = d.jobs[sa.Job]
		if d.restore == nil {
			return nil
		}
		return d.restore.Alloc(sa.Alloc)
	}
	return restoreRecord(d.dec, d.restore, rec)
}

// restoreRecord decodes one object of type rec and adds it to restore,
// unless restore is nil.
func restoreRecord(dec *codec.Decoder, restore *state.Restore, rec snapshotRecord) error {
	switch rec {
	case snapIndex:
		return decodeInto(dec, restore, (*state.Restore).IndexEntry)
	case snapNode:
		return decodeInto(dec, restore, (*state.Restore).Node)
	case snapJob:
		return decodeInto(dec, restore, (*state.Restore).Job)
	case snapAlloc:
		return decodeInto(dec, restore, (*state.Restore).Alloc)
	case snapEval:
		return decodeInto(dec, restore, (*state.Restore).Eval)
	case snapCSIVolume:
		return decodeInto(dec, restore, (*state.Restore).CSIVolume)
	case snapCSIPlugin:
		return decodeInto(dec, restore, (*state.Restore).CSIPlugin)
	case snapClusterMeta:
		return decodeInto(dec, restore, (*state.Restore).ClusterMetadata)
	case snapACLPolicy:
		return decodeInto(dec, restore, (*state.Restore).ACLPolicy)
	case snapACLToken:
		return decodeInto(dec, restore, (*state.Restore).ACLToken)
	case snapCSIFence:
		return decodeInto(dec, restore, (*state.Restore).CSIControllerFence)
	}
	return fmt.Errorf("unknown record type %d", rec)
}

// decodeInto decodes one T and, unless restore is nil, adds it with add.
func decodeInto[T any](dec *codec.Decoder, restore *state.Restore, add func(*state.Restore, *T) error) error {
	var v T
	if err := dec.Decode(&v); err != nil {
		return err
	}
	if restore == nil {
		return nil
	}
	return add(restore, &v)
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

	if err := write(snapVersion, snapshotFormatVersion); err != nil {
		return err
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
	jobRefs := newAllocJobs()
	for _, a := range allocs {
		if a.Job == nil {
			if err := write(snapAlloc, a); err != nil {
				return err
			}
			continue
		}
		ref, isNew, shared := jobRefs.ref(a.Job)
		if !shared {
			if err := write(snapAlloc, a); err != nil {
				return err
			}
			continue
		}
		if isNew {
			if err := write(snapAllocJob, a.Job); err != nil {
				return err
			}
		}
		c := *a
		c.Job = nil
		if err := write(snapAllocShared, &sharedAlloc{Job: ref, Alloc: &c}); err != nil {
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

// allocJobs assigns the ordinals of snapAllocJob records while a snapshot
// is written. Two allocations share a record only when their jobs are the
// same value or encode to the same bytes: the identity of a job version
// (namespace, ID, version, modify index) picks the record to compare with,
// never decides alone. On the leader the allocations of one plan share
// their job's value and the comparison is a pointer's; on a follower each
// applied plan decoded its own copies, and they are compared encoded.
type allocJobs struct {
	byKey map[allocJobKey]*allocJob
	next  int
	// h encodes for comparison only: canonical, so that equal maps
	// encode equally.
	h *codec.MsgpackHandle
}

type allocJobKey struct {
	namespace, id              string
	version, modify, jobModify uint64
}

type allocJob struct {
	ref     int
	job     *structs.Job
	encoded []byte // nil until a second value with the same key arrives
}

func newAllocJobs() *allocJobs {
	h := &codec.MsgpackHandle{}
	h.Canonical = true
	return &allocJobs{byKey: make(map[allocJobKey]*allocJob), h: h}
}

// ref returns the ordinal of the record that j may share, whether that
// record is still to be written (isNew), and false when j must be written
// inline: another job of the same identity with different contents holds
// the key, or j does not encode.
func (aj *allocJobs) ref(j *structs.Job) (ref int, isNew, shared bool) {
	k := allocJobKey{namespace: j.Namespace, id: j.ID, version: j.Version, modify: j.ModifyIndex, jobModify: j.JobModifyIndex}
	have, ok := aj.byKey[k]
	if !ok {
		have = &allocJob{ref: aj.next, job: j}
		aj.byKey[k] = have
		aj.next++
		return have.ref, true, true
	}
	if have.job == j {
		return have.ref, false, true
	}
	if have.encoded == nil {
		enc, err := aj.encode(have.job)
		if err != nil {
			return 0, false, false
		}
		have.encoded = enc
	}
	enc, err := aj.encode(j)
	if err != nil || !bytes.Equal(enc, have.encoded) {
		return 0, false, false
	}
	return have.ref, false, true
}

func (aj *allocJobs) encode(j *structs.Job) ([]byte, error) {
	var out []byte
	if err := codec.NewEncoderBytes(&out, aj.h).Encode(j); err != nil {
		return nil, err
	}
	return out, nil
}
