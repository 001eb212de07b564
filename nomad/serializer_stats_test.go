package nomad

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// laneOf returns plugin's stats from l, or nil.
func laneOf(l *controllerLanes, plugin string) *structs.CSILaneStats {
	for _, s := range l.Stats() {
		if s.PluginID == plugin {
			return s
		}
	}
	return nil
}

// TestLane_Stats checks what the lanes report to operators: depth and
// calls in flight while calls queue, then each call's op and outcome, a
// timeout counted once, and the ring of recent calls kept in order and
// bounded.
func TestLane_Stats(t *testing.T) {
	const plugin = "ebs"
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)

	// A deadline far away, so the queue holds while the first call runs.
	l := newControllerLanes(t.Context(), time.Minute, hclog.NewNullLogger())
	must.SliceEmpty(t, l.Stats())
	block := make(chan struct{})
	started := make(chan struct{})
	wg.Go(func() {
		_ = l.Do(t.Context(), plugin, "publish", func(context.Context) error {
			close(started)
			<-block
			return nil
		})
	})
	<-started
	for i := range 3 {
		wg.Go(func() {
			_ = l.Do(t.Context(), plugin, fmt.Sprintf("op-%d", i), func(context.Context) error {
				return errors.New("refused")
			})
		})
	}
	waitDepth(t, l, plugin, 3)
	st := laneOf(l, plugin)
	must.NotNil(t, st)
	must.EqOp(t, 3, st.Depth)
	must.EqOp(t, 1, st.InFlight)
	must.EqOp(t, uint64(0), st.Calls)
	close(block)
	wg.Wait()

	st = laneOf(l, plugin)
	must.EqOp(t, 0, st.Depth)
	must.EqOp(t, 0, st.InFlight)
	must.EqOp(t, uint64(4), st.Calls)
	must.Len(t, 4, st.Recent)
	must.EqOp(t, "publish", st.Recent[0].Op)
	must.False(t, st.Recent[0].Failed)
	for _, c := range st.Recent[1:] {
		must.True(t, c.Failed)
	}

	// The ring keeps the latest calls, oldest first.
	for i := range structs.CSILaneRecentCalls + 5 {
		must.NoError(t, l.Do(t.Context(), plugin, fmt.Sprintf("n-%d", i), func(context.Context) error { return nil }))
	}
	st = laneOf(l, plugin)
	must.Len(t, structs.CSILaneRecentCalls, st.Recent)
	must.EqOp(t, "n-5", st.Recent[0].Op)
	must.EqOp(t, fmt.Sprintf("n-%d", structs.CSILaneRecentCalls+4), st.Recent[len(st.Recent)-1].Op)

	// A call past its deadline is counted as a timeout and marked.
	short := newControllerLanes(t.Context(), 20*time.Millisecond, hclog.NewNullLogger())
	must.NoError(t, short.Do(t.Context(), plugin, "slow", func(ctx context.Context) error {
		<-ctx.Done()
		return nil
	}))
	st = laneOf(short, plugin)
	must.EqOp(t, uint64(1), st.Timeouts)
	must.True(t, st.Recent[0].TimedOut)
	must.EqOp(t, 0, st.InFlight)
}
