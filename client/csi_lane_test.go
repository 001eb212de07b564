package client

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/plugins/csi/hostpath"
	"github.com/roamhq/roam/structs"
)

// runLane starts a lane with a fixed limit, stopped at the test's end.
func runLane(t *testing.T, limit int) *csiLane {
	t.Helper()
	l := newCSILane(hclog.NewNullLogger(), func() int { return limit })
	ctx, cancel := context.WithCancel(context.Background())
	go l.run(ctx)
	t.Cleanup(func() {
		cancel()
		<-l.stopped
	})
	return l
}

// laneCall is one call sent into a csiLane that runs until released.
type laneCall struct {
	started, release chan struct{}
	done             chan csiLaneResult
}

func sendLaneCall(t *testing.T, ctx context.Context, l *csiLane, key laneadmit.Call) *laneCall {
	t.Helper()
	return sendBoundedLaneCall(t, ctx, l, key, laneBounds{timeout: time.Minute})
}

func sendBoundedLaneCall(t *testing.T, ctx context.Context, l *csiLane, key laneadmit.Call, b laneBounds) *laneCall {
	t.Helper()
	c := &laneCall{started: make(chan struct{}), release: make(chan struct{}), done: make(chan csiLaneResult, 1)}
	go func() {
		busy, err := l.do(ctx, "ControllerPublishVolume", key, b, func(context.Context) error {
			close(c.started)
			<-c.release
			return nil
		})
		c.done <- csiLaneResult{err: err, busyBefore: busy}
	}()
	t.Cleanup(c.free)
	return c
}

func (c *laneCall) free() {
	select {
	case <-c.release:
	default:
		close(c.release)
	}
}

func (c *laneCall) mustStart(t *testing.T, what string) {
	t.Helper()
	select {
	case <-c.started:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not start", what)
	}
}

func (c *laneCall) waiting() bool {
	select {
	case <-c.started:
		return false
	default:
		return true
	}
}

// finish releases the call and returns how it ended.
func (c *laneCall) finish(t *testing.T) csiLaneResult {
	t.Helper()
	c.free()
	select {
	case r := <-c.done:
		must.NoError(t, r.err)
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("call did not return")
		return csiLaneResult{}
	}
}

// waitQueued waits until n calls are queued in l.
func waitQueued(t *testing.T, l *csiLane, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		l.mu.Lock()
		got := len(l.queue)
		l.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", got, n)
		}
		<-tick.C
	}
}

func TestCSILane_OneAtATimeByDefault(t *testing.T) {
	l := runLane(t, 1)
	a := sendLaneCall(t, t.Context(), l, laneadmit.Call{Volume: "a"})
	a.mustStart(t, "a")
	b := sendLaneCall(t, t.Context(), l, laneadmit.Call{Volume: "b"})
	waitQueued(t, l, 1)
	must.True(t, b.waiting(), must.Sprint("a second call ran beside the first in a lane of one"))
	must.False(t, a.finish(t).busyBefore)
	b.mustStart(t, "b")
	must.False(t, b.finish(t).busyBefore, must.Sprint("a lane of one never has an earlier call left"))
}

func TestCSILane_SeveralAtOnceNeverOnOneVolumeOrNode(t *testing.T) {
	l := runLane(t, 3)
	a := sendLaneCall(t, t.Context(), l, laneadmit.Call{Volume: "a", Node: "n1"})
	a.mustStart(t, "a")
	sameVolume := sendLaneCall(t, t.Context(), l, laneadmit.Call{Volume: "a"})
	waitQueued(t, l, 1)
	sameNode := sendLaneCall(t, t.Context(), l, laneadmit.Call{Volume: "b", Node: "n1"})
	waitQueued(t, l, 2)
	free := sendLaneCall(t, t.Context(), l, laneadmit.Call{Volume: "c", Node: "n2"})
	free.mustStart(t, "the call with free keys")
	must.True(t, sameVolume.waiting(), must.Sprint("two calls on volume a at once"))
	must.True(t, sameNode.waiting(), must.Sprint("two publishes to node n1 at once"))

	// free arrived after a, which still runs.
	must.True(t, free.finish(t).busyBefore, must.Sprint("an earlier call still ran"))
	must.False(t, a.finish(t).busyBefore)
	sameVolume.mustStart(t, "the second call on volume a")
	sameNode.mustStart(t, "the second publish to node n1")
	r1, r2 := sameVolume.finish(t), sameNode.finish(t)
	must.False(t, r1.busyBefore)
	must.False(t, r2.busyBefore, must.Sprint("every earlier call had ended"))
}

func TestCSILane_AbandonedCallFreesTheCallsBehindIt(t *testing.T) {
	l := runLane(t, 4)
	a := sendLaneCall(t, t.Context(), l, laneadmit.Call{Volume: "a"})
	a.mustStart(t, "a")
	ctx, cancel := context.WithCancel(t.Context())
	leaver := sendLaneCall(t, ctx, l, laneadmit.Call{Volume: "a", Node: "n1"})
	waitQueued(t, l, 1)
	behind := sendLaneCall(t, t.Context(), l, laneadmit.Call{Volume: "b", Node: "n1"})
	waitQueued(t, l, 2)
	must.True(t, behind.waiting(), must.Sprint("a call passed an older one for its node"))

	cancel()
	r := <-leaver.done
	must.ErrorIs(t, r.err, context.Canceled)
	behind.mustStart(t, "the call behind the abandoned one")
	// a, older, still runs.
	must.True(t, behind.finish(t).busyBefore)
	must.False(t, a.finish(t).busyBefore)
	must.True(t, leaver.waiting(), must.Sprint("an abandoned call ran"))
}

// A call whose turn comes after the wait its sender allows is refused
// unrun: the sender's fence, which keeps the plugin's calls on this node
// while the call may run, lasts only that wait plus the call's timeout.
// A call whose turn comes in time runs.
func TestCSILane_CallWhoseTurnComesTooLateIsNotRun(t *testing.T) {
	l := runLane(t, 1)
	a := sendLaneCall(t, t.Context(), l, laneadmit.Call{Volume: "a"})
	a.mustStart(t, "a")
	late := sendBoundedLaneCall(t, t.Context(), l, laneadmit.Call{Volume: "b"}, laneBounds{timeout: time.Minute, startWithin: time.Nanosecond})
	waitQueued(t, l, 1)
	inTime := sendBoundedLaneCall(t, t.Context(), l, laneadmit.Call{Volume: "c"}, laneBounds{timeout: time.Minute, startWithin: time.Minute})
	waitQueued(t, l, 2)

	a.finish(t)
	select {
	case r := <-late.done:
		must.ErrorIs(t, r.err, structs.ErrCSIUnavailable)
		must.StrContains(t, r.err.Error(), "not run")
	case <-time.After(10 * time.Second):
		t.Fatal("the late call did not return")
	}
	must.True(t, late.waiting(), must.Sprint("a call ran after its sender stopped counting on it"))
	inTime.mustStart(t, "the call whose turn came in time")
	must.False(t, inTime.finish(t).busyBefore)
}

// The sender's Timeout bounds the call when it is below the client's own.
func TestCSIManager_SenderTimeoutBoundsTheCall(t *testing.T) {
	p := testHostpath(t, hostpath.ModeMonolith, "node-t", t.TempDir(), nil)
	m := testCSIManager(t, nil) // its own bound: 30 s
	must.NoError(t, m.AddPlugin(&CSIPluginConfig{ID: "hp", Type: CSIPluginTypeMonolith, Socket: p.Endpoint()}))
	for _, tc := range []struct {
		sender, want time.Duration
	}{
		{0, 30 * time.Second},
		{5 * time.Second, 5 * time.Second},
		{time.Hour, 30 * time.Second},
	} {
		var left time.Duration
		err := m.controllerCall(t.Context(), "hp", "ListVolumes", structs.CSIControllerQuery{Timeout: tc.sender}, laneadmit.Call{}, nil,
			func(ctx context.Context, _ *csiPluginClient) error {
				dl, ok := ctx.Deadline()
				must.True(t, ok)
				left = time.Until(dl)
				return nil
			})
		must.NoError(t, err)
		must.LessEq(t, tc.want, left, must.Sprintf("sender's timeout %s", tc.sender))
		must.Greater(t, tc.want-time.Second, left, must.Sprintf("sender's timeout %s", tc.sender))
	}
}

// A lane's limit is its plugin's controller_concurrency only once every
// server runs a build that reads LaneBusyBefore.
func TestCSIManager_LaneLimitWaitsForEveryServer(t *testing.T) {
	m := testCSIManager(t, nil)
	four := &CSIPluginConfig{ControllerConcurrency: 4}
	unset := &CSIPluginConfig{}
	for _, tc := range []struct {
		min         string
		cfg         *CSIPluginConfig
		wantLimit   int
		description string
	}{
		{"", four, 1, "no server reported a build"},
		{"garbage", four, 1, "an unreadable build"},
		{"0.2.0", four, 1, "a server before concurrent lanes"},
		{"0.3.0", four, 4, "every server has them"},
		{"0.4.1", four, 4, "newer"},
		{"0.3.0", unset, 1, "unset is 1"},
	} {
		if tc.min != "" {
			m.SetMinServerVersion(tc.min)
		}
		must.Eq(t, tc.wantLimit, m.laneLimit(tc.cfg), must.Sprintf("%s (min %q)", tc.description, tc.min))
	}
}

// A plugin with controller_concurrency 2 runs one call at a time until a
// heartbeat answer says every server has upgrade.ControllerConcurrency;
// then the call waiting starts at once, without another call to wake the
// lane.
func TestCSIManager_GateOpeningAdmitsWaitingCalls(t *testing.T) {
	p := testHostpath(t, hostpath.ModeMonolith, "node-w", t.TempDir(), nil)
	m := testCSIManager(t, nil)
	must.NoError(t, m.AddPlugin(&CSIPluginConfig{ID: "hp", Type: CSIPluginTypeMonolith, Socket: p.Endpoint(), ControllerConcurrency: 2}))
	m.SetMinServerVersion("0.2.0")

	// ListVolumes: a call the lane runs without a term at any version.
	call := func(vol string, started chan<- struct{}, release <-chan struct{}) chan error {
		done := make(chan error, 1)
		go func() {
			done <- m.controllerCall(context.Background(), "hp", "ListVolumes", structs.CSIControllerQuery{}, laneadmit.Call{Volume: vol}, nil,
				func(context.Context, *csiPluginClient) error {
					close(started)
					<-release
					return nil
				})
		}()
		return done
	}
	aStarted, bStarted := make(chan struct{}), make(chan struct{})
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	aDone := call("a", aStarted, release)
	<-aStarted
	bDone := call("b", bStarted, release)
	mp, err := m.controllerPlugin("hp")
	must.NoError(t, err)
	waitQueued(t, mp.lane, 1)
	select {
	case <-bStarted:
		t.Fatal("a second call ran before every server could take it")
	default:
	}

	m.SetMinServerVersion("0.3.0")
	select {
	case <-bStarted:
	case <-time.After(10 * time.Second):
		t.Fatal("the call waiting did not start once the gate opened")
	}
	close(release)
	must.NoError(t, <-aDone)
	must.NoError(t, <-bDone)
}
