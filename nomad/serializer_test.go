package nomad

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// Do runs fn in pluginID's lane alone: Call with no key and a limit of
// one, the lane every plugin had before controller_concurrency. Only the
// tests call it; the server sends every call through onController.
func (l *controllerLanes) Do(ctx context.Context, pluginID string, op string, fn func(ctx context.Context) error) error {
	return l.Call(ctx, laneRequest{PluginID: pluginID, Op: op, Limit: 1}, fn)
}

// testLanes returns lanes whose calls have a deadline far beyond any test,
// so only the test that asks for a short one ever meets it.
func testLanes(t *testing.T, parent context.Context) *controllerLanes {
	t.Helper()
	return newControllerLanes(parent, time.Minute, hclog.NewNullLogger())
}

// waitDepth polls until n callers wait in plugin's lane. The timeout is a
// safety net against a hang, not a budget the test measures.
func waitDepth(t *testing.T, l *controllerLanes, plugin string, n int) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			if got := l.Depth(plugin); got != n {
				return fmt.Errorf("depth of %q is %d, want %d", plugin, got, n)
			}
			return nil
		}),
		wait.Timeout(10*time.Second),
		wait.Gap(time.Millisecond),
	))
}

// maxTracker counts calls in flight and keeps the highest count seen.
type maxTracker struct {
	inFlight atomic.Int64
	max      atomic.Int64
}

func (m *maxTracker) enter() {
	n := m.inFlight.Add(1)
	for {
		old := m.max.Load()
		if n <= old || m.max.CompareAndSwap(old, n) {
			return
		}
	}
}

func (m *maxTracker) leave() { m.inFlight.Add(-1) }

// orderLog records the order in which calls ran.
type orderLog struct {
	mu  sync.Mutex
	ran []int
}

func (o *orderLog) add(i int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ran = append(o.ran, i)
}

func (o *orderLog) get() []int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]int(nil), o.ran...)
}

func TestLane_OneAtATimeInArrivalOrder(t *testing.T) {
	l := testLanes(t, t.Context())
	const plugin, callers = "ebs", 10

	var track maxTracker
	var order orderLog
	gate := make(chan struct{})
	firstRunning := make(chan struct{})
	errs := make([]error, callers)
	var wg sync.WaitGroup

	call := func(i int) {
		defer wg.Done()
		errs[i] = l.Do(t.Context(), plugin, "publish", func(ctx context.Context) error {
			track.enter()
			defer track.leave()
			order.add(i)
			if i == 0 {
				close(firstRunning)
				<-gate
			}
			return nil
		})
	}

	// Caller 0 holds the lane; each later caller starts only once the one
	// before it is seen queued, which fixes the arrival order.
	wg.Add(1)
	go call(0)
	<-firstRunning
	for i := 1; i < callers; i++ {
		wg.Add(1)
		go call(i)
		waitDepth(t, l, plugin, i)
	}
	close(gate)
	wg.Wait()

	for i, err := range errs {
		must.NoError(t, err, must.Sprintf("caller %d", i))
	}
	must.Eq(t, 1, track.max.Load())
	want := make([]int, callers)
	for i := range want {
		want[i] = i
	}
	must.Eq(t, want, order.get())
	must.Eq(t, 0, l.Depth(plugin))
	must.MapEmpty(t, l.lanes)
}

func TestLane_NeverOverlapsUnderContention(t *testing.T) {
	l := testLanes(t, t.Context())
	const goroutines, calls = 32, 50

	var track maxTracker
	var done atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Go(func() {
			for c := 0; c < calls; c++ {
				err := l.Do(t.Context(), "ebs", "delete", func(context.Context) error {
					track.enter()
					defer track.leave()
					done.Add(1)
					return nil
				})
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()

	must.Eq(t, 1, track.max.Load())
	must.Eq(t, goroutines*calls, done.Load())
	must.MapEmpty(t, l.lanes)
}

func TestLane_ReturnsFnError(t *testing.T) {
	l := testLanes(t, t.Context())
	boom := errors.New("boom")
	err := l.Do(t.Context(), "ebs", "expand", func(context.Context) error { return boom })
	must.ErrorIs(t, err, boom)
	// The lane is free again.
	must.NoError(t, l.Do(t.Context(), "ebs", "expand", func(context.Context) error { return nil }))
}

func TestLane_PluginsOverlap(t *testing.T) {
	l := testLanes(t, t.Context())
	aRunning := make(chan struct{})
	bRunning := make(chan struct{})

	// A's call holds its lane until B's call has started: B must not wait
	// for A. If lanes were shared, A would wait out its (long) deadline and
	// report that B never ran.
	var aErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		aErr = l.Do(t.Context(), "plugin-a", "publish", func(ctx context.Context) error {
			close(aRunning)
			select {
			case <-bRunning:
				return nil
			case <-ctx.Done():
				return fmt.Errorf("plugin-b never started while plugin-a ran: %w", ctx.Err())
			}
		})
	})
	<-aRunning
	err := l.Do(t.Context(), "plugin-b", "publish", func(context.Context) error {
		close(bRunning)
		return nil
	})
	must.NoError(t, err)
	wg.Wait()
	must.NoError(t, aErr)
}

func TestLane_ParentCancelEndsWaitersNotRunningCall(t *testing.T) {
	parent, cancelParent := context.WithCancel(t.Context())
	t.Cleanup(cancelParent)
	l := testLanes(t, parent)
	const plugin, waiters = "ebs", 4

	running := make(chan struct{})
	gate := make(chan struct{})
	var ranAfterCancel atomic.Int64
	var runningCtxErr error
	var runningErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		runningErr = l.Do(t.Context(), plugin, "unpublish", func(ctx context.Context) error {
			close(running)
			<-gate
			runningCtxErr = ctx.Err()
			return nil
		})
	})
	<-running

	errs := make(chan error, waiters)
	for i := 1; i <= waiters; i++ {
		wg.Go(func() {
			errs <- l.Do(t.Context(), plugin, "unpublish", func(context.Context) error {
				ranAfterCancel.Add(1)
				return nil
			})
		})
		waitDepth(t, l, plugin, i)
	}

	cancelParent()
	for i := 0; i < waiters; i++ {
		err := <-errs
		must.ErrorIs(t, err, structs.ErrNoLeader)
		must.True(t, structs.IsRetryable(err))
	}
	must.Eq(t, 0, l.Depth(plugin))

	// A call arriving after the parent ended is refused at once.
	err := l.Do(t.Context(), plugin, "unpublish", func(context.Context) error {
		ranAfterCancel.Add(1)
		return nil
	})
	must.ErrorIs(t, err, structs.ErrNoLeader)

	// The running call was not cut: it finishes with a live context.
	close(gate)
	wg.Wait()
	must.NoError(t, runningErr)
	must.NoError(t, runningCtxErr)
	must.Eq(t, 0, ranAfterCancel.Load())
	must.MapEmpty(t, l.lanes)
}

func TestLane_CallerCancelRemovesOnlyThatWaiter(t *testing.T) {
	l := testLanes(t, t.Context())
	const plugin = "ebs"

	var order orderLog
	running := make(chan struct{})
	gate := make(chan struct{})
	ctxs := make([]context.Context, 4)
	cancels := make([]context.CancelFunc, 4)
	for i := range ctxs {
		ctxs[i], cancels[i] = context.WithCancel(t.Context())
		t.Cleanup(cancels[i])
	}
	errs := make([]error, 4)
	var wg sync.WaitGroup
	call := func(i int) {
		errs[i] = l.Do(ctxs[i], plugin, "publish", func(context.Context) error {
			order.add(i)
			if i == 0 {
				close(running)
				<-gate
			}
			return nil
		})
	}

	wg.Go(func() { call(0) })
	<-running
	for i := 1; i <= 3; i++ {
		wg.Go(func() { call(i) })
		waitDepth(t, l, plugin, i)
	}

	cancels[2]()
	waitDepth(t, l, plugin, 2)
	close(gate)
	wg.Wait()

	must.NoError(t, errs[0])
	must.NoError(t, errs[1])
	must.ErrorIs(t, errs[2], context.Canceled)
	must.NoError(t, errs[3])
	must.Eq(t, []int{0, 1, 3}, order.get())
}

func TestLane_CallerCancelDoesNotCutRunningCall(t *testing.T) {
	l := testLanes(t, t.Context())
	type key struct{}
	ctx, cancel := context.WithCancel(context.WithValue(t.Context(), key{}, "v"))
	t.Cleanup(cancel)

	err := l.Do(ctx, "ebs", "delete", func(callCtx context.Context) error {
		cancel()
		if err := callCtx.Err(); err != nil {
			return fmt.Errorf("call cut by caller cancel: %w", err)
		}
		if _, ok := callCtx.Deadline(); !ok {
			return errors.New("call has no deadline")
		}
		if got := callCtx.Value(key{}); got != "v" {
			return fmt.Errorf("caller's values lost: got %v", got)
		}
		return nil
	})
	must.NoError(t, err)

	// A caller whose context has already ended never runs.
	err = l.Do(ctx, "ebs", "delete", func(context.Context) error {
		return errors.New("ran with a cancelled caller")
	})
	must.ErrorIs(t, err, context.Canceled)
}

func TestLane_HungCallReleasedAtDeadline(t *testing.T) {
	l := newControllerLanes(t.Context(), 50*time.Millisecond, hclog.NewNullLogger())
	const plugin = "ebs"

	var wg sync.WaitGroup
	hang := make(chan struct{})
	// Cleanups run last-in first-out: unblock the hung call, then wait for
	// its caller.
	t.Cleanup(wg.Wait)
	t.Cleanup(func() { close(hang) })

	hungRunning := make(chan struct{})
	var hungReturned atomic.Bool
	wg.Go(func() {
		_ = l.Do(t.Context(), plugin, "publish", func(context.Context) error {
			close(hungRunning)
			<-hang // ignores its context, as a stuck plugin would
			hungReturned.Store(true)
			return nil
		})
	})
	<-hungRunning

	// The next call runs although the hung one never returned.
	var nextRan bool
	err := l.Do(t.Context(), plugin, "publish", func(context.Context) error {
		nextRan = true
		return nil
	})
	must.NoError(t, err)
	must.True(t, nextRan)
	must.False(t, hungReturned.Load())
	must.MapEmpty(t, l.lanes)
}

func BenchmarkLane_Uncontended(b *testing.B) {
	l := newControllerLanes(b.Context(), time.Minute, hclog.NewNullLogger())
	noop := func(context.Context) error { return nil }
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Do(ctx, "ebs", "publish", noop); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLane_8Plugins(b *testing.B) {
	l := newControllerLanes(b.Context(), time.Minute, hclog.NewNullLogger())
	plugins := make([]string, 8)
	for i := range plugins {
		plugins[i] = fmt.Sprintf("plugin-%d", i)
	}
	noop := func(context.Context) error { return nil }
	ctx := b.Context()
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		plugin := plugins[next.Add(1)%int64(len(plugins))]
		for pb.Next() {
			if err := l.Do(ctx, plugin, "publish", noop); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
