package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/roamhq/roam/internal/connlimit"
	"github.com/roamhq/roam/internal/ratelog"
	"github.com/roamhq/roam/structs"
)

// HTTPServer serves the v1 HTTP API: JSON in Nomad's paths and field names,
// with Nomad's index headers and blocking-query parameters, so that Nomad's
// API clients work for the parts Roam has.
type HTTPServer struct {
	agent    *Agent
	logger   hclog.Logger
	listener net.Listener
	srv      *http.Server
	// routes maps an exact path (or, for routes that take an ID, a path
	// prefix ending in "/") to its handlers by method.
	routes map[string]map[string]handlerFunc

	// eventHeartbeat is how often an idle event stream gets "{}"
	// (defaultEventHeartbeat when 0; tests shorten it).
	eventHeartbeat atomic.Int64

	// shutdownCh is closed when Shutdown starts; requests still waiting on
	// an RPC give up then instead of holding Shutdown up.
	shutdownCh chan struct{}
	// rpcWaiting counts requests waiting on an RPC.
	rpcWaiting atomic.Int64
	// connLimiter counts the connections open per remote address.
	connLimiter *connlimit.Limiter
	// connLog logs refused connections and cut-off bodies, rate-limited.
	connLog *ratelog.Logger
	// bodyTimeout bounds reading one request body; zero for no bound.
	bodyTimeout time.Duration

	serveDone    chan struct{}
	shutdownOnce sync.Once
	shutdownErr  error
}

// handlerFunc serves one route. It returns the object to answer with as
// JSON, or an error to answer with its status. A nil object and nil error
// mean the handler wrote the response itself.
type handlerFunc func(w http.ResponseWriter, r *http.Request) (any, error)

// nodePathPrefix is the route that takes a node ID after it.
const nodePathPrefix = "/v1/node/"

// NewHTTPServer starts serving the API on ln.
func NewHTTPServer(a *Agent, ln net.Listener, logger hclog.Logger) *HTTPServer {
	limits := a.config.limits()
	s := &HTTPServer{
		agent:       a,
		logger:      logger,
		listener:    ln,
		shutdownCh:  make(chan struct{}),
		serveDone:   make(chan struct{}),
		connLimiter: connlimit.New(limits.HTTPMaxConnsPerClient),
		connLog:     ratelog.New(logger, ratelog.DefaultWindow),
		bodyTimeout: parseDurationOr(limits.HTTPBodyReadTimeout, 0),
	}
	s.routes = map[string]map[string]handlerFunc{
		"/v1/status/leader":               {http.MethodGet: s.statusLeader},
		statusLeadershipPath:              {http.MethodGet: s.statusLeadership},
		"/v1/status/peers":                {http.MethodGet: s.statusPeers},
		"/v1/agent/self":                  {http.MethodGet: s.agentSelf},
		"/v1/agent/members":               {http.MethodGet: s.agentMembers},
		"/v1/nodes":                       {http.MethodGet: s.nodesList},
		nodePathPrefix:                    {http.MethodGet: s.nodeGet},
		"/v1/operator/raft/configuration": {http.MethodGet: s.raftConfiguration},
		"/v1/operator/raft/peer":          {http.MethodDelete: notClientCert(s.raftRemovePeer)},
		"/v1/operator/raft/transfer-leadership": {
			http.MethodPut:  notClientCert(s.raftTransferLeadership),
			http.MethodPost: notClientCert(s.raftTransferLeadership),
		},
		"/v1/operator/snapshot": {
			http.MethodGet: notClientCert(s.snapshotSave),
			http.MethodPut: notClientCert(s.snapshotRestore),
		},
		"/v1/metrics":   {http.MethodGet: s.metrics},
		eventStreamPath: {http.MethodGet: s.eventStream},
	}
	s.addWorkloadRoutes()
	s.addCSIRoutes()
	s.addCSICreateRoutes()
	s.addACLRoutes()
	s.routes[debugPathPrefix] = map[string]handlerFunc{http.MethodGet: s.debugPprof, http.MethodPost: s.debugPprof}
	s.routes[agentPprofPrefix] = map[string]handlerFunc{http.MethodGet: s.agentPprof}
	s.srv = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		// No write timeout: a blocking query may legitimately wait minutes.
		// No ReadTimeout: bodies are bounded per request instead
		// (limitBodyRead), which answers 408 naming the limit, and counts
		// and logs the cut.
		ErrorLog: logger.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}
	var limited net.Listener = connlimit.Listen(ln, s.connLimiter, s.refuseOverCap)
	if a.tls.HTTP() {
		// The handshake is bounded by ReadHeaderTimeout, as the first
		// request's header would be.
		limited = tls.NewListener(limited, a.tls.IncomingHTTPSConfig())
	}
	go func() {
		defer close(s.serveDone)
		if err := s.srv.Serve(limited); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("http server stopped", "error", err)
		}
	}()
	return s
}

// Addr is the bound address.
func (s *HTTPServer) Addr() string { return s.listener.Addr().String() }

// Shutdown stops accepting and waits for in-flight requests until ctx ends.
// Requests waiting on an RPC (a blocking query, or a wait for a leader) are
// answered with 503 at once; the RPC itself ends on its own bound. Safe to
// call twice; the second call returns the first one's result.
func (s *HTTPServer) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() {
		close(s.shutdownCh)
		defer s.connLog.Stop()
		if err := s.srv.Shutdown(ctx); err != nil {
			s.shutdownErr = fmt.Errorf("http shutdown: %w", err)
			return
		}
		select {
		case <-s.serveDone:
		case <-ctx.Done():
			s.shutdownErr = fmt.Errorf("http shutdown: %w", ctx.Err())
		}
	})
	return s.shutdownErr
}

// ServeHTTP routes a request, answers it, and logs it at debug level.
func (s *HTTPServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	s.limitBodyRead(w, r)
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	defer func() {
		s.logger.Debug("request", "method", r.Method, "path", r.URL.Path,
			"status", rec.status, "duration", time.Since(start), "remote", r.RemoteAddr)
	}()

	if p := r.URL.Path; p == "/" || p == "/ui" || strings.HasPrefix(p, uiPathPrefix) {
		s.serveUI(rec, r)
		return
	}
	route, methods := s.match(r.URL.EscapedPath())
	if methods == nil {
		s.writeError(rec, &codedError{code: http.StatusNotFound, msg: "Invalid URL path " + strconv.Quote(r.URL.Path)})
		return
	}
	h, ok := methods[r.Method]
	if !ok {
		allowed := make([]string, 0, len(methods))
		for m := range methods {
			allowed = append(allowed, m)
		}
		sort.Strings(allowed)
		rec.Header().Set("Allow", strings.Join(allowed, ", "))
		s.writeError(rec, &codedError{code: http.StatusMethodNotAllowed, msg: "Invalid method " + r.Method})
		return
	}
	if err := checkPathID(r.URL.EscapedPath()); err != nil {
		s.writeError(rec, err)
		return
	}
	if err := s.authorizeHTTP(r, route); err != nil {
		s.writeError(rec, err)
		return
	}
	obj, err := h(rec, r)
	switch {
	case err != nil:
		s.writeError(rec, err)
	case obj != nil:
		s.writeJSON(rec, r, obj)
	}
}

// idPrefixes are the routes that take an ID after them, optionally
// followed by one more segment naming a sub-resource
// (/v1/job/:id/allocations). Such routes are keyed as the prefix alone,
// or as subRoute(prefix, sub).
var idPrefixes = []string{
	nodePathPrefix, jobPathPrefix, allocPathPrefix, evalPathPrefix, logsPathPrefix, clientAllocPathPrefix,
	fsLsPathPrefix, fsStatPathPrefix, fsCatPathPrefix,
	csiVolumePathPrefix, csiPluginPathPrefix, aclPolicyPathPrefix, aclTokenPathPrefix,
}

// idPrefixKinds names the kind of ID each ID route takes, for
// structs.ValidateID.
var idPrefixKinds = map[string]string{
	nodePathPrefix:        structs.IDKindNode,
	jobPathPrefix:         structs.IDKindJob,
	allocPathPrefix:       structs.IDKindAlloc,
	evalPathPrefix:        structs.IDKindEval,
	logsPathPrefix:        structs.IDKindAlloc,
	clientAllocPathPrefix: structs.IDKindAlloc,
	fsLsPathPrefix:        structs.IDKindAlloc,
	fsStatPathPrefix:      structs.IDKindAlloc,
	fsCatPathPrefix:       structs.IDKindAlloc,
	csiVolumePathPrefix:   structs.IDKindVolume,
	csiPluginPathPrefix:   structs.IDKindPlugin,
	aclPolicyPathPrefix:   structs.IDKindACLPolicy,
	aclTokenPathPrefix:    structs.IDKindACLToken,
}

// checkPathID refuses, as a 400 naming it, an ID in the (escaped) path
// that no object could have: one structs.ValidateID refuses, escaped
// slashes, dots and NULs included. Handlers then only ever see IDs that
// are safe as file names.
func checkPathID(path string) error {
	for _, prefix := range idPrefixes {
		rest, ok := strings.CutPrefix(path, prefix)
		if !ok {
			continue
		}
		raw, _, _ := strings.Cut(rest, "/")
		id, err := url.PathUnescape(raw)
		if err != nil {
			return badRequest("Invalid %s %q in the URL path: %v", idPrefixKinds[prefix], raw, err)
		}
		return structs.ValidateID(idPrefixKinds[prefix], id)
	}
	return nil
}

// subRoute is the routes key of a sub-resource of an ID route.
func subRoute(prefix, sub string) string { return prefix + "*/" + sub }

// match returns the route key and handlers for the (escaped) path, or
// nil handlers when there is no such route.
func (s *HTTPServer) match(path string) (string, map[string]handlerFunc) {
	if strings.HasPrefix(path, debugPathPrefix) {
		return debugPathPrefix, s.routes[debugPathPrefix]
	}
	if rest, ok := strings.CutPrefix(path, agentPprofPrefix); ok && rest != "" && !strings.Contains(rest, "/") {
		return agentPprofPrefix, s.routes[agentPprofPrefix]
	}
	for _, prefix := range idPrefixes {
		rest, ok := strings.CutPrefix(path, prefix)
		if !ok {
			continue
		}
		id, sub, hasSub := strings.Cut(rest, "/")
		switch {
		case id == "":
			return "", nil
		case !hasSub:
			return prefix, s.routes[prefix]
		case sub == "" || strings.Contains(sub, "/"):
			return "", nil
		}
		key := subRoute(prefix, sub)
		return key, s.routes[key]
	}
	return path, s.routes[path]
}

// pathID returns the unescaped ID segment that follows prefix in r's
// path, so IDs may hold escaped slashes.
func pathID(r *http.Request, prefix string) string {
	rest := strings.TrimPrefix(r.URL.EscapedPath(), prefix)
	id, _, _ := strings.Cut(rest, "/")
	if u, err := url.PathUnescape(id); err == nil {
		return u
	}
	return id
}

// statusRecorder remembers the status written, for the request log.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// Flush lets streaming handlers flush through the recorder.
func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *HTTPServer) writeJSON(w http.ResponseWriter, r *http.Request, obj any) {
	var (
		buf []byte
		err error
	)
	if _, pretty := r.URL.Query()["pretty"]; pretty {
		buf, err = json.MarshalIndent(obj, "", "    ")
	} else {
		buf, err = json.Marshal(obj)
	}
	if err != nil {
		s.writeError(w, fmt.Errorf("encode response: %w", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(buf, '\n'))
}

// parseQuery reads Nomad's read parameters: index and wait (blocking
// queries), stale, region, prefix, and the X-Nomad-Token header.
func (s *HTTPServer) parseQuery(r *http.Request, q *structs.QueryOptions) error {
	v := r.URL.Query()
	if raw := v.Get("index"); raw != "" {
		idx, err := strconv.ParseUint(raw, 10, 64)
		if err != nil {
			return badRequest("Invalid index %q: must be a non-negative integer", raw)
		}
		q.MinQueryIndex = idx
	}
	if raw := v.Get("wait"); raw != "" {
		d, err := time.ParseDuration(raw)
		if err != nil || d < 0 {
			return badRequest("Invalid wait time %q: must be a duration such as 5s or 5m", raw)
		}
		q.MaxQueryTime = d
	}
	if vals, ok := v["stale"]; ok {
		q.AllowStale = len(vals) == 0 || vals[0] != "false"
	}
	q.Prefix = v.Get("prefix")
	q.Region = s.region(r)
	q.AuthToken = r.Header.Get("X-Nomad-Token")
	return nil
}

// parseWrite reads the region and token of a write.
func (s *HTTPServer) parseWrite(r *http.Request, w *structs.WriteRequest) {
	w.Region = s.region(r)
	w.AuthToken = r.Header.Get("X-Nomad-Token")
}

func (s *HTTPServer) region(r *http.Request) string {
	if region := r.URL.Query().Get("region"); region != "" {
		return region
	}
	return s.agent.config.Region
}

// setMeta writes the index headers every read answers with. The index is
// never 0: a client's blocking loop would otherwise spin.
func setMeta(w http.ResponseWriter, m structs.QueryMeta) {
	w.Header().Set("X-Nomad-Index", strconv.FormatUint(max(m.Index, 1), 10))
	w.Header().Set("X-Nomad-KnownLeader", strconv.FormatBool(m.KnownLeader))
	w.Header().Set("X-Nomad-LastContact", strconv.FormatInt(m.LastContact.Milliseconds(), 10))
}

// localMeta is the query meta for answers the agent gives from what it
// knows itself: its server's Raft applied index and view of the leader.
// A client-only agent knows neither and answers index 1.
func (s *HTTPServer) localMeta() structs.QueryMeta {
	m := structs.QueryMeta{Index: 1}
	srv := s.agent.Server()
	if srv == nil {
		return m
	}
	addr, _ := srv.Leader()
	m.KnownLeader = addr != ""
	r := srv.Raft()
	m.Index = max(r.AppliedIndex(), 1)
	if !srv.IsLeader() {
		if last := r.LastContact(); !last.IsZero() {
			m.LastContact = time.Since(last)
		}
	}
	return m
}

// rpc calls the cluster on behalf of r. The call runs in its own goroutine
// so the request ends as soon as its client goes away or the HTTP server
// shuts down. The call is tied to the request: a blocking query, or a wait
// for a leader, ends with it at once (a write already sent to Raft runs
// to its end), and the abandoned reply is never read.
func (s *HTTPServer) rpc(r *http.Request, method string, args, reply any) error {
	s.rpcWaiting.Add(1)
	defer s.rpcWaiting.Add(-1)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.agent.callerRPC(ctx, method, args, reply) }()
	select {
	case err := <-done:
		return err
	case <-r.Context().Done():
		return fmt.Errorf("%s: request ended: %w", method, r.Context().Err())
	case <-s.shutdownCh:
		// A call whose answer is in already gives it (a write Raft
		// refused as the server stopped, say) rather than the bare
		// shutdown.
		select {
		case err := <-done:
			return err
		default:
		}
		return errShuttingDown
	}
}
