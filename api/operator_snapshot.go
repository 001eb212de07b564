package api

import (
	"io"
	"net/http"
	"strconv"
)

// SnapshotRestoreResult reports what a restore installed.
type SnapshotRestoreResult struct {
	// Index and Term are the snapshot's own; RestoredIndex is the Raft
	// index the restore was written at.
	Index         uint64
	Term          uint64
	RestoredIndex uint64
	Counts        map[string]int
}

// Snapshot saves a snapshot file of all server state. The caller reads
// it to the end and closes it; the file carries its own checksum, so a
// copy cut short is refused by inspect and restore.
func (op *Operator) Snapshot(q *QueryOptions) (io.ReadCloser, error) {
	r := op.c.newRequest(http.MethodGet, "/v1/operator/snapshot")
	op.c.setQueryOptions(r, q)
	resp, _, err := op.c.do(r)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// SnapshotRestore replaces all server state with the snapshot file read
// from in.
func (op *Operator) SnapshotRestore(in io.Reader, w *WriteOptions) (*WriteMeta, error) {
	_, wm, err := op.SnapshotRestoreResult(in, w)
	return wm, err
}

// SnapshotRestoreResult is SnapshotRestore that also returns what the
// restore installed.
func (op *Operator) SnapshotRestoreResult(in io.Reader, w *WriteOptions) (*SnapshotRestoreResult, *WriteMeta, error) {
	r := op.c.newRequest(http.MethodPut, "/v1/operator/snapshot")
	op.c.setWriteOptions(r, w)
	r.rawBody = in
	resp, rtt, err := op.c.do(r)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	wm := &WriteMeta{RequestTime: rtt}
	wm.LastIndex, _ = strconv.ParseUint(resp.Header.Get("X-Nomad-Index"), 10, 64)
	var out SnapshotRestoreResult
	if err := decodeBody(resp, &out); err != nil {
		return nil, nil, err
	}
	return &out, wm, nil
}
