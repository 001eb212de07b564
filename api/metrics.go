package api

import "net/url"

// Metrics reads the agent's metrics.
type Metrics struct{ c *Client }

// Metrics returns a handle on the metrics endpoint.
func (c *Client) Metrics() *Metrics { return &Metrics{c} }

// MetricsSummary is the agent's latest finished metrics interval.
type MetricsSummary struct {
	Timestamp string
	Gauges    []GaugeValue
	Points    []PointValue
	Counters  []SampledValue
	Samples   []SampledValue
}

// GaugeValue is a gauge's last value.
type GaugeValue struct {
	Name   string
	Value  float32
	Labels map[string]string
}

// PointValue is a key's emitted points.
type PointValue struct {
	Name   string
	Points []float32
}

// SampledValue aggregates a counter's or a timer's samples.
type SampledValue struct {
	Name   string
	Count  int
	Rate   float64
	Sum    float64
	Min    float64
	Max    float64
	Mean   float64
	Stddev float64
	Labels map[string]string
}

// Summary returns the metrics as JSON decoded.
func (m *Metrics) Summary(q *QueryOptions) (*MetricsSummary, error) {
	var out MetricsSummary
	if _, err := m.c.query("/v1/metrics", &out, q); err != nil {
		return nil, err
	}
	return &out, nil
}

// Prometheus returns the metrics in Prometheus' text format.
func (m *Metrics) Prometheus(q *QueryOptions) ([]byte, error) {
	buf, _, err := m.c.rawQuery("/v1/metrics", url.Values{"format": {"prometheus"}}, q)
	return buf, err
}
