package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/roamhq/roam/jobspec"
	"github.com/roamhq/roam/structs"
)

// jobPathPrefix is the route that takes a job ID after it.
const jobPathPrefix = "/v1/job/"

// addWorkloadRoutes adds the job, allocation, evaluation, drain and log
// routes.
func (s *HTTPServer) addWorkloadRoutes() {
	write := func(h handlerFunc) map[string]handlerFunc {
		return map[string]handlerFunc{http.MethodPut: h, http.MethodPost: h}
	}
	for path, methods := range map[string]map[string]handlerFunc{
		"/v1/jobs": {
			http.MethodGet:  s.jobsList,
			http.MethodPut:  s.jobsRegister,
			http.MethodPost: s.jobsRegister,
		},
		"/v1/jobs/parse": write(s.jobsParse),
		jobPathPrefix: {
			http.MethodGet:    s.jobGet,
			http.MethodPut:    s.jobRegister,
			http.MethodPost:   s.jobRegister,
			http.MethodDelete: s.jobDeregister,
		},
		subRoute(jobPathPrefix, "allocations"): {http.MethodGet: s.jobAllocations},
		subRoute(jobPathPrefix, "evaluations"): {http.MethodGet: s.jobEvaluations},

		"/v1/allocations": {http.MethodGet: s.allocsList},
		allocPathPrefix:   {http.MethodGet: s.allocGet},
		"/v1/evaluations": {http.MethodGet: s.evalsList},
		evalPathPrefix:    {http.MethodGet: s.evalGet},

		subRoute(nodePathPrefix, "allocations"): {http.MethodGet: s.nodeAllocations},
		subRoute(nodePathPrefix, "drain"):       write(s.nodeDrain),
		subRoute(nodePathPrefix, "eligibility"): write(s.nodeEligibility),

		logsPathPrefix:                           {http.MethodGet: s.allocLogs},
		subRoute(clientAllocPathPrefix, "stats"): {http.MethodGet: s.allocStats},
		fsLsPathPrefix:                           {http.MethodGet: s.allocFSList},
		fsStatPathPrefix:                         {http.MethodGet: s.allocFSStat},
		fsCatPathPrefix:                          {http.MethodGet: s.allocFSCat},
	} {
		s.routes[path] = methods
	}
}

// jobsList answers GET /v1/jobs[?prefix=] with job stubs; a blocking
// query.
func (s *HTTPServer) jobsList(w http.ResponseWriter, r *http.Request) (any, error) {
	var args structs.JobListRequest
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	var reply structs.JobListResponse
	if err := s.rpc(r, "Job.List", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Jobs == nil {
		reply.Jobs = []*structs.JobListStub{}
	}
	return reply.Jobs, nil
}

// jobsRegister answers PUT/POST /v1/jobs: register the job in the body.
func (s *HTTPServer) jobsRegister(w http.ResponseWriter, r *http.Request) (any, error) {
	return s.register(w, r, "")
}

// jobRegister answers PUT/POST /v1/job/:id: register the job in the
// body, whose ID must be the one in the path.
func (s *HTTPServer) jobRegister(w http.ResponseWriter, r *http.Request) (any, error) {
	return s.register(w, r, pathID(r, jobPathPrefix))
}

// registerWrapper holds the fields of Nomad's api.JobRegisterRequest that
// are read here rather than by jobspec.ParseJSON.
type registerWrapper struct {
	EnforceIndex   bool
	JobModifyIndex uint64
}

// registerDropped are fields of Nomad's register request that say nothing
// about what runs: the submitted source and the write's routing, which
// travels in the URL and headers.
var registerDropped = []string{
	"EnforceIndex", "JobModifyIndex", "Submission",
	"Region", "Namespace", "SecretID", "IdempotencyToken",
}

// register parses a register body ({"Job": {...}, ...} as Nomad's client
// sends it) and registers the job. Any other wrapper field that is set is
// refused by the parser; a bad job is a 400 and nothing is written.
func (s *HTTPServer) register(w http.ResponseWriter, r *http.Request, pathJobID string) (any, error) {
	limits := s.jobLimits()
	body, err := readJobBody(w, r, limits)
	if err != nil {
		return nil, err
	}
	// Depth and group and task counts, before anything is decoded.
	if err := jobspec.CheckJSON(body, limits); err != nil {
		return nil, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, badRequest("Failed to decode register request: %v", err)
	}
	if raw, ok := top["Job"]; !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, badRequest("Job must be specified")
	}
	var wrap registerWrapper
	if err := json.Unmarshal(body, &wrap); err != nil {
		return nil, badRequest("Failed to decode register request: %v", err)
	}
	for _, k := range registerDropped {
		delete(top, k)
	}
	// Re-encoded without HTML escaping, so that it is no larger than the
	// body and the parser's size limit holds for it too.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(top); err != nil {
		return nil, fmt.Errorf("re-encode register request: %w", err)
	}
	rest := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	job, err := jobspec.ParseJSONWithLimits(rest, limits)
	if err != nil {
		return nil, err
	}
	if pathJobID != "" && job.ID != pathJobID {
		return nil, badRequest("Job ID %q does not match the job ID in the URL %q", job.ID, pathJobID)
	}

	args := structs.JobRegisterRequest{
		Job:            job,
		EnforceIndex:   wrap.EnforceIndex,
		JobModifyIndex: wrap.JobModifyIndex,
	}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.JobRegisterResponse
	if err := s.rpc(r, "Job.Register", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	return reply, nil
}

// jobsParseRequest is the body of /v1/jobs/parse, as Nomad's client sends
// it.
type jobsParseRequest struct {
	JobHCL string
	// Canonicalize is accepted for Nomad's clients; the answer is always
	// canonicalized and validated.
	Canonicalize bool
}

// jobsParse answers PUT/POST /v1/jobs/parse: an HCL job file in, the job
// as JSON out. Nothing is written.
func (s *HTTPServer) jobsParse(w http.ResponseWriter, r *http.Request) (any, error) {
	limits := s.jobLimits()
	body, err := readJobBody(w, r, limits)
	if err != nil {
		return nil, err
	}
	var args jobsParseRequest
	if err := json.Unmarshal(body, &args); err != nil {
		return nil, badRequest("Failed to decode parse request: %v", err)
	}
	if args.JobHCL == "" {
		return nil, badRequest("Job HCL must be specified")
	}
	job, err := jobspec.ParseHCLWithLimits("input.hcl", []byte(args.JobHCL), limits)
	if err != nil {
		return nil, err
	}
	return job, nil
}

// jobGet answers GET /v1/job/:id; a blocking query.
func (s *HTTPServer) jobGet(w http.ResponseWriter, r *http.Request) (any, error) {
	args := structs.JobSpecificRequest{JobID: pathID(r, jobPathPrefix)}
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	var reply structs.SingleJobResponse
	if err := s.rpc(r, "Job.GetJob", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Job == nil {
		return nil, errNotFound("job")
	}
	return reply.Job, nil
}

// jobDeregister answers DELETE /v1/job/:id[?purge=true]: stop the job,
// or remove it with purge.
func (s *HTTPServer) jobDeregister(w http.ResponseWriter, r *http.Request) (any, error) {
	args := structs.JobDeregisterRequest{JobID: pathID(r, jobPathPrefix)}
	purge, err := boolParam(r, "purge")
	if err != nil {
		return nil, err
	}
	args.Purge = purge
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.JobDeregisterResponse
	if err := s.rpc(r, "Job.Deregister", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	return reply, nil
}

// jobAllocations answers GET /v1/job/:id/allocations[?all=true] with
// allocation stubs; a blocking query.
func (s *HTTPServer) jobAllocations(w http.ResponseWriter, r *http.Request) (any, error) {
	args := structs.JobSpecificRequest{JobID: pathID(r, jobPathPrefix)}
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	args.Prefix = ""
	all, err := boolParam(r, "all")
	if err != nil {
		return nil, err
	}
	args.All = all
	var reply structs.JobAllocationsResponse
	if err := s.rpc(r, "Job.Allocations", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Allocations == nil {
		reply.Allocations = []*structs.AllocListStub{}
	}
	return reply.Allocations, nil
}

// jobEvaluations answers GET /v1/job/:id/evaluations; a blocking query.
func (s *HTTPServer) jobEvaluations(w http.ResponseWriter, r *http.Request) (any, error) {
	args := structs.JobSpecificRequest{JobID: pathID(r, jobPathPrefix)}
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	args.Prefix = ""
	var reply structs.JobEvaluationsResponse
	if err := s.rpc(r, "Job.Evaluations", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Evaluations == nil {
		reply.Evaluations = []*structs.Evaluation{}
	}
	return reply.Evaluations, nil
}

// jobLimits are the agent's job limits.
func (s *HTTPServer) jobLimits() structs.JobLimits {
	l := DefaultLimits()
	if s.agent != nil && s.agent.config != nil && s.agent.config.Limits != nil {
		l = s.agent.config.Limits
	}
	return l.jobLimits()
}

// readJobBody reads a job register or parse body of at most
// job_max_bytes; a larger one is a 413 naming the limit, and the
// connection is closed rather than read to its end. A body whose declared
// length is over the limit is refused before a byte of it is read: it
// would be refused at the limit anyway, after reading (and holding) a
// megabyte of it.
func readJobBody(w http.ResponseWriter, r *http.Request, l structs.JobLimits) ([]byte, error) {
	if r.ContentLength > int64(l.MaxBytes) {
		closeBodyUnread(r)
		return nil, &codedError{code: http.StatusRequestEntityTooLarge,
			msg: fmt.Sprintf("Request body larger than job_max_bytes = %d (Content-Length %d)", l.MaxBytes, r.ContentLength)}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(l.MaxBytes)))
	var (
		tooLarge *http.MaxBytesError
		coded    *codedError
	)
	switch {
	case errors.As(err, &coded):
		return nil, coded // the body timed out (timedBody)
	case errors.As(err, &tooLarge):
		return nil, &codedError{code: http.StatusRequestEntityTooLarge,
			msg: fmt.Sprintf("Request body larger than job_max_bytes = %d", l.MaxBytes)}
	case err != nil:
		return nil, badRequest("Failed to read request body: %v", err)
	}
	return body, nil
}

// readBody reads a request body of at most limit bytes.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		var coded *codedError
		if errors.As(err, &coded) {
			return nil, coded // the body timed out (timedBody)
		}
		return nil, badRequest("Failed to read request body: %v", err)
	}
	if int64(len(body)) > limit {
		return nil, &codedError{code: http.StatusRequestEntityTooLarge,
			msg: fmt.Sprintf("Request body larger than %d bytes", limit)}
	}
	return body, nil
}

// boolParam reads a boolean query parameter; absent is false, present
// without a value is true.
func boolParam(r *http.Request, name string) (bool, error) {
	vals, ok := r.URL.Query()[name]
	if !ok {
		return false, nil
	}
	if len(vals) == 0 || vals[0] == "" {
		return true, nil
	}
	b, err := strconv.ParseBool(vals[0])
	if err != nil {
		return false, badRequest("Invalid %s value %q: must be true or false", name, vals[0])
	}
	return b, nil
}

// setIndex writes the index header of a write's answer.
func setIndex(w http.ResponseWriter, index uint64) {
	w.Header().Set("X-Nomad-Index", strconv.FormatUint(max(index, 1), 10))
}

// errNotFound is a 404 naming what was missing.
func errNotFound(kind string) error {
	return &codedError{code: http.StatusNotFound, msg: kind + " not found"}
}
