package agent

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	promsink "github.com/hashicorp/go-metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

	"github.com/roamhq/roam/internal/fsutil"
	"github.com/roamhq/roam/nomad"
)

// metricsService prefixes every metric name.
const metricsService = "roam"

// newPrometheusSink returns a sink backed by its own registry, which
// /v1/metrics?format=prometheus serves. A registry per agent keeps several
// agents in one process (tests) from colliding in the default registry.
func newPrometheusSink() (*promsink.PrometheusSink, *prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The figures of the latest change of leader are declared, so they do
	// not expire between two changes (which may be days apart).
	var gauges []promsink.GaugeDefinition
	for _, name := range nomad.TakeoverGauges() {
		gauges = append(gauges, promsink.GaugeDefinition{Name: append([]string{metricsService}, name...),
			Help: "latest change of leader, in milliseconds (or a count): " + strings.Join(name, ".")})
	}
	var counters []promsink.CounterDefinition
	for _, name := range nomad.TakeoverCounters() {
		counters = append(counters, promsink.CounterDefinition{Name: append([]string{metricsService}, name...),
			Help: "changes of leader: " + strings.Join(name, ".")})
	}
	sink, err := promsink.NewPrometheusSinkFrom(promsink.PrometheusOpts{
		Expiration:         time.Minute,
		Registerer:         reg,
		GaugeDefinitions:   gauges,
		CounterDefinitions: counters,
	})
	if err != nil {
		return nil, nil, err
	}
	return sink, reg, nil
}

// ExitMetricsFile is the file in the data dir where an agent leaves its
// metrics, in the Prometheus text format, as it stops: a server that
// handed leadership over on SIGTERM is gone before anyone can scrape what
// its handoff took.
const ExitMetricsFile = "metrics-at-exit.prom"

// writeExitMetrics writes the agent's Prometheus registry to
// ExitMetricsFile in dataDir.
func writeExitMetrics(reg *prometheus.Registry, dataDir string) error {
	families, err := reg.Gather()
	if err != nil {
		return fmt.Errorf("gather metrics: %w", err)
	}
	var buf bytes.Buffer
	for _, mf := range families {
		if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
			return fmt.Errorf("encode metric %s: %w", mf.GetName(), err)
		}
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(dataDir, ExitMetricsFile), buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("write exit metrics: %w", err)
	}
	return nil
}
