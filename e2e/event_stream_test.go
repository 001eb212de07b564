//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// eventFrame is one line of /v1/event/stream.
type eventFrame struct {
	Index  uint64
	Events []struct {
		Topic, Type, Key string
		Index            uint64
		Payload          struct {
			Volume *struct {
				ID     string
				Claims []struct{ AllocationID, State string }
			}
		}
	}
	Error string
}

// openEventStream subscribes at base with the given query and returns the
// frames as they come (heartbeats left out) until ctx ends or the stream
// does. The subscription exists once it returns.
func openEventStream(t *testing.T, ctx context.Context, base string, q url.Values) <-chan eventFrame {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/event/stream?"+q.Encode(), nil)
	must.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	must.EqOp(t, http.StatusOK, resp.StatusCode)
	out := make(chan eventFrame, 64)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<16), 1<<22)
		for sc.Scan() {
			var f eventFrame
			if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
				f.Error = fmt.Sprintf("decoding %q: %v", sc.Text(), err)
			}
			if f.Index == 0 && f.Error == "" {
				continue // heartbeat
			}
			select {
			case out <- f:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// readFrames reads frames until stop says so, failing on a stream error
// or when timeout passes.
func readFrames(t *testing.T, ch <-chan eventFrame, timeout time.Duration, stop func(eventFrame) bool) []eventFrame {
	t.Helper()
	deadline := time.After(timeout)
	var got []eventFrame
	for {
		select {
		case f, ok := <-ch:
			if !ok {
				t.Fatalf("e2e: event stream ended after %d frames", len(got))
			}
			must.EqOp(t, "", f.Error)
			got = append(got, f)
			if stop(f) {
				return got
			}
		case <-deadline:
			t.Fatalf("e2e: waited %s for events; got %d frames", timeout, len(got))
		}
	}
}

// claimStates renders the volume claims in a frame, for comparing.
func claimStates(f eventFrame) string {
	var s string
	for _, ev := range f.Events {
		if v := ev.Payload.Volume; v != nil {
			s += fmt.Sprintf("%d:%s:%s[", f.Index, ev.Type, v.ID)
			for _, c := range v.Claims {
				s += c.State + " "
			}
			s += "] "
		}
	}
	return s
}

func frameIndexes(fs []eventFrame) []uint64 {
	out := make([]uint64, 0, len(fs))
	for _, f := range fs {
		out = append(out, f.Index)
	}
	return out
}

// TestEventStream_ClaimEventsResumeWithoutGap follows a volume's claim
// through the event stream: a stream from one server is cut once the
// claim is taken, the claim is released meanwhile, and a stream resumed
// on another server from the last index seen plus one delivers the rest.
// Together they are exactly what a third stream, connected throughout,
// delivered: the same frames in rising index order, none missing, none
// repeated.
func TestEventStream_ClaimEventsResumeWithoutGap(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 3, Clients: 2})
	cc.createVolumeCLI(t, "ev", createVolumeSpec("ev", "1MiB", ""))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	// Both streams start after the volume's creation, by index: "from
	// now" would differ between servers that have applied different
	// amounts of the log.
	v, err := cc.volume("ev")
	must.NoError(t, err)
	filter := url.Values{"topic": {"CSIVolume:ev"}, "index": {fmt.Sprint(v.ModifyIndex + 1)}}
	whole := openEventStream(t, ctx, cc.ServerHTTP(0), filter)
	firstCtx, cut := context.WithCancel(ctx)
	first := openEventStream(t, firstCtx, cc.ServerHTTP(1), filter)

	cc.RunJob(csiJob("evjob", "service", 1, "ev", false, "", `while :; do sleep 1; done`))
	alloc := cc.waitCSIAllocs(t, "evjob", csiSettle, oneAlloc("running"))[0]
	cc.waitClaim(t, "ev", alloc.ID)
	taken := func(f eventFrame) bool {
		for _, ev := range f.Events {
			if v := ev.Payload.Volume; v != nil && len(v.Claims) == 1 && v.Claims[0].State == "taken" {
				return true
			}
		}
		return false
	}
	before := readFrames(t, first, csiSettle, taken)
	cut()
	last := before[len(before)-1].Index
	t.Logf("first stream cut after index %d: %v", last, frameIndexes(before))

	// While no one reads, the claim is released.
	cc.MustCLI("job", "stop", "evjob")
	cc.waitUnclaimed(t, "ev")

	released := func(f eventFrame) bool {
		for _, ev := range f.Events {
			if v := ev.Payload.Volume; v != nil && len(v.Claims) == 0 && ev.Type == "CSIVolumeClaim" {
				return true
			}
		}
		return false
	}
	resumed := openEventStream(t, ctx, cc.ServerHTTP(2), url.Values{"topic": {"CSIVolume:ev"}, "index": {fmt.Sprint(last + 1)}})
	after := readFrames(t, resumed, csiSettle, released)
	all := readFrames(t, whole, csiSettle, released)

	joined := append(slices.Clone(before), after...)
	idx := frameIndexes(joined)
	must.True(t, slices.IsSorted(idx), must.Sprintf("indexes out of order: %v", idx))
	must.Eq(t, frameIndexes(all), idx, must.Sprint("the resumed stream lost or repeated events"))
	for i := range all {
		must.EqOp(t, claimStates(all[i]), claimStates(joined[i]))
	}
	var types []string
	for _, f := range all {
		for _, ev := range f.Events {
			must.EqOp(t, "CSIVolume", ev.Topic)
			must.EqOp(t, "ev", ev.Key)
			must.EqOp(t, f.Index, ev.Index)
			types = append(types, ev.Type)
		}
	}
	must.SliceContains(t, types, "CSIVolumeClaim")
	var states string
	for _, f := range all {
		states += claimStates(f)
	}
	t.Logf("claim events: %s", states)
}
