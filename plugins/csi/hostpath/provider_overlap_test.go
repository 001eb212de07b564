package hostpath

import (
	"encoding/json"
	"os"
	"os/exec"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
)

// Two instances on one state dir (two nodes of one provider) with calls
// in flight at once are an overlap at the provider, though neither
// process saw two calls of its own.
func TestProviderOverlap_AcrossInstances(t *testing.T) {
	dir := t.TempDir()
	a, err := newOverlapTracker(dir, "node-a", hclog.NewNullLogger())
	must.NoError(t, err)
	b, err := newOverlapTracker(dir, "node-b", hclog.NewNullLogger())
	must.NoError(t, err)

	// One after the other: nothing.
	a.start("ControllerPublishVolume")()
	b.start("ControllerPublishVolume")()
	n, err := ReadProviderOverlaps(dir)
	must.NoError(t, err)
	must.Eq(t, 0, n)

	// At once: one overlap at the provider, none in either process.
	doneA := a.start("ControllerPublishVolume")
	doneB := b.start("ControllerUnpublishVolume")
	doneB()
	doneA()
	n, err = ReadProviderOverlaps(dir)
	must.NoError(t, err)
	must.Eq(t, 1, n)
	must.Eq(t, 0, a.overlapCount())
	must.Eq(t, 0, b.overlapCount())

	// Nothing is left in flight.
	a.start("DeleteVolume")()
	n, err = ReadProviderOverlaps(dir)
	must.NoError(t, err)
	must.Eq(t, 1, n)
}

// A call left in the record by a process that died mid-call is over: it
// does not count against the next one.
func TestProviderOverlap_DeadProcessIsNotInFlight(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("true")
	must.NoError(t, cmd.Run())
	dead := cmd.Process.Pid
	stale, err := json.Marshal([]providerCall{{PID: dead, NodeID: "node-x", Method: "ControllerPublishVolume", Seq: 1}})
	must.NoError(t, err)
	must.NoError(t, os.WriteFile(providerInFlightFile(dir), stale, 0o644))

	a, err := newOverlapTracker(dir, "node-a", hclog.NewNullLogger())
	must.NoError(t, err)
	a.start("ControllerPublishVolume")()
	n, err := ReadProviderOverlaps(dir)
	must.NoError(t, err)
	must.Eq(t, 0, n)
}
