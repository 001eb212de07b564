package hostpath

import (
	"flag"
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/shoenig/test/must"
)

// TestSanity runs the csi-test v5 sanity suite against a monolith plugin.
// Ginkgo allows one suite run per test binary, so this is the only caller;
// it refuses go test -count other than 1, so the test skips then.
func TestSanity(t *testing.T) {
	if f := flag.Lookup("test.count"); f != nil && f.Value.String() != "1" {
		t.Skip("ginkgo runs its suite only with -count=1")
	}
	stateDir := t.TempDir()
	cfg, _ := testConfig(t, stateDir, "sanity-node")
	// A small pool lets the suite check RESOURCE_EXHAUSTED past the limit.
	cfg.MaxVolumesPerNode = 3
	p := startPlugin(t, cfg)

	sc := sanity.NewTestConfig()
	sc.Address = p.Endpoint()
	base := t.TempDir()
	sc.TargetPath = filepath.Join(base, "target")
	sc.StagingPath = filepath.Join(base, "staging")
	sc.TestNodeVolumeAttachLimit = true
	sanity.Test(t, sc)

	// The suite calls one thing at a time, so the detector must stay quiet.
	overlaps, err := ReadOverlaps(stateDir, cfg.NodeID)
	must.NoError(t, err)
	must.Eq(t, 0, overlaps)
	calls, err := ReadCalls(stateDir, cfg.NodeID)
	must.NoError(t, err)
	must.Positive(t, calls["ControllerPublishVolume"])
	must.Eq(t, calls, p.Calls())
}
