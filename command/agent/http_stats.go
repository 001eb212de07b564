package agent

import (
	"net/http"

	"github.com/roamhq/roam/structs"
)

// clientAllocPathPrefix is Nomad's route for what a client measures of an
// allocation: /v1/client/allocation/:id/stats.
const clientAllocPathPrefix = "/v1/client/allocation/"

// allocStats answers GET /v1/client/allocation/:id/stats with the
// allocation's resource usage (Nomad's AllocResourceUsage): measured here
// when this agent's client runs it, else on its node through the
// servers.
func (s *HTTPServer) allocStats(w http.ResponseWriter, r *http.Request) (any, error) {
	alloc, err := s.clientRouteAlloc(r, clientAllocPathPrefix)
	if err != nil {
		return nil, err
	}
	if cl := s.agent.Client(); cl != nil && cl.NodeID() == alloc.NodeID {
		u, err := cl.AllocStats(alloc.ID)
		if err != nil {
			return nil, logError(err)
		}
		return u, nil
	}
	req := structs.AllocStatsRequest{AllocID: alloc.ID}
	req.Region = s.region(r)
	req.AuthToken = r.Header.Get("X-Nomad-Token")
	var u structs.AllocResourceUsage
	if err := s.rpc(r, "Alloc.Stats", &req, &u); err != nil {
		return nil, err
	}
	return &u, nil
}
