package profile

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

func TestRequest_Validate(t *testing.T) {
	cases := []struct {
		name string
		r    Request
		bad  string // "" when valid; else what the error names
	}{
		{"cpu, default length", Request{Kind: CPU}, ""},
		{"cpu, 5 s", Request{Kind: CPU, Seconds: 5}, ""},
		{"trace at the bound", Request{Kind: Trace, Seconds: MaxSeconds}, ""},
		{"goroutine in full", Request{Kind: "goroutine", Debug: 2}, ""},
		{"heap after a GC", Request{Kind: "heap", GC: true}, ""},
		{"every named profile", Request{Kind: "mutex", Debug: 1}, ""},
		{"unknown kind", Request{Kind: "cmdline"}, `unknown profile "cmdline"`},
		{"empty kind", Request{}, `unknown profile ""`},
		{"a path for a kind", Request{Kind: "../heap"}, "unknown profile"},
		{"negative seconds", Request{Kind: CPU, Seconds: -1}, "seconds = -1"},
		{"seconds past the bound", Request{Kind: Trace, Seconds: MaxSeconds + 1}, "seconds = 301"},
		{"seconds on a named profile", Request{Kind: "heap", Seconds: 3}, "seconds applies to"},
		{"debug out of range", Request{Kind: "goroutine", Debug: 3}, "debug = 3"},
		{"debug on a cpu profile", Request{Kind: CPU, Debug: 1}, "debug applies to named profiles only"},
		{"debug 2 beyond goroutine", Request{Kind: "heap", Debug: 2}, "debug = 2 is for goroutine only"},
		{"gc beyond heap", Request{Kind: "goroutine", GC: true}, "gc applies to heap only"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.Validate()
			if tc.bad == "" {
				must.NoError(t, err)
				return
			}
			must.ErrorIs(t, err, ErrInvalid)
			must.StrContains(t, err.Error(), tc.bad)
			// Take refuses it too, writing nothing.
			var buf bytes.Buffer
			must.ErrorIs(t, Take(t.Context(), tc.r, &buf), ErrInvalid)
			must.Zero(t, buf.Len())
		})
	}
}

// gzipMagic starts pprof's binary format.
var gzipMagic = []byte{0x1f, 0x8b}

func TestTake_Profiles(t *testing.T) {
	var buf bytes.Buffer
	must.NoError(t, Take(t.Context(), Request{Kind: "goroutine", Debug: 2}, &buf))
	must.StrContains(t, buf.String(), "goroutine ")
	must.StrContains(t, buf.String(), "TestTake_Profiles", must.Sprint("the dump has this test's own stack"))

	buf.Reset()
	must.NoError(t, Take(t.Context(), Request{Kind: "heap", GC: true}, &buf))
	must.True(t, bytes.HasPrefix(buf.Bytes(), gzipMagic), must.Sprint("heap profile is not pprof's binary format"))

	buf.Reset()
	must.NoError(t, Take(t.Context(), Request{Kind: CPU, Seconds: 1}, &buf))
	must.True(t, bytes.HasPrefix(buf.Bytes(), gzipMagic), must.Sprint("CPU profile is not pprof's binary format"))
}

// One CPU profile or trace at a time: the second is refused at once, not
// queued, and a caller that goes away stops its own early.
func TestTake_OneTimedProfileAtATime(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		w := &signalWriter{started: started}
		done <- Take(ctx, Request{Kind: Trace, Seconds: MaxSeconds}, w)
	}()
	<-started // the trace has begun writing
	var buf bytes.Buffer
	must.ErrorIs(t, Take(t.Context(), Request{Kind: CPU, Seconds: 1}, &buf), ErrBusy)
	must.ErrorIs(t, Take(t.Context(), Request{Kind: Trace, Seconds: 1}, &buf), ErrBusy)
	// Named profiles do not wait for it.
	must.NoError(t, Take(t.Context(), Request{Kind: "threadcreate", Debug: 1}, &buf))

	cancel()
	err := <-done
	must.ErrorIs(t, err, context.Canceled)
	must.StrContains(t, err.Error(), "stopped early")
	// And the profiler is free again.
	buf.Reset()
	must.NoError(t, Take(t.Context(), Request{Kind: CPU, Seconds: 1}, &buf))
}

type signalWriter struct {
	started chan struct{}
	once    bool
}

func (w *signalWriter) Write(p []byte) (int, error) {
	if !w.once {
		w.once = true
		close(w.started)
	}
	return len(p), nil
}

func TestLimitWriter(t *testing.T) {
	var buf bytes.Buffer
	lw := &limitWriter{w: &buf, left: 10}
	n, err := lw.Write([]byte("12345"))
	must.NoError(t, err)
	must.Eq(t, 5, n)
	_, err = lw.Write([]byte("123456"))
	must.ErrorIs(t, err, ErrTooLarge)
	_, err = lw.Write([]byte("1"))
	must.True(t, errors.Is(err, ErrTooLarge), must.Sprint("a failed writer stays failed"))
	must.Eq(t, "12345", buf.String())
	must.True(t, strings.Contains(ErrTooLarge.Error(), "67108864"))
}

// Named profiles are taken MaxNamed at a time; one more is refused, not
// queued.
func TestTake_NamedProfilesBounded(t *testing.T) {
	for range MaxNamed {
		named <- struct{}{}
	}
	var buf bytes.Buffer
	err := Take(t.Context(), Request{Kind: "goroutine", Debug: 2}, &buf)
	must.ErrorIs(t, err, ErrBusy)
	must.Zero(t, buf.Len())
	for range MaxNamed {
		<-named
	}
	must.NoError(t, Take(t.Context(), Request{Kind: "goroutine", Debug: 2}, &buf))
}
