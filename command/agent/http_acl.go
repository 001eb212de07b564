package agent

import (
	"encoding/json"
	"net/http"

	"github.com/roamhq/roam/acl"
	"github.com/roamhq/roam/structs"
)

// ACL routes, in Nomad's paths and JSON.
const (
	aclPolicyPathPrefix = "/v1/acl/policy/"
	aclTokenPathPrefix  = "/v1/acl/token/"
	// maxACLBody bounds an ACL request body: a policy's rules and a little.
	maxACLBody = acl.MaxRulesSize + 4096
)

func (s *HTTPServer) addACLRoutes() {
	s.routes["/v1/acl/bootstrap"] = map[string]handlerFunc{http.MethodPut: s.aclBootstrap, http.MethodPost: s.aclBootstrap}
	s.routes["/v1/acl/policies"] = map[string]handlerFunc{http.MethodGet: s.aclPoliciesList}
	s.routes[aclPolicyPathPrefix] = map[string]handlerFunc{
		http.MethodGet:    s.aclPolicyGet,
		http.MethodPut:    s.aclPolicyPut,
		http.MethodPost:   s.aclPolicyPut,
		http.MethodDelete: s.aclPolicyDelete,
	}
	s.routes["/v1/acl/tokens"] = map[string]handlerFunc{http.MethodGet: s.aclTokensList}
	s.routes["/v1/acl/token"] = map[string]handlerFunc{http.MethodPut: s.aclTokenCreate, http.MethodPost: s.aclTokenCreate}
	s.routes[aclTokenPathPrefix] = map[string]handlerFunc{
		http.MethodGet:    s.aclTokenGet,
		http.MethodPut:    s.aclTokenUpdate,
		http.MethodPost:   s.aclTokenUpdate,
		http.MethodDelete: s.aclTokenDelete,
	}
}

// aclBootstrap answers PUT /v1/acl/bootstrap with the first management
// token. A body, if any, may not name a secret: Roam makes its own.
func (s *HTTPServer) aclBootstrap(w http.ResponseWriter, r *http.Request) (any, error) {
	body, err := readBody(r, maxACLBody)
	if err != nil {
		return nil, err
	}
	if len(body) > 0 && string(body) != "null" {
		var in struct{ BootstrapSecret string }
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, badRequest("Failed to decode bootstrap request: %v", err)
		}
		if in.BootstrapSecret != "" {
			return nil, badRequest("BootstrapSecret is not supported: the server makes the secret")
		}
	}
	var args structs.ACLTokenBootstrapRequest
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.ACLTokenUpsertResponse
	if err := s.rpc(r, "ACL.Bootstrap", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	return reply.Tokens[0], nil
}

func (s *HTTPServer) aclPoliciesList(w http.ResponseWriter, r *http.Request) (any, error) {
	var args structs.GenericRequest
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	var reply structs.ACLPolicyListResponse
	if err := s.rpc(r, "ACL.ListPolicies", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	return reply.Policies, nil
}

// aclPolicyGet answers GET /v1/acl/policy/:name, and /v1/acl/policy/self
// with the stubs of the caller's own policies.
func (s *HTTPServer) aclPolicyGet(w http.ResponseWriter, r *http.Request) (any, error) {
	name := pathID(r, aclPolicyPathPrefix)
	if name == "self" {
		var args structs.GenericRequest
		if err := s.parseQuery(r, &args.QueryOptions); err != nil {
			return nil, err
		}
		var reply structs.ResolveACLTokenResponse
		if err := s.rpc(r, "ACL.ResolveToken", &args, &reply); err != nil {
			return nil, err
		}
		setMeta(w, reply.QueryMeta)
		out := make([]*structs.ACLPolicyListStub, 0, len(reply.Policies))
		for _, p := range reply.Policies {
			out = append(out, p.Stub())
		}
		return out, nil
	}
	args := structs.ACLPolicySpecificRequest{Name: name}
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	args.Prefix = ""
	var reply structs.ACLPolicyResponse
	if err := s.rpc(r, "ACL.GetPolicy", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Policy == nil {
		return nil, errNotFound("ACL policy")
	}
	return reply.Policy, nil
}

// aclPolicyPut answers PUT /v1/acl/policy/:name with the policy's JSON
// ({"Name", "Description", "Rules"}); the body's name, if any, must be
// the path's.
func (s *HTTPServer) aclPolicyPut(w http.ResponseWriter, r *http.Request) (any, error) {
	name := pathID(r, aclPolicyPathPrefix)
	body, err := readBody(r, maxACLBody)
	if err != nil {
		return nil, err
	}
	var in structs.ACLPolicy
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, badRequest("Failed to decode ACL policy: %v", err)
	}
	if in.Name == "" {
		in.Name = name
	}
	if in.Name != name {
		return nil, badRequest("Policy name %q does not match the URL's %q", in.Name, name)
	}
	args := structs.ACLPolicyUpsertRequest{Policies: []*structs.ACLPolicy{{Name: in.Name, Description: in.Description, Rules: in.Rules}}}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.GenericResponse
	if err := s.rpc(r, "ACL.UpsertPolicies", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	return nil, writeEmptyOK(w)
}

func (s *HTTPServer) aclPolicyDelete(w http.ResponseWriter, r *http.Request) (any, error) {
	args := structs.ACLPolicyDeleteRequest{Names: []string{pathID(r, aclPolicyPathPrefix)}}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.GenericResponse
	if err := s.rpc(r, "ACL.DeletePolicies", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	return nil, writeEmptyOK(w)
}

// writeEmptyOK answers a write that returns nothing, as Nomad does.
func writeEmptyOK(w http.ResponseWriter) error {
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *HTTPServer) aclTokensList(w http.ResponseWriter, r *http.Request) (any, error) {
	var args structs.GenericRequest
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	var reply structs.ACLTokenListResponse
	if err := s.rpc(r, "ACL.ListTokens", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	return reply.Tokens, nil
}

// aclTokenBody is what a token create or update may set.
type aclTokenBody struct {
	AccessorID string
	SecretID   string
	Name       string
	Type       string
	Policies   []string
	Global     bool
}

// decodeTokenBody reads a token's JSON. A create may not name a secret
// (the server makes it); an update may carry the one it read (Nomad's
// client sends the whole token back), which is ignored: a secret never
// changes.
func decodeTokenBody(r *http.Request, update bool) (*structs.ACLToken, error) {
	body, err := readBody(r, maxACLBody)
	if err != nil {
		return nil, err
	}
	var in aclTokenBody
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, badRequest("Failed to decode ACL token: %v", err)
	}
	if in.SecretID != "" && !update {
		return nil, badRequest("SecretID cannot be set: the server makes the secret")
	}
	return &structs.ACLToken{AccessorID: in.AccessorID, Name: in.Name, Type: in.Type, Policies: in.Policies, Global: in.Global}, nil
}

func (s *HTTPServer) upsertToken(w http.ResponseWriter, r *http.Request, t *structs.ACLToken) (any, error) {
	args := structs.ACLTokenUpsertRequest{Tokens: []*structs.ACLToken{t}}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.ACLTokenUpsertResponse
	if err := s.rpc(r, "ACL.UpsertTokens", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	if len(reply.Tokens) != 1 {
		return nil, errNotFound("ACL token")
	}
	return reply.Tokens[0], nil
}

// aclTokenCreate answers PUT /v1/acl/token: a new token, secret included.
func (s *HTTPServer) aclTokenCreate(w http.ResponseWriter, r *http.Request) (any, error) {
	t, err := decodeTokenBody(r, false)
	if err != nil {
		return nil, err
	}
	if t.AccessorID != "" {
		return nil, badRequest("AccessorID cannot be set when creating a token")
	}
	return s.upsertToken(w, r, t)
}

// aclTokenUpdate answers PUT /v1/acl/token/:accessor.
func (s *HTTPServer) aclTokenUpdate(w http.ResponseWriter, r *http.Request) (any, error) {
	id := pathID(r, aclTokenPathPrefix)
	t, err := decodeTokenBody(r, true)
	if err != nil {
		return nil, err
	}
	if t.AccessorID == "" {
		t.AccessorID = id
	}
	if t.AccessorID != id {
		return nil, badRequest("Token AccessorID %q does not match the URL's %q", t.AccessorID, id)
	}
	return s.upsertToken(w, r, t)
}

// aclTokenGet answers GET /v1/acl/token/:accessor, and /v1/acl/token/self
// with the caller's own token.
func (s *HTTPServer) aclTokenGet(w http.ResponseWriter, r *http.Request) (any, error) {
	id := pathID(r, aclTokenPathPrefix)
	if id == "self" {
		var args structs.GenericRequest
		if err := s.parseQuery(r, &args.QueryOptions); err != nil {
			return nil, err
		}
		var reply structs.ResolveACLTokenResponse
		if err := s.rpc(r, "ACL.ResolveToken", &args, &reply); err != nil {
			return nil, err
		}
		setMeta(w, reply.QueryMeta)
		if reply.Token == nil {
			return nil, errNotFound("ACL token")
		}
		return reply.Token, nil
	}
	args := structs.ACLTokenSpecificRequest{AccessorID: id}
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	args.Prefix = ""
	var reply structs.ACLTokenResponse
	if err := s.rpc(r, "ACL.GetToken", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Token == nil {
		return nil, errNotFound("ACL token")
	}
	return reply.Token, nil
}

func (s *HTTPServer) aclTokenDelete(w http.ResponseWriter, r *http.Request) (any, error) {
	args := structs.ACLTokenDeleteRequest{AccessorIDs: []string{pathID(r, aclTokenPathPrefix)}}
	s.parseWrite(r, &args.WriteRequest)
	var reply structs.GenericResponse
	if err := s.rpc(r, "ACL.DeleteTokens", &args, &reply); err != nil {
		return nil, err
	}
	setIndex(w, reply.Index)
	return nil, writeEmptyOK(w)
}
