package hostpath

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// faultFixture is a plugin with one volume staged and published on its node.
type faultFixture struct {
	stateDir        string
	p               *Plugin
	c               clients
	logs            *lockedBuffer
	vol             string
	staging, target string
}

func newFaultFixture(t *testing.T, stateDir, nodeID string) *faultFixture {
	t.Helper()
	cfg, logs := testConfig(t, stateDir, nodeID)
	p := startPlugin(t, cfg)
	f := &faultFixture{stateDir: stateDir, p: p, c: dial(t, p), logs: logs}
	f.vol = createVolume(t, f.c, "vol-"+nodeID, singleWriter)
	dir := t.TempDir()
	f.staging, f.target = filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	dev, err := publish(context.Background(), f.c, f.vol, nodeID, singleWriter)
	must.NoError(t, err)
	stageAndPublish(t, f.c, f.vol, dev, f.staging, f.target)
	return f
}

func (f *faultFixture) unpublish(ctx context.Context) error {
	_, err := f.c.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: f.vol, TargetPath: f.target})
	return err
}

// waitHangs waits until the plugin has logged n hung calls.
func (f *faultFixture) waitHangs(t *testing.T, n int) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return countLines(f.logs.String(), "fault injected: call hangs") >= n }),
		wait.Timeout(10*time.Second),
		wait.Gap(5*time.Millisecond),
	), must.Sprintf("waiting for %d hung calls", n))
}

// published reports whether the volume's target link is still there.
func (f *faultFixture) published() bool {
	_, err := os.Lstat(f.target)
	return err == nil
}

// With the fault on, NodeUnpublishVolume hangs until its caller gives up,
// changes nothing, and leaves every other call alone; with it off again the
// same call unpublishes.
func TestFault_HangNodeUnpublishUntilCancel(t *testing.T) {
	f := newFaultFixture(t, t.TempDir(), "node-a")
	must.NoError(t, SetFault(f.stateDir, "", FaultHangNodeUnpublish, FaultUntilCancel))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errCh := make(chan error, 1)
	go func() { errCh <- f.unpublish(ctx) }()
	f.waitHangs(t, 1)

	// While it hangs, the node answers, and another volume is staged and
	// published on it.
	_, err := f.c.node.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
	must.NoError(t, err)
	other := createVolume(t, f.c, "other", singleWriter)
	dev, err := publish(context.Background(), f.c, other, "node-a", singleWriter)
	must.NoError(t, err)
	dir := t.TempDir()
	stageAndPublish(t, f.c, other, dev, filepath.Join(dir, "staging"), filepath.Join(dir, "target"))
	select {
	case err := <-errCh:
		t.Fatalf("hung unpublish returned before its caller gave up: %v", err)
	default:
	}

	cancel()
	err = <-errCh
	must.Eq(t, codes.Canceled, status.Code(err), must.Sprintf("error: %v", err))
	must.True(t, f.published(), must.Sprint("a hung unpublish that failed removed the target"))

	// A deadline ends it the same way, with DEADLINE_EXCEEDED.
	dctx, dcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer dcancel()
	mustCode(t, codes.DeadlineExceeded, f.unpublish(dctx))
	must.True(t, f.published())

	must.NoError(t, SetFault(f.stateDir, "", FaultHangNodeUnpublish, ""))
	must.NoError(t, f.unpublish(context.Background()))
	must.False(t, f.published())
	// The cancelled call, seen hanging above, is logged as ended by its
	// caller (as its handler returns, which may be just after the caller
	// has its error). The deadline's call may end before it reaches the
	// hang at all on a loaded machine, so it is not counted.
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return countLines(f.logs.String(), "hung call ended by its caller") >= 1 }),
		wait.Timeout(10*time.Second),
		wait.Gap(5*time.Millisecond),
	), must.Sprint("the cancelled hung call logged as ended by its caller"))
}

// With "forever" the call outlives its caller and, once the fault is off,
// goes on to unpublish: the caller never learned the outcome.
func TestFault_HangNodeUnpublishForever(t *testing.T) {
	f := newFaultFixture(t, t.TempDir(), "node-a")
	must.NoError(t, SetFault(f.stateDir, "", FaultHangNodeUnpublish, FaultForever))

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	mustCode(t, codes.DeadlineExceeded, f.unpublish(ctx))
	f.waitHangs(t, 1)
	must.True(t, f.published())
	must.Eq(t, 0, countLines(f.logs.String(), "hung call ended by its caller"))

	must.NoError(t, SetFault(f.stateDir, "", FaultHangNodeUnpublish, ""))
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return !f.published() }),
		wait.Timeout(10*time.Second),
		wait.Gap(5*time.Millisecond),
	), must.Sprint("the hung call did not finish once the fault was off"))
	must.StrContains(t, f.logs.String(), "fault switched off; hung call goes on")
}

// A fault named after a node hangs that instance only, and stopping the
// plugin ends a hang that nothing else would.
func TestFault_PerNodeAndStop(t *testing.T) {
	stateDir := t.TempDir()
	a := newFaultFixture(t, stateDir, "node-a")
	b := newFaultFixture(t, stateDir, "node-b")
	must.NoError(t, SetFault(stateDir, "node-a", FaultHangNodeUnpublish, FaultForever))

	errCh := make(chan error, 1)
	go func() { errCh <- a.unpublish(context.Background()) }()
	a.waitHangs(t, 1)

	must.NoError(t, b.unpublish(context.Background()))
	must.False(t, b.published())
	must.Eq(t, 0, countLines(b.logs.String(), "fault injected"))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must.NoError(t, a.p.Stop(ctx), must.Sprint("stop waited for the hung call"))
	mustCode(t, codes.Unavailable, <-errCh)
	must.True(t, a.published())
}

func TestSetFault_RefusesUnknownMode(t *testing.T) {
	err := SetFault(t.TempDir(), "", FaultHangNodeUnpublish, "sometimes")
	must.ErrorContains(t, err, "sometimes")
}
