package agent

import (
	"bytes"
	"net/http"
	"net/http/pprof"
	"net/url"
	"strconv"
	"strings"

	"github.com/roamhq/roam/internal/profile"
	"github.com/roamhq/roam/structs"
)

// debugPathPrefix is where an agent with enable_debug serves Go's
// profiles, as Nomad's does.
const debugPathPrefix = "/debug/pprof/"

// debugPprof answers /debug/pprof/...: 404, as for any unknown path, unless
// the agent runs with enable_debug. With ACLs on, only a token with
// agent:write gets here (httpACLRules): a CPU profile or an execution
// trace costs the agent, and a goroutine dump shows what it is doing.
// Profiles are pprof's own handlers, not the process's default mux.
func (s *HTTPServer) debugPprof(w http.ResponseWriter, r *http.Request) (any, error) {
	if !s.agent.config.EnableDebug {
		return nil, &codedError{code: http.StatusNotFound, msg: "Invalid URL path " + strconv.Quote(r.URL.Path) + " (the agent runs without enable_debug)"}
	}
	switch strings.TrimPrefix(r.URL.Path, debugPathPrefix) {
	case "cmdline":
		pprof.Cmdline(w, r)
	case "profile":
		pprof.Profile(w, r)
	case "symbol":
		pprof.Symbol(w, r)
	case "trace":
		pprof.Trace(w, r)
	default:
		// The index, and every named profile (heap, goroutine, ...).
		pprof.Index(w, r)
	}
	return nil, nil
}

// agentPprofPrefix is where the agent serves profiles of itself or, with
// server_id, of any server, as Nomad's /v1/agent/pprof/ does.
const agentPprofPrefix = "/v1/agent/pprof/"

// agentPprof answers GET /v1/agent/pprof/<kind>: profile (CPU, for
// seconds), trace, or a named profile (goroutine, heap, allocs,
// threadcreate, block, mutex), with seconds, debug and gc as pprof reads
// them. Without server_id the agent takes it of itself; with server_id (an
// ID, or "leader") the cluster passes it to that server. ACL agent:write
// (httpACLRules); with ACLs off, the agent profiled must run with
// enable_debug. The answer names the server in X-Roam-Server-ID and
// X-Roam-Server-Name.
func (s *HTTPServer) agentPprof(w http.ResponseWriter, r *http.Request) (any, error) {
	q := r.URL.Query()
	req := profile.Request{Kind: strings.TrimPrefix(r.URL.Path, agentPprofPrefix)}
	var err error
	if req.Seconds, err = intParam(q, "seconds"); err != nil {
		return nil, err
	}
	if req.Debug, err = intParam(q, "debug"); err != nil {
		return nil, err
	}
	if raw := q.Get("gc"); raw != "" {
		if req.GC, err = strconv.ParseBool(raw); err != nil {
			return nil, badRequest("Invalid gc %q: must be true or false", raw)
		}
	}
	if err := req.Validate(); err != nil {
		return nil, badRequest("%v", err)
	}
	var (
		payload  []byte
		id, name string
	)
	if serverID := q.Get("server_id"); serverID != "" {
		args := structs.AgentProfileRequest{ServerID: serverID, Kind: req.Kind, Seconds: req.Seconds, Debug: req.Debug, GC: req.GC}
		args.Region, args.AuthToken = s.region(r), r.Header.Get("X-Nomad-Token")
		var reply structs.AgentProfileResponse
		if err := s.rpc(r, "Agent.Profile", &args, &reply); err != nil {
			return nil, err
		}
		payload, id, name = reply.Payload, reply.ServerID, reply.ServerName
	} else {
		if !s.agent.config.aclEnabled() && !s.agent.config.EnableDebug {
			return nil, &codedError{code: http.StatusForbidden, msg: "this agent runs without enable_debug, and ACLs are off: its profiles are not served"}
		}
		var buf bytes.Buffer
		if err := profile.Take(r.Context(), req, &buf); err != nil {
			// A busy profiler is structs.ErrProfileInProgress (409), one
			// too large structs.ErrInvalidRequest (400): errorStatus.
			return nil, err
		}
		payload, name = buf.Bytes(), s.agent.config.Name
		if srv := s.agent.Server(); srv != nil {
			id = srv.ID()
		}
	}
	if req.Text() {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	} else {
		w.Header().Set("Content-Type", "application/octet-stream")
	}
	w.Header().Set("X-Roam-Server-ID", id)
	w.Header().Set("X-Roam-Server-Name", name)
	_, _ = w.Write(payload)
	return nil, nil
}

// intParam reads a non-negative integer query parameter, 0 when absent.
func intParam(q url.Values, name string) (int, error) {
	raw := q.Get(name)
	if raw == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < 0 {
		return 0, badRequest("Invalid %s %q: must be a non-negative integer", name, raw)
	}
	return n, nil
}
