package agent

import (
	"time"

	promsink "github.com/hashicorp/go-metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// newPrometheusSink returns a sink backed by its own registry, which
// /v1/metrics?format=prometheus serves. A registry per agent keeps several
// agents in one process (tests) from colliding in the default registry.
func newPrometheusSink() (*promsink.PrometheusSink, *prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	sink, err := promsink.NewPrometheusSinkFrom(promsink.PrometheusOpts{
		Expiration: time.Minute,
		Registerer: reg,
	})
	if err != nil {
		return nil, nil, err
	}
	return sink, reg, nil
}
