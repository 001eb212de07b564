package agent

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/roamhq/roam/nomad"
	"github.com/roamhq/roam/structs"
)

// snapshotSave answers GET /v1/operator/snapshot with a snapshot file of
// all server state, as Nomad's does: the file is the body, and
// X-Nomad-Index is the Raft index it was taken at. The whole file is
// fetched from the leader before the first byte is written, so a failure
// half-way is an error status rather than a short file.
func (s *HTTPServer) snapshotSave(w http.ResponseWriter, r *http.Request) (any, error) {
	args := structs.SnapshotSaveRequest{}
	s.parseWrite(r, &args.WriteRequest)
	var save structs.SnapshotSaveResponse
	if err := s.rpc(r, "Operator.SnapshotSave", &args, &save); err != nil {
		return nil, err
	}
	file := make([]byte, 0, save.Size)
	for {
		req := structs.SnapshotChunkRequest{ID: save.ID, Offset: int64(len(file)), WriteRequest: args.WriteRequest}
		var chunk structs.SnapshotChunkResponse
		if err := s.rpc(r, "Operator.SnapshotRead", &req, &chunk); err != nil {
			return nil, err
		}
		if int64(len(file)+len(chunk.Data)) > save.Size {
			return nil, fmt.Errorf("snapshot %s: leader sent more than the %d bytes it announced", save.ID, save.Size)
		}
		file = append(file, chunk.Data...)
		if chunk.Done {
			break
		}
		if len(chunk.Data) == 0 {
			return nil, fmt.Errorf("snapshot %s: leader sent an empty chunk at offset %d", save.ID, len(file))
		}
	}
	if int64(len(file)) != save.Size {
		return nil, fmt.Errorf("snapshot %s: got %d bytes, leader announced %d", save.ID, len(file), save.Size)
	}
	m := s.localMeta()
	m.Index = save.Index
	setMeta(w, m)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(file)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(file)
	return nil, nil
}

// snapshotRestore answers PUT /v1/operator/snapshot: the body is a
// snapshot file, which the leader checks in full and then restores
// through Raft. A file that fails a check is a 400 and changes nothing.
func (s *HTTPServer) snapshotRestore(w http.ResponseWriter, r *http.Request) (any, error) {
	args := structs.WriteRequest{}
	s.parseWrite(r, &args)
	limit := nomad.DefaultSnapshotMaxBytes
	if srv := s.agent.server; srv != nil {
		if l := srv.Config().SnapshotMaxBytes; l > 0 {
			limit = l
		}
	}
	file, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, &codedError{code: http.StatusRequestEntityTooLarge,
				msg: fmt.Sprintf("Snapshot larger than %d bytes", limit)}
		}
		var coded *codedError
		if errors.As(err, &coded) {
			return nil, coded
		}
		return nil, badRequest("Reading the snapshot: %v", err)
	}
	if len(file) == 0 {
		return nil, badRequest("Request body is empty: send a snapshot file")
	}
	var id string
	for off := 0; off < len(file); {
		end := min(off+nomad.SnapshotChunkSize, len(file))
		req := structs.SnapshotUploadRequest{ID: id, Offset: int64(off), Data: file[off:end], WriteRequest: args}
		var up structs.SnapshotUploadResponse
		if err := s.rpc(r, "Operator.SnapshotUpload", &req, &up); err != nil {
			return nil, err
		}
		id, off = up.ID, end
	}
	var reply structs.SnapshotRestoreResponse
	if err := s.rpc(r, "Operator.SnapshotRestore", &structs.SnapshotRestoreRequest{ID: id, WriteRequest: args}, &reply); err != nil {
		return nil, err
	}
	m := s.localMeta()
	m.Index = max(reply.RestoredIndex, m.Index)
	setMeta(w, m)
	return &reply, nil
}
