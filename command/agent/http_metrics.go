package agent

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics answers GET /v1/metrics: the in-memory sink's latest interval as
// JSON (Nomad's api.MetricsSummary), or with ?format=prometheus the
// agent's Prometheus registry in its text format.
func (s *HTTPServer) metrics(w http.ResponseWriter, r *http.Request) (any, error) {
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
