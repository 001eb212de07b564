package agent

import (
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
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
