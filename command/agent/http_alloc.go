package agent

import (
	"net/http"
	"strings"

	"github.com/roamhq/roam/structs"
)

// Routes that take an allocation or evaluation ID after them.
const (
	allocPathPrefix = "/v1/allocation/"
	evalPathPrefix  = "/v1/evaluation/"
)

// allocsList answers GET /v1/allocations[?prefix=] with allocation stubs;
// a blocking query.
func (s *HTTPServer) allocsList(w http.ResponseWriter, r *http.Request) (any, error) {
	var args structs.AllocListRequest
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	var reply structs.AllocListResponse
	if err := s.rpc(r, "Alloc.List", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Allocations == nil {
		reply.Allocations = []*structs.AllocListStub{}
	}
	return reply.Allocations, nil
}

// allocGet answers GET /v1/allocation/:id; a blocking query. An ID that
// matches no allocation is tried as a prefix, as for nodes.
func (s *HTTPServer) allocGet(w http.ResponseWriter, r *http.Request) (any, error) {
	id := pathID(r, allocPathPrefix)
	args := structs.AllocSpecificRequest{AllocID: id}
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	args.Prefix = ""
	var reply structs.SingleAllocResponse
	if err := s.rpc(r, "Alloc.GetAlloc", &args, &reply); err != nil {
		return nil, err
	}
	if reply.Alloc == nil {
		full, err := s.resolveAllocPrefix(w, r, args.QueryOptions, id)
		if err != nil {
			return nil, err
		}
		args.AllocID = full
		reply = structs.SingleAllocResponse{}
		if err := s.rpc(r, "Alloc.GetAlloc", &args, &reply); err != nil {
			return nil, err
		}
	}
	setMeta(w, reply.QueryMeta)
	if reply.Alloc == nil { // none, or removed in between
		return nil, errNotFound("alloc")
	}
	return reply.Alloc, nil
}

// resolveAllocPrefix returns the one allocation ID that starts with
// prefix: a 404 when there is none, a 400 naming them when there are
// several.
func (s *HTTPServer) resolveAllocPrefix(w http.ResponseWriter, r *http.Request, q structs.QueryOptions, prefix string) (string, error) {
	list := structs.AllocListRequest{QueryOptions: q}
	list.Prefix = prefix
	list.MinQueryIndex = 0 // resolving the prefix must not block
	var matches structs.AllocListResponse
	if err := s.rpc(r, "Alloc.List", &list, &matches); err != nil {
		return "", err
	}
	ids := make([]string, 0, len(matches.Allocations))
	for _, a := range matches.Allocations {
		ids = append(ids, a.ID)
	}
	return resolvePrefix(w, matches.QueryMeta, "alloc", prefix, ids)
}

// evalsList answers GET /v1/evaluations[?prefix=]; a blocking query.
func (s *HTTPServer) evalsList(w http.ResponseWriter, r *http.Request) (any, error) {
	var args structs.EvalListRequest
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	var reply structs.EvalListResponse
	if err := s.rpc(r, "Eval.List", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Evaluations == nil {
		reply.Evaluations = []*structs.Evaluation{}
	}
	return reply.Evaluations, nil
}

// evalGet answers GET /v1/evaluation/:id; a blocking query. An ID that
// matches no evaluation is tried as a prefix.
func (s *HTTPServer) evalGet(w http.ResponseWriter, r *http.Request) (any, error) {
	id := pathID(r, evalPathPrefix)
	args := structs.EvalSpecificRequest{EvalID: id}
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	args.Prefix = ""
	var reply structs.SingleEvalResponse
	if err := s.rpc(r, "Eval.GetEval", &args, &reply); err != nil {
		return nil, err
	}
	if reply.Eval == nil {
		list := structs.EvalListRequest{QueryOptions: args.QueryOptions}
		list.Prefix = id
		list.MinQueryIndex = 0
		var matches structs.EvalListResponse
		if err := s.rpc(r, "Eval.List", &list, &matches); err != nil {
			return nil, err
		}
		ids := make([]string, 0, len(matches.Evaluations))
		for _, e := range matches.Evaluations {
			ids = append(ids, e.ID)
		}
		full, err := resolvePrefix(w, matches.QueryMeta, "eval", id, ids)
		if err != nil {
			return nil, err
		}
		args.EvalID = full
		reply = structs.SingleEvalResponse{}
		if err := s.rpc(r, "Eval.GetEval", &args, &reply); err != nil {
			return nil, err
		}
	}
	setMeta(w, reply.QueryMeta)
	if reply.Eval == nil {
		return nil, errNotFound("eval")
	}
	return reply.Eval, nil
}

// resolvePrefix picks the one of ids that prefix names: an exact match
// wins, else the only match; none is a 404 and several a 400 that names
// them. Errors carry the list's index headers.
func resolvePrefix(w http.ResponseWriter, m structs.QueryMeta, kind, prefix string, ids []string) (string, error) {
	for _, id := range ids {
		if id == prefix {
			return id, nil
		}
	}
	switch len(ids) {
	case 0:
		setMeta(w, m)
		return "", errNotFound(kind)
	case 1:
		return ids[0], nil
	}
	named := ids
	if len(named) > maxAmbiguousIDs {
		named = append(named[:maxAmbiguousIDs:maxAmbiguousIDs], "...")
	}
	setMeta(w, m)
	return "", badRequest("ambiguous %s ID prefix %q matches %d %ss: %s",
		kind, prefix, len(ids), kind, strings.Join(named, ", "))
}
