package agent

import (
	"github.com/hashicorp/go-metrics/prometheus"
)

// newPrometheusSink registers a sink whose values /v1/metrics?format=prometheus
// serves from the default Prometheus registry.
func newPrometheusSink() (*prometheus.PrometheusSink, error) {
	return prometheus.NewPrometheusSink()
}
