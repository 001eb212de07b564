package agent

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/roamhq/roam/structs"
)

// metrics answers GET /v1/metrics: the in-memory sink's latest interval as
// JSON (Nomad's api.MetricsSummary), or with ?format=prometheus the
// agent's Prometheus registry in its text format.
func (s *HTTPServer) metrics(w http.ResponseWriter, r *http.Request) (any, error) {
	if serverID := r.URL.Query().Get("server_id"); serverID != "" {
		return nil, s.serverMetrics(w, r, serverID)
	}
	switch format := r.URL.Query().Get("format"); format {
	case "", "json":
		summary, err := s.agent.InmemMetrics().DisplayMetrics(w, r)
		if err != nil {
			return nil, fmt.Errorf("read metrics: %w", err)
		}
		setMeta(w, s.localMeta())
		return summary, nil
	case "prometheus":
		if s.agent.promRegistry == nil {
			return nil, fmt.Errorf("prometheus metrics are not available on this agent")
		}
		setMeta(w, s.localMeta())
		promhttp.HandlerFor(s.agent.promRegistry, promhttp.HandlerOpts{
			ErrorLog: promLogger{s},
		}).ServeHTTP(w, r)
		return nil, nil
	default:
		return nil, badRequest("Invalid metrics format %q: want json or prometheus", format)
	}
}

// promLogger sends promhttp's errors to the agent's log.
type promLogger struct{ s *HTTPServer }

func (l promLogger) Println(v ...any) {
	l.s.logger.Error("prometheus metrics", "error", fmt.Sprint(v...))
}

// serverMetrics answers /v1/metrics?server_id=: the JSON summary of the
// server named (an ID, or "leader"), which the cluster passes the call
// to. Unlike the agent's own metrics it asks for agent:write, or with ACLs
// off that server's enable_debug (nomad's Agent.Profile).
func (s *HTTPServer) serverMetrics(w http.ResponseWriter, r *http.Request, serverID string) error {
	if f := r.URL.Query().Get("format"); f != "" && f != "json" {
		return badRequest("Invalid metrics format %q with server_id: only json", f)
	}
	args := structs.AgentProfileRequest{ServerID: serverID, Kind: structs.AgentProfileMetrics}
	args.Region, args.AuthToken = s.region(r), r.Header.Get("X-Nomad-Token")
	var reply structs.AgentProfileResponse
	if err := s.rpc(r, "Agent.Profile", &args, &reply); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Roam-Server-ID", reply.ServerID)
	w.Header().Set("X-Roam-Server-Name", reply.ServerName)
	_, _ = w.Write(reply.Payload)
	return nil
}
