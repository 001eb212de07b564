package nomad

import (
	"bytes"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/google/uuid"
	metrics "github.com/hashicorp/go-metrics"
	"github.com/hashicorp/raft"

	"github.com/roamhq/roam/structs"
)

// Snapshot files move between the leader and the agent serving the HTTP
// request in chunks, each an RPC of its own, so that no frame exceeds the
// RPC frame limit and a follower's agent can save or restore through the
// usual forwarding. The leader holds each file in memory between chunks.

const (
	// SnapshotChunkSize is the largest piece of a file one RPC carries.
	SnapshotChunkSize = 1 << 20
	// maxStagedSnapshots bounds the files the leader holds at once.
	maxStagedSnapshots = 4
	// stagedSnapshotTTL is how long a held file outlives its last use.
	stagedSnapshotTTL = 10 * time.Minute
	// snapshotRestoreTimeout bounds the Raft restore itself.
	snapshotRestoreTimeout = 2 * time.Minute
)

// snapshotStaging holds snapshot files between chunk RPCs.
type snapshotStaging struct {
	// mu guards files.
	mu    sync.Mutex
	files map[string]*stagedSnapshot
}

type stagedSnapshot struct {
	data    []byte
	upload  bool
	expires time.Time
}

// put holds data under a new ID, dropping expired files first. It refuses
// once maxStagedSnapshots are held.
func (st *snapshotStaging) put(data []byte, upload bool) (string, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.expireLocked(time.Now())
	if st.files == nil {
		st.files = make(map[string]*stagedSnapshot)
	}
	if len(st.files) >= maxStagedSnapshots {
		return "", fmt.Errorf("%w: %d snapshot transfers already in progress, try again later", structs.ErrInvalidRequest, len(st.files))
	}
	id := uuid.NewString()
	st.files[id] = &stagedSnapshot{data: data, upload: upload, expires: time.Now().Add(stagedSnapshotTTL)}
	return id, nil
}

// get returns the held file id of the given kind.
func (st *snapshotStaging) getLocked(id string, upload bool) (*stagedSnapshot, error) {
	st.expireLocked(time.Now())
	f, ok := st.files[id]
	if !ok || f.upload != upload {
		return nil, fmt.Errorf("%w: no snapshot transfer %q on this leader (expired, finished, or leadership changed)", structs.ErrNotFound, id)
	}
	f.expires = time.Now().Add(stagedSnapshotTTL)
	return f, nil
}

func (st *snapshotStaging) remove(id string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.files, id)
}

func (st *snapshotStaging) expireLocked(now time.Time) {
	for id, f := range st.files {
		if now.After(f.expires) {
			delete(st.files, id)
		}
	}
}

// snapshotMaxBytes is the largest snapshot file this server takes.
func (s *Server) snapshotMaxBytes() int64 {
	if s.config.SnapshotMaxBytes > 0 {
		return s.config.SnapshotMaxBytes
	}
	return DefaultSnapshotMaxBytes
}

// SaveSnapshotFile takes a point-in-time snapshot of all state through
// Raft and returns it as a snapshot file. Only the leader may.
func (s *Server) SaveSnapshotFile() (*SnapshotHeader, []byte, error) {
	start := time.Now()
	f := s.raft.Snapshot()
	if err := s.waitFuture(f); err != nil {
		return nil, nil, fmt.Errorf("take snapshot: %w", err)
	}
	meta, rc, err := f.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("open snapshot: %w", err)
	}
	defer rc.Close()
	limit := s.snapshotMaxBytes()
	body, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, nil, fmt.Errorf("read snapshot: %w", err)
	}
	if int64(len(body)) > limit {
		return nil, nil, fmt.Errorf("%w: state exceeds the snapshot size limit of %d bytes", ErrSnapshotTooLarge, limit)
	}
	hdr, file, err := buildSnapshotFile(meta.Index, meta.Term, int(meta.Version), s.config.Region, body)
	if err != nil {
		return nil, nil, err
	}
	metrics.MeasureSince([]string{"snapshot", "save"}, start)
	s.logger.Info("snapshot saved", "index", meta.Index, "term", meta.Term, "bytes", len(file), "duration", time.Since(start))
	return hdr, file, nil
}

// buildSnapshotFile counts the objects of an FSM snapshot body (which
// also checks that it decodes) and wraps it in a snapshot file. The body
// is this server's own, so it is decoded but not built into a store: an
// uploaded file is, before it is restored (parseSnapshotFile).
func buildSnapshotFile(index, term uint64, raftVersion int, region string, body []byte) (*SnapshotHeader, []byte, error) {
	counts, err := countSnapshot(bytes.NewReader(body))
	if err != nil {
		return nil, nil, fmt.Errorf("snapshot does not decode: %w", err)
	}
	hdr := &SnapshotHeader{
		Index:       index,
		Term:        term,
		RaftVersion: raftVersion,
		Region:      region,
		CreatedAt:   time.Now().UTC(),
		Counts:      counts,
	}
	file, err := encodeSnapshotFile(hdr, body)
	if err != nil {
		return nil, nil, err
	}
	hdr.Size = int64(len(body))
	return hdr, file, nil
}

// RestoreSnapshotFile checks a snapshot file completely, then replaces all
// state with it through Raft, so every server installs it. A file that
// fails a check changes nothing. The leader's duties restart over the
// restored state.
func (s *Server) RestoreSnapshotFile(file []byte) (*structs.SnapshotRestoreResponse, error) {
	start := time.Now()
	hdr, body, err := parseSnapshotFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", structs.ErrInvalidRequest, err)
	}
	if hdr.Region != s.config.Region {
		return nil, fmt.Errorf("%w: snapshot is of region %q, this cluster is %q", structs.ErrInvalidRequest, hdr.Region, s.config.Region)
	}
	meta := &raft.SnapshotMeta{
		Version: raft.SnapshotVersion(hdr.RaftVersion),
		Index:   hdr.Index,
		Term:    hdr.Term,
		Size:    int64(len(body)),
	}
	// The leader's duties stop first, and the controller calls in flight
	// (and their claim checkpoints) finish, as for a handoff: a call that
	// ended after the restore would checkpoint into the restored state.
	// Heartbeat timers, the eval broker and the volume watcher then start
	// again from the restored state, whether or not the restore worked.
	// A restore holds the duties as a handoff does, so the two never run
	// at once.
	if err := s.claimLeadership(s.shutdownCtx); err != nil {
		return nil, err
	}
	t, err := s.stopDuties(s.shutdownCtx)
	if err != nil {
		s.releaseLeadership(s.shutdownCtx, false, false)
		return nil, err
	}
	s.stopAndDrain(s.shutdownCtx, time.Now(), t, nil)
	reconcile := false
	defer func() { s.releaseLeadership(s.shutdownCtx, true, reconcile) }()
	if err := s.raft.Restore(meta, bytes.NewReader(body), snapshotRestoreTimeout); err != nil {
		return nil, fmt.Errorf("restore snapshot through raft: %w", err)
	}
	metrics.MeasureSince([]string{"snapshot", "restore"}, start)
	// Claims are reconciled, not replayed: the duties that start next also
	// compare what the plugins say is published with the restored claims.
	reconcile = true
	restored := s.raft.LastIndex()
	s.logger.Info("snapshot restored", "snapshot_index", hdr.Index, "snapshot_term", hdr.Term,
		"restored_index", restored, "counts", hdr.Counts, "duration", time.Since(start))
	return &structs.SnapshotRestoreResponse{Index: hdr.Index, Term: hdr.Term, RestoredIndex: restored, Counts: hdr.Counts}, nil
}

// SnapshotSave takes a snapshot on the leader and holds the file for
// SnapshotRead.
func (op *Operator) SnapshotSave(args *structs.SnapshotSaveRequest, reply *structs.SnapshotSaveResponse) error {
	if done, err := op.srv.forward("Operator.SnapshotSave", args, args, reply); done {
		return err
	}
	hdr, file, err := op.srv.SaveSnapshotFile()
	if err != nil {
		return err
	}
	id, err := op.srv.snapshots.put(file, false)
	if err != nil {
		return err
	}
	reply.ID, reply.Size, reply.Index, reply.Term = id, int64(len(file)), hdr.Index, hdr.Term
	return nil
}

// SnapshotRead returns one chunk of a held snapshot file; the last chunk
// releases it.
func (op *Operator) SnapshotRead(args *structs.SnapshotChunkRequest, reply *structs.SnapshotChunkResponse) error {
	if done, err := op.srv.forward("Operator.SnapshotRead", args, args, reply); done {
		return err
	}
	st := &op.srv.snapshots
	st.mu.Lock()
	f, err := st.getLocked(args.ID, false)
	if err != nil {
		st.mu.Unlock()
		return err
	}
	data := f.data
	st.mu.Unlock()
	if args.Offset < 0 || args.Offset > int64(len(data)) {
		return fmt.Errorf("%w: offset %d outside the snapshot's %d bytes", structs.ErrInvalidRequest, args.Offset, len(data))
	}
	end := min(args.Offset+SnapshotChunkSize, int64(len(data)))
	reply.Data = data[args.Offset:end]
	reply.Done = end == int64(len(data))
	if reply.Done {
		st.remove(args.ID)
	}
	return nil
}

// SnapshotUpload appends one chunk to an upload held on the leader,
// starting a new one when ID is empty.
func (op *Operator) SnapshotUpload(args *structs.SnapshotUploadRequest, reply *structs.SnapshotUploadResponse) error {
	if done, err := op.srv.forward("Operator.SnapshotUpload", args, args, reply); done {
		return err
	}
	if len(args.Data) > SnapshotChunkSize {
		return fmt.Errorf("%w: chunk of %d bytes exceeds %d", structs.ErrInvalidRequest, len(args.Data), SnapshotChunkSize)
	}
	st := &op.srv.snapshots
	if args.ID == "" {
		if args.Offset != 0 {
			return fmt.Errorf("%w: a new upload starts at offset 0, not %d", structs.ErrInvalidRequest, args.Offset)
		}
		id, err := st.put(append([]byte(nil), args.Data...), true)
		if err != nil {
			return err
		}
		reply.ID, reply.Received = id, int64(len(args.Data))
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	f, err := st.getLocked(args.ID, true)
	if err != nil {
		return err
	}
	if args.Offset != int64(len(f.data)) {
		return fmt.Errorf("%w: chunk at offset %d, upload %s has %d bytes", structs.ErrInvalidRequest, args.Offset, args.ID, len(f.data))
	}
	if limit := op.srv.snapshotMaxBytes(); int64(len(f.data)+len(args.Data)) > limit {
		delete(st.files, args.ID)
		return fmt.Errorf("%w: %w: more than %d bytes", structs.ErrInvalidRequest, ErrSnapshotTooLarge, limit)
	}
	f.data = append(f.data, args.Data...)
	reply.ID, reply.Received = args.ID, int64(len(f.data))
	return nil
}

// SnapshotRestore restores a finished upload through Raft and forgets it,
// whether or not the restore succeeded.
func (op *Operator) SnapshotRestore(args *structs.SnapshotRestoreRequest, reply *structs.SnapshotRestoreResponse) error {
	if done, err := op.srv.forward("Operator.SnapshotRestore", args, args, reply); done {
		return err
	}
	st := &op.srv.snapshots
	st.mu.Lock()
	f, err := st.getLocked(args.ID, true)
	if err != nil {
		st.mu.Unlock()
		return err
	}
	delete(st.files, args.ID)
	st.mu.Unlock()
	resp, err := op.srv.RestoreSnapshotFile(f.data)
	if err != nil {
		return err
	}
	*reply = *resp
	return nil
}
