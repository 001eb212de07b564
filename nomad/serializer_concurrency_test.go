package nomad

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/internal/upgrade"
	"github.com/roamhq/roam/structs"
)

// heldCall is one call sent into a lane that runs until its release is
// closed.
type heldCall struct {
	started chan struct{}
	release chan struct{}
	done    chan error
}

// sendHeld starts a call with key k into l's plugin lane at limit and
// returns at once. The call runs until the test closes its release.
func sendHeld(t *testing.T, ctx context.Context, l *controllerLanes, k laneadmit.Call, limit int) *heldCall {
	t.Helper()
	h := &heldCall{started: make(chan struct{}), release: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		h.done <- l.Call(ctx, laneRequest{PluginID: "ebs", Op: "publish", Key: k, Limit: limit}, func(context.Context) error {
			close(h.started)
			<-h.release
			return nil
		})
	}()
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
	})
	return h
}

// mustStart waits for h to start; the timeout guards against a hang.
func (h *heldCall) mustStart(t *testing.T, what string) {
	t.Helper()
	select {
	case <-h.started:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not start", what)
	}
}

// notStarted says whether h has not started.
func (h *heldCall) notStarted() bool {
	select {
	case <-h.started:
		return false
	default:
		return true
	}
}

func (h *heldCall) finish(t *testing.T) {
	t.Helper()
	close(h.release)
	select {
	case err := <-h.done:
		must.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("call did not return")
	}
}

func TestLane_ConcurrencyRunsUpToItsLimit(t *testing.T) {
	l := testLanes(t, t.Context())
	var calls []*heldCall
	for i := range 3 {
		calls = append(calls, sendHeld(t, t.Context(), l, laneadmit.Call{Volume: fmt.Sprintf("v%d", i)}, 3))
	}
	for i, c := range calls {
		c.mustStart(t, fmt.Sprintf("call %d", i))
	}
	// The lane is full: a fourth call waits, on a volume of its own.
	fourth := sendHeld(t, t.Context(), l, laneadmit.Call{Volume: "v3"}, 3)
	waitDepth(t, l, "ebs", 1)
	must.True(t, fourth.notStarted())
	must.Eq(t, 3, l.Stats()[0].InFlight)

	calls[1].finish(t)
	fourth.mustStart(t, "the fourth call once a slot freed")
	for _, c := range []*heldCall{calls[0], calls[2], fourth} {
		c.finish(t)
	}
	must.MapEmpty(t, l.lanes)
}

func TestLane_ConcurrencyKeepsVolumesAndNodesApart(t *testing.T) {
	l := testLanes(t, t.Context())
	a := sendHeld(t, t.Context(), l, laneadmit.Call{Volume: "a", Node: "n1"}, 4)
	a.mustStart(t, "a")
	sameVolume := sendHeld(t, t.Context(), l, laneadmit.Call{Volume: "a"}, 4)
	waitDepth(t, l, "ebs", 1)
	sameNode := sendHeld(t, t.Context(), l, laneadmit.Call{Volume: "b", Node: "n1"}, 4)
	waitDepth(t, l, "ebs", 2)
	free := sendHeld(t, t.Context(), l, laneadmit.Call{Volume: "c", Node: "n2"}, 4)

	// The free call passes the two that wait for a's volume and node.
	free.mustStart(t, "the call with free keys")
	must.True(t, sameVolume.notStarted(), must.Sprint("a second call on volume a ran beside the first"))
	must.True(t, sameNode.notStarted(), must.Sprint("a second publish to node n1 ran beside the first"))

	a.finish(t)
	sameVolume.mustStart(t, "the second call on volume a")
	sameNode.mustStart(t, "the second publish to node n1")
	for _, c := range []*heldCall{sameVolume, sameNode, free} {
		c.finish(t)
	}
	must.MapEmpty(t, l.lanes)
}

// A waiter holds its keys against the calls behind it; when it leaves
// without running, those calls must not be left waiting for it.
func TestLane_ConcurrencyWaiterThatLeavesFreesItsKeys(t *testing.T) {
	l := testLanes(t, t.Context())
	a := sendHeld(t, t.Context(), l, laneadmit.Call{Volume: "a"}, 4)
	a.mustStart(t, "a")
	ctx, cancel := context.WithCancel(t.Context())
	leaver := sendHeld(t, ctx, l, laneadmit.Call{Volume: "a", Node: "n1"}, 4)
	waitDepth(t, l, "ebs", 1)
	behind := sendHeld(t, t.Context(), l, laneadmit.Call{Volume: "b", Node: "n1"}, 4)
	waitDepth(t, l, "ebs", 2)
	must.True(t, behind.notStarted(), must.Sprint("a call passed an older one for its node"))

	cancel()
	must.ErrorIs(t, <-leaver.done, context.Canceled)
	behind.mustStart(t, "the call behind the one that left")
	must.True(t, leaver.notStarted())
	a.finish(t)
	behind.finish(t)
	must.MapEmpty(t, l.lanes)
}

// A call past its deadline gives up its place, keys included, as the
// one-call lane does: the next call on its volume starts.
func TestLane_ConcurrencyDeadlineFreesTheVolume(t *testing.T) {
	l := newControllerLanes(t.Context(), 50*time.Millisecond, hclog.NewNullLogger())
	hung := sendHeld(t, t.Context(), l, laneadmit.Call{Volume: "a"}, 4)
	hung.mustStart(t, "the hung call")
	next := sendHeld(t, t.Context(), l, laneadmit.Call{Volume: "a"}, 4)
	next.mustStart(t, "the next call on the volume once the first passed its deadline")
	next.finish(t)
	hung.finish(t)
	must.MapEmpty(t, l.lanes)
}

// A departing leader's waitIdle counts every call running in a lane of
// several, not one.
func TestLane_ConcurrencyWaitIdleWaitsForEveryCall(t *testing.T) {
	parent, end := context.WithCancel(t.Context())
	l := testLanes(t, parent)
	calls := []*heldCall{
		sendHeld(t, t.Context(), l, laneadmit.Call{Volume: "a"}, 2),
		sendHeld(t, t.Context(), l, laneadmit.Call{Volume: "b"}, 2),
	}
	for i, c := range calls {
		c.mustStart(t, fmt.Sprintf("call %d", i))
	}
	end()
	// Each wait is cut short on purpose: it must report what still runs.
	for i, c := range calls {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
		n, err := l.waitIdle(ctx)
		cancel()
		must.ErrorIs(t, err, context.DeadlineExceeded, must.Sprint("waitIdle returned with a call still running"))
		must.Eq(t, len(calls)-i, n, must.Sprint("calls counted running"))
		c.finish(t)
	}
	n, err := l.waitIdle(t.Context())
	must.NoError(t, err)
	must.Zero(t, n)
}

func TestPluginLaneLimit(t *testing.T) {
	v := upgrade.MustParse
	plugin := func(n int) *structs.CSIPlugin { return &structs.CSIPlugin{ID: "ebs", ControllerConcurrency: n} }
	for _, tc := range []struct {
		name   string
		plugin *structs.CSIPlugin
		min    upgrade.Version
		known  bool
		want   int
	}{
		{"no plugin", nil, v("0.3.0"), true, 1},
		{"every server reads LaneBusyBefore", plugin(8), v("0.3.0"), true, 8},
		{"a newer cluster", plugin(8), v("1.0.0"), true, 8},
		{"a server before 0.3.0 holds it to one", plugin(8), v("0.2.0"), true, 1},
		{"no build known", plugin(8), upgrade.Version{}, false, 1},
		{"the default", plugin(1), v("0.3.0"), true, 1},
		{"an older state's 0 is one", plugin(0), v("0.3.0"), true, 1},
		{"above the bound is the bound", plugin(1000), v("0.3.0"), true, laneadmit.MaxLimit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, pluginLaneLimit(tc.plugin, tc.min, tc.known))
		})
	}
}

func TestEarlierCallsEnded(t *testing.T) {
	plugin := &structs.CSIPlugin{Controllers: map[string]*structs.CSIInfo{
		"serial": {ControllerConcurrency: 1}, "old": {}, "wide": {ControllerConcurrency: 4},
	}}
	boom := errors.New("boom")
	for _, tc := range []struct {
		name   string
		plugin *structs.CSIPlugin
		node   string
		limit  int
		reply  *structs.CSIControllerReply
		err    error
		want   bool
	}{
		{"a success from a lane with nothing earlier left", plugin, "wide", 4, &structs.CSIControllerReply{}, nil, true},
		{"a success while an earlier call runs", plugin, "wide", 4, &structs.CSIControllerReply{LaneBusyBefore: true}, nil, false},
		{"a success without a reply (a lane of one)", plugin, "wide", 4, nil, nil, true},
		{"an error from a lane of one", plugin, "serial", 4, nil, boom, true},
		{"an error from an older client's lane, of one", plugin, "old", 4, nil, boom, true},
		{"an error from a lane of several says nothing", plugin, "wide", 4, &structs.CSIControllerReply{}, boom, false},
		{"an error from a controller gone from the plugin, a lane of one here", plugin, "gone", 1, nil, boom, true},
		{"an error from a controller gone from the plugin, a lane of several here", plugin, "gone", 4, nil, boom, false},
		{"an error, the plugin gone, a lane of one here", nil, "wide", 1, nil, boom, true},
		{"an error, the plugin gone, a lane of several here", nil, "wide", 4, nil, boom, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, earlierCallsEnded(tc.plugin, tc.node, tc.limit, tc.reply, tc.err))
		})
	}
}

// What the lanes API shows of a lane of several: its limit, and what each
// running and queued call holds.
func TestLane_ConcurrencyStatsShowKeys(t *testing.T) {
	l := testLanes(t, t.Context())
	a := sendHeld(t, t.Context(), l, laneadmit.Call{Volume: "a", Node: "n1"}, 2)
	a.mustStart(t, "a")
	b := sendHeld(t, t.Context(), l, laneadmit.Call{Volume: "b"}, 2)
	b.mustStart(t, "b")
	c := sendHeld(t, t.Context(), l, laneadmit.Call{Volume: "a"}, 2)
	waitDepth(t, l, "ebs", 1)

	st := laneOf(l, "ebs")
	must.NotNil(t, st)
	must.EqOp(t, 2, st.Limit)
	must.EqOp(t, 2, st.InFlight)
	must.EqOp(t, 1, st.Depth)
	must.Eq(t, []structs.CSILaneKey{{Op: "publish", Volume: "a", Node: "n1"}, {Op: "publish", Volume: "b"}}, st.Running)
	must.Eq(t, []structs.CSILaneKey{{Op: "publish", Volume: "a"}}, st.Queued)

	a.finish(t)
	c.mustStart(t, "c")
	b.finish(t)
	c.finish(t)
	st = laneOf(l, "ebs")
	must.SliceEmpty(t, st.Running)
	must.SliceEmpty(t, st.Queued)
	must.EqOp(t, 2, st.Limit, must.Sprint("the limit stays known while the lane is idle"))
}
