package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"

	"github.com/roamhq/roam/client"
	"github.com/roamhq/roam/structs"
)

// logsPathPrefix is the route that takes an allocation ID and answers
// with a task's log.
const logsPathPrefix = "/v1/client/fs/logs/"

// logProxyHeader marks a logs request one agent passed on to the agent of
// the allocation's node, which must answer it itself or fail: requests
// are passed on at most once.
const logProxyHeader = "X-Roam-Log-Proxy"

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
// request is passed on to that node's agent and its answer relayed.
func (s *HTTPServer) allocLogs(w http.ResponseWriter, r *http.Request) (any, error) {
	p, err := parseLogParams(r)
	if err != nil {
		return nil, err
	}
	var q structs.QueryOptions
	if err := s.parseQuery(r, &q); err != nil {
		return nil, err
	}
	q.Prefix, q.MinQueryIndex = "", 0
	args := structs.AllocSpecificRequest{AllocID: pathID(r, logsPathPrefix), QueryOptions: q}
	var reply structs.SingleAllocResponse
	if err := s.rpc(r, "Alloc.GetAlloc", &args, &reply); err != nil {
		return nil, err
	}
	alloc := reply.Alloc
	if alloc == nil {
		return nil, errNotFound("alloc")
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
	if r.Header.Get(logProxyHeader) != "" {
		return nil, badRequest("alloc %s is not on this node", alloc.ID)
	}
	return nil, s.proxyLogs(w, r, alloc, p)
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

// logProxyClient passes logs requests on; no overall timeout, since a log
// may be long, but bound to the request's context.
var logProxyClient = &http.Client{}

// relayNode finds the node to relay a logs request to with the agent's
// own authority, not the caller's: the caller was checked for read-logs
// already, and needs no node read to have its logs relayed. A server
// agent reads its own state; a client agent asks with its node secret.
func (s *HTTPServer) relayNode(r *http.Request, nodeID string) (*structs.Node, error) {
	if srv := s.agent.Server(); srv != nil {
		return srv.State().NodeByID(nil, nodeID)
	}
	args := structs.NodeSpecificRequest{NodeID: nodeID}
	args.Region = s.region(r)
	args.AllowStale = true
	var reply structs.SingleNodeResponse
	if err := s.agent.RPCContext(r.Context(), "Node.GetNode", &args, &reply); err != nil {
		return nil, err
	}
	return reply.Node, nil
}

// proxyLogs asks the agent of the allocation's node for the log and
// relays its answer.
func (s *HTTPServer) proxyLogs(w http.ResponseWriter, r *http.Request, alloc *structs.Allocation, p logParams) error {
	node, err := s.relayNode(r, alloc.NodeID)
	if err != nil {
		return err
	}
	if node == nil || node.HTTPAddr == "" {
		return &codedError{code: http.StatusBadGateway,
			msg: fmt.Sprintf("alloc %s is on node %s, whose HTTP address is unknown", alloc.ID, alloc.NodeID)}
	}
	params := url.Values{}
	params.Set("task", p.task)
	params.Set("type", p.stream)
	params.Set("origin", p.origin)
	params.Set("offset", strconv.FormatInt(p.offset, 10))
	params.Set("plain", "true")
	target := "http://" + node.HTTPAddr + logsPathPrefix + url.PathEscape(alloc.ID) + "?" + params.Encode()
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, target, nil)
	if err != nil {
		return fmt.Errorf("build logs request for node %s: %w", alloc.NodeID, err)
	}
	req.Header.Set(logProxyHeader, "1")
	if tok := r.Header.Get("X-Nomad-Token"); tok != "" {
		req.Header.Set("X-Nomad-Token", tok)
	}
	resp, err := logProxyClient.Do(req)
	if err != nil {
		return &codedError{code: http.StatusBadGateway,
			msg: fmt.Sprintf("alloc %s is on node %s; asking its agent at http://%s failed: %v",
				alloc.ID, alloc.NodeID, node.HTTPAddr, err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return &codedError{code: resp.StatusCode, msg: string(trimNewline(msg))}
	}
	streamPlain(w, resp.Body)
	return nil
}

func trimNewline(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
