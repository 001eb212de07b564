package agent

import (
	"errors"
	"net/http"

	"github.com/roamhq/roam/client"
	"github.com/roamhq/roam/structs"
)

// Nomad's routes that read an allocation's directory.
const (
	fsLsPathPrefix   = "/v1/client/fs/ls/"
	fsStatPathPrefix = "/v1/client/fs/stat/"
	fsCatPathPrefix  = "/v1/client/fs/cat/"
)

// allocFSCall answers one fs request: on this agent's client when it runs
// the allocation, else on its node through the servers.
func (s *HTTPServer) allocFSCall(r *http.Request, prefix string, req structs.AllocFSRequest) (*structs.AllocFSResponse, error) {
	alloc, err := s.clientRouteAlloc(r, prefix)
	if err != nil {
		return nil, err
	}
	req.AllocID = alloc.ID
	if cl := s.agent.Client(); cl != nil && cl.NodeID() == alloc.NodeID {
		resp, err := cl.AllocFS(&req)
		if errors.Is(err, client.ErrFSDenied) {
			return nil, &codedError{code: http.StatusForbidden, msg: err.Error()}
		}
		if err != nil {
			return nil, logError(err)
		}
		return resp, nil
	}
	req.Region = s.region(r)
	req.AuthToken = r.Header.Get("X-Nomad-Token")
	var resp structs.AllocFSResponse
	if err := s.rpc(r, "Alloc.FS", &req, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

func fsQueryPath(r *http.Request) string {
	if p := r.URL.Query().Get("path"); p != "" {
		return p
	}
	return "/"
}

// allocFSList answers GET /v1/client/fs/ls/:alloc?path= with the
// directory's entries.
func (s *HTTPServer) allocFSList(w http.ResponseWriter, r *http.Request) (any, error) {
	resp, err := s.allocFSCall(r, fsLsPathPrefix, structs.AllocFSRequest{Op: structs.AllocFSList, Path: fsQueryPath(r)})
	if err != nil {
		return nil, err
	}
	return resp.Files, nil
}

// allocFSStat answers GET /v1/client/fs/stat/:alloc?path= with one file.
func (s *HTTPServer) allocFSStat(w http.ResponseWriter, r *http.Request) (any, error) {
	resp, err := s.allocFSCall(r, fsStatPathPrefix, structs.AllocFSRequest{Op: structs.AllocFSStat, Path: fsQueryPath(r)})
	if err != nil {
		return nil, err
	}
	return resp.File, nil
}

// allocFSCat answers GET /v1/client/fs/cat/:alloc?path= with the file's
// bytes, read a piece at a time up to the size it had at the first piece.
func (s *HTTPServer) allocFSCat(w http.ResponseWriter, r *http.Request) (any, error) {
	req := structs.AllocFSRequest{Op: structs.AllocFSCat, Path: fsQueryPath(r)}
	started := false
	var end int64
	for {
		resp, err := s.allocFSCall(r, fsCatPathPrefix, req)
		if err != nil {
			if !started {
				return nil, err
			}
			return nil, nil // after the status, a failure can only end the body
		}
		if !started {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.WriteHeader(http.StatusOK)
			started, end = true, resp.Size
		}
		if len(resp.Data) > 0 {
			if _, err := w.Write(resp.Data); err != nil {
				return nil, nil
			}
		}
		next := resp.Offset + int64(len(resp.Data))
		if len(resp.Data) == 0 || next >= end {
			return nil, nil
		}
		req.Offset = next
	}
}
