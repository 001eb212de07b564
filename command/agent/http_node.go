package agent

import (
	"net/http"
	"strings"

	"github.com/roamhq/roam/structs"
)

// nodeView is a node as the API shows it: every field of structs.Node
// except the secret, which the shallower field hides and omitempty drops.
type nodeView struct {
	*structs.Node
	SecretID string `json:",omitempty"`
}

// nodesList answers GET /v1/nodes[?prefix=] with node stubs; a blocking
// query.
func (s *HTTPServer) nodesList(w http.ResponseWriter, r *http.Request) (any, error) {
	var args structs.NodeListRequest
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	var reply structs.NodeListResponse
	if err := s.rpc(r, "Node.List", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Nodes == nil {
		reply.Nodes = []*structs.NodeListStub{}
	}
	return reply.Nodes, nil
}

// maxAmbiguousIDs bounds how many matches an ambiguous-prefix error names.
const maxAmbiguousIDs = 10

// nodeGet answers GET /v1/node/:id; a blocking query. An ID that matches
// no node is tried as a prefix: one match answers with that node, several
// are a 400 naming them, none is a 404.
func (s *HTTPServer) nodeGet(w http.ResponseWriter, r *http.Request) (any, error) {
	id := pathID(r, nodePathPrefix)
	args := structs.NodeSpecificRequest{NodeID: id}
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	args.Prefix = ""
	var reply structs.SingleNodeResponse
	if err := s.rpc(r, "Node.GetNode", &args, &reply); err != nil {
		return nil, err
	}
	if reply.Node == nil {
		list := structs.NodeListRequest{QueryOptions: args.QueryOptions}
		list.Prefix = id
		list.MinQueryIndex = 0 // resolving the prefix must not block
		var matches structs.NodeListResponse
		if err := s.rpc(r, "Node.List", &list, &matches); err != nil {
			return nil, err
		}
		switch len(matches.Nodes) {
		case 0:
			setMeta(w, reply.QueryMeta)
			return nil, &codedError{code: http.StatusNotFound, msg: "node not found"}
		case 1:
			args.NodeID = matches.Nodes[0].ID
			reply = structs.SingleNodeResponse{}
			if err := s.rpc(r, "Node.GetNode", &args, &reply); err != nil {
				return nil, err
			}
			if reply.Node == nil { // removed in between
				setMeta(w, reply.QueryMeta)
				return nil, &codedError{code: http.StatusNotFound, msg: "node not found"}
			}
		default:
			ids := make([]string, 0, maxAmbiguousIDs)
			for i, n := range matches.Nodes {
				if i == maxAmbiguousIDs {
					ids = append(ids, "...")
					break
				}
				ids = append(ids, n.ID)
			}
			setMeta(w, matches.QueryMeta)
			return nil, badRequest("ambiguous node ID prefix %q matches %d nodes: %s",
				id, len(matches.Nodes), strings.Join(ids, ", "))
		}
	}
	setMeta(w, reply.QueryMeta)
	return nodeView{Node: reply.Node}, nil
}
