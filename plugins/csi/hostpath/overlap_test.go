package hostpath

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

const overlapLine = "overlapping destructive controller call"

// TestOverlap_ConcurrentPublishesAreRecorded proves the detector works:
// publishes sent at once, each held by the publish latency, overlap.
func TestOverlap_ConcurrentPublishesAreRecorded(t *testing.T) {
	stateDir := t.TempDir()
	cfg, logs := testConfig(t, stateDir, "node-a")
	cfg.PublishLatency = 300 * time.Millisecond
	p := startPlugin(t, cfg)
	c := dial(t, p)

	const n = 4
	var vols []string
	for i := range n {
		vols = append(vols, createVolume(t, c, fmt.Sprintf("vol-%d", i), singleWriter))
	}

	var wg sync.WaitGroup
	devices := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			devices[i], errs[i] = publish(context.Background(), c, vols[i], "node-a", singleWriter)
		})
	}
	wg.Wait()
	for _, err := range errs {
		must.NoError(t, err)
	}
	// Roam's plugin allocates devices under its state lock, so even
	// overlapping attaches get distinct names; the overlap is what a real
	// provider could not have survived.
	slices.Sort(devices)
	must.Eq(t, []string{"/dev/roam00", "/dev/roam01", "/dev/roam02", "/dev/roam03"}, devices)

	overlaps, err := ReadOverlaps(stateDir, "node-a")
	must.NoError(t, err)
	must.Positive(t, overlaps)
	must.Eq(t, p.Overlaps(), overlaps)
	must.Eq(t, int(overlaps), countLines(logs.String(), overlapLine))

	calls, err := ReadCalls(stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, n, calls["ControllerPublishVolume"])
}

func TestOverlap_SequentialCallsAreNot(t *testing.T) {
	stateDir := t.TempDir()
	cfg, logs := testConfig(t, stateDir, "node-a")
	cfg.PublishLatency = 20 * time.Millisecond
	p := startPlugin(t, cfg)
	c := dial(t, p)

	for i := range 4 {
		vol := createVolume(t, c, fmt.Sprintf("vol-%d", i), singleWriter)
		_, err := publish(context.Background(), c, vol, "node-a", singleWriter)
		must.NoError(t, err)
		unpublish(t, c, vol, "node-a")
	}

	buf, err := os.ReadFile(OverlapsFile(stateDir, "node-a"))
	must.NoError(t, err)
	must.Eq(t, "0\n", string(buf))
	must.Eq(t, 0, p.Overlaps())
	must.StrNotContains(t, logs.String(), overlapLine)

	calls, err := ReadCalls(stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, map[string]int64{
		"CreateVolume":              4,
		"ControllerPublishVolume":   4,
		"ControllerUnpublishVolume": 4,
	}, calls)
}

// TestOverlap_CountSurvivesRestart checks that a plugin restarted with the
// same node ID and state dir keeps the earlier count rather than erasing it.
func TestOverlap_CountSurvivesRestart(t *testing.T) {
	stateDir := t.TempDir()
	must.NoError(t, os.WriteFile(OverlapsFile(stateDir, "node-a"), []byte("3\n"), 0o644))
	must.NoError(t, os.WriteFile(CallsFile(stateDir, "node-a"), []byte(`{"DeleteVolume":2}`), 0o644))

	cfg, _ := testConfig(t, stateDir, "node-a")
	p, err := New(cfg)
	must.NoError(t, err)
	must.Eq(t, 3, p.Overlaps())
	must.Eq(t, map[string]int64{"DeleteVolume": 2}, p.Calls())
}

// TestOverlap_NodeModeWritesNoFiles: only controller-serving processes own
// the overlap and calls files, so a node plugin sharing a node ID with a
// controller plugin cannot overwrite them.
func TestOverlap_NodeModeWritesNoFiles(t *testing.T) {
	stateDir := t.TempDir()
	cfg, _ := testConfig(t, stateDir, "node-a")
	cfg.Mode = ModeNode
	startPlugin(t, cfg)
	_, err := os.Stat(OverlapsFile(stateDir, "node-a"))
	must.ErrorIs(t, err, os.ErrNotExist)
	_, err = os.Stat(CallsFile(stateDir, "node-a"))
	must.ErrorIs(t, err, os.ErrNotExist)
}
