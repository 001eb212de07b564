package agent

import (
	"errors"
	"io"
	"io/fs"
	"net/http"
	"strconv"

	"github.com/roamhq/roam/client"
	"github.com/roamhq/roam/structs"
)

// logsPathPrefix is the route that takes an allocation ID and answers
// with a task's log.
const logsPathPrefix = "/v1/client/fs/logs/"

// allocLogger reads a task's log on this agent's client: stream is
// "stdout" or "stderr", origin "start" or "end", and offset counts bytes
// from the origin.
type allocLogger interface {
	AllocLogs(allocID, task, stream, origin string, offset int64) (io.ReadCloser, error)
}

var _ allocLogger = (*client.Client)(nil)

// logParams are the query parameters of a logs request.
type logParams struct {
	task   string
	stream string
	origin string
	offset int64
}

func parseLogParams(r *http.Request) (logParams, error) {
	q := r.URL.Query()
	p := logParams{task: q.Get("task"), stream: q.Get("type"), origin: q.Get("origin")}
	switch p.stream {
	case "":
		p.stream = "stdout"
	case "stdout", "stderr":
	default:
		return p, badRequest("Invalid log type %q: must be stdout or stderr", p.stream)
	}
	switch p.origin {
	case "":
		p.origin = "start"
	case "start", "end":
	default:
		return p, badRequest("Invalid origin %q: must be start or end", p.origin)
	}
	if raw := q.Get("offset"); raw != "" {
		off, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || off < 0 {
			return p, badRequest("Invalid offset %q: must be a non-negative integer", raw)
		}
		p.offset = off
	}
	if follow, err := boolParam(r, "follow"); err != nil {
		return p, err
	} else if follow {
		return p, badRequest("follow is not supported: read the log again from an offset")
	}
	if plain, err := boolParam(r, "plain"); err != nil {
		return p, err
	} else if _, set := q["plain"]; set && !plain {
		return p, badRequest("plain=false (framed output) is not supported")
	}
	return p, nil
}

// allocLogs answers GET /v1/client/fs/logs/:alloc with a task's stdout or
// stderr as plain text (Nomad's plain=true; Roam has no framed output, so
// plain is also the default). The task may be left out when the
// allocation's group has one. When another node runs the allocation, the
// log is read from that node through the servers (see relayLogs).
func (s *HTTPServer) allocLogs(w http.ResponseWriter, r *http.Request) (any, error) {
	p, err := parseLogParams(r)
	if err != nil {
		return nil, err
	}
	alloc, err := s.clientRouteAlloc(r, logsPathPrefix)
	if err != nil {
		return nil, err
	}
	if p.task == "" {
		if p.task, err = onlyTask(alloc); err != nil {
			return nil, err
		}
	}

	cl := s.agent.Client()
	if cl != nil && cl.NodeID() == alloc.NodeID {
		rc, err := allocLogger(cl).AllocLogs(alloc.ID, p.task, p.stream, p.origin, p.offset)
		if err != nil {
			return nil, logError(err)
		}
		defer rc.Close()
		streamPlain(w, rc)
		return nil, nil
	}
	return nil, s.relayLogs(w, r, alloc, p)
}

// clientRouteAlloc reads the allocation a /v1/client route names after
// prefix, with the caller's token: the route then reads it on this
// agent's client or relays through the servers to its node.
func (s *HTTPServer) clientRouteAlloc(r *http.Request, prefix string) (*structs.Allocation, error) {
	var q structs.QueryOptions
	if err := s.parseQuery(r, &q); err != nil {
		return nil, err
	}
	q.Prefix, q.MinQueryIndex = "", 0
	args := structs.AllocSpecificRequest{AllocID: pathID(r, prefix), QueryOptions: q}
	var reply structs.SingleAllocResponse
	if err := s.rpc(r, "Alloc.GetAlloc", &args, &reply); err != nil {
		return nil, err
	}
	if reply.Alloc == nil {
		return nil, errNotFound("alloc")
	}
	return reply.Alloc, nil
}

// logError maps the client's log errors to HTTP statuses.
func logError(err error) error {
	switch {
	case errors.Is(err, client.ErrUnknownAlloc), errors.Is(err, client.ErrUnknownTask),
		errors.Is(err, client.ErrNoLogs), errors.Is(err, fs.ErrNotExist):
		return &codedError{code: http.StatusNotFound, msg: err.Error()}
	case errors.Is(err, client.ErrBadLogRequest):
		return &codedError{code: http.StatusBadRequest, msg: err.Error()}
	}
	return err
}

// onlyTask names the allocation's task when its group has exactly one.
func onlyTask(alloc *structs.Allocation) (string, error) {
	var tg *structs.TaskGroup
	if alloc.Job != nil {
		tg = alloc.Job.LookupTaskGroup(alloc.TaskGroup)
	}
	if tg == nil {
		return "", badRequest("task must be specified: the allocation's group is unknown")
	}
	if len(tg.Tasks) != 1 {
		names := make([]string, 0, len(tg.Tasks))
		for _, t := range tg.Tasks {
			names = append(names, t.Name)
		}
		return "", badRequest("task must be specified: group %q has tasks %v", tg.Name, names)
	}
	return tg.Tasks[0].Name, nil
}

// streamPlain copies a log to w as plain text, flushing as it goes so a
// long log reaches the reader while it is read.
func streamPlain(w http.ResponseWriter, src io.Reader) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if err != nil {
			// A read error after the status is sent can only end the body.
			return
		}
	}
}

// relayLogs reads the log from the allocation's node through the
// servers, which reach the node over its own session, a piece at a time,
// and streams it as it arrives. The caller's token goes to the servers,
// never to the node, and no request goes to an address the node reported
// about itself. Like a local read, it ends at the size the log had when
// the first piece was read.
func (s *HTTPServer) relayLogs(w http.ResponseWriter, r *http.Request, alloc *structs.Allocation, p logParams) error {
	args := structs.AllocLogsRequest{AllocID: alloc.ID, Task: p.task, Stream: p.stream, Origin: p.origin, Offset: p.offset}
	args.Region = s.region(r)
	args.AuthToken = r.Header.Get("X-Nomad-Token")
	flusher, _ := w.(http.Flusher)
	started := false
	var end int64
	for {
		var reply structs.AllocLogsResponse
		if err := s.rpc(r, "Alloc.Logs", &args, &reply); err != nil {
			if !started {
				return err
			}
			// A failure after the status is sent can only end the body.
			return nil
		}
		if !started {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusOK)
			started, end = true, reply.Size
		}
		if len(reply.Data) > 0 {
			if _, err := w.Write(reply.Data); err != nil {
				return nil
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		next := reply.Offset + int64(len(reply.Data))
		if len(reply.Data) == 0 || next >= end {
			return nil
		}
		args.Origin, args.Offset = "start", next
	}
}
