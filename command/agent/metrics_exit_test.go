package agent

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"
)

// The figures of the latest change of leader are declared to the
// Prometheus sink, so they are there before any change (and do not expire
// between two), and an agent leaves them in its data dir as it stops.
func TestExitMetrics_LeadershipFiguresDeclaredAndWritten(t *testing.T) {
	sink, reg, err := newPrometheusSink()
	must.NoError(t, err)
	sink.SetGauge([]string{metricsService, "leader", "handoff", "drained_calls"}, 2)
	sink.IncrCounter([]string{metricsService, "leader", "handoff", "completed"}, 1)

	dir := t.TempDir()
	must.NoError(t, writeExitMetrics(reg, dir))
	b, err := os.ReadFile(filepath.Join(dir, ExitMetricsFile))
	must.NoError(t, err)
	text := string(b)
	must.StrContains(t, text, "\nroam_leader_handoff_drained_calls 2\n")
	must.StrContains(t, text, "\nroam_leader_handoff_completed 1\n")
	// Declared, never set: present as 0.
	must.StrContains(t, text, "\nroam_leader_duties_started 0\n")
	must.StrContains(t, text, "\nroam_leader_takeover_leaderless_gap_ms 0\n")

	// A data dir that cannot be written is an error, not a silent loss.
	must.Error(t, writeExitMetrics(reg, filepath.Join(dir, "missing", "dir")))
}
