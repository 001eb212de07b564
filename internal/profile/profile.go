// Package profile takes the Go runtime's profiles of the running process:
// what an agent's /v1/agent/pprof endpoints and `roam operator debug`
// collect. A request is checked before anything is taken, a CPU profile
// or an execution trace runs one at a time per process (the runtime
// allows no more), and the output is bounded.
package profile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"sync"
	"time"

	"github.com/roamhq/roam/structs"
)

// The kinds of profile. CPU and Trace run for Request.Seconds; the others
// are pprof's named profiles, taken at once.
const (
	CPU   = "profile"
	Trace = "trace"
)

// Named lists the named profiles a request may ask for, as runtime/pprof
// names them.
var Named = []string{"goroutine", "heap", "allocs", "threadcreate", "block", "mutex"}

const (
	// MaxSeconds bounds a CPU profile or a trace.
	MaxSeconds = 300
	// DefaultSeconds is a CPU profile's or a trace's length when the
	// request gives none (Nomad's default).
	DefaultSeconds = 1
	// MaxBytes bounds one profile's output; a larger one fails rather
	// than grow without end (a goroutine dump of a very busy agent).
	MaxBytes = 64 << 20
)

// ErrInvalid means a request names no profile this package takes, or is
// out of bounds; nothing was taken.
var ErrInvalid = errors.New("invalid profile request")

// ErrBusy means a CPU profile or a trace is already being taken in this
// process, or MaxNamed named profiles are. It is
// structs.ErrProfileInProgress, so that servers answer it with that
// sentinel's wire code (HTTP 409).
var ErrBusy = structs.ErrProfileInProgress

// MaxNamed bounds the named profiles taken at once: a goroutine dump stops
// the world and may run to MaxBytes, copied again on its way out.
const MaxNamed = 2

// ErrTooLarge means the profile outgrew MaxBytes: a refusal of the request
// (structs.ErrInvalidRequest), which a smaller one (debug=0) may avoid.
var ErrTooLarge = fmt.Errorf("%w: profile larger than %d bytes; ask for the binary format (debug=0)", structs.ErrInvalidRequest, MaxBytes)

// Request is one profile to take.
type Request struct {
	// Kind is CPU, Trace or one of Named.
	Kind string
	// Seconds is how long a CPU profile or a trace runs (0: the
	// default); it must be 0 for the others.
	Seconds int
	// Debug is pprof's debug level for named profiles: 0 the binary
	// format, 1 text, 2 (goroutine only) every stack in full.
	Debug int
	// GC runs a garbage collection before a heap profile.
	GC bool
}

// Validate names what is wrong with r, without taking anything.
func (r Request) Validate() error {
	timed := r.Kind == CPU || r.Kind == Trace
	switch {
	case !timed && !slices.Contains(Named, r.Kind):
		return fmt.Errorf("%w: unknown profile %q: want %s, %s or one of %v", ErrInvalid, r.Kind, CPU, Trace, Named)
	case r.Seconds < 0 || r.Seconds > MaxSeconds:
		return fmt.Errorf("%w: seconds = %d, must be from 0 to %d", ErrInvalid, r.Seconds, MaxSeconds)
	case !timed && r.Seconds != 0:
		return fmt.Errorf("%w: seconds applies to %s and %s only, not %q", ErrInvalid, CPU, Trace, r.Kind)
	case r.Debug < 0 || r.Debug > 2:
		return fmt.Errorf("%w: debug = %d, must be 0, 1 or 2", ErrInvalid, r.Debug)
	case timed && r.Debug != 0:
		return fmt.Errorf("%w: debug applies to named profiles only, not %q", ErrInvalid, r.Kind)
	case r.Debug == 2 && r.Kind != "goroutine":
		return fmt.Errorf("%w: debug = 2 is for goroutine only", ErrInvalid)
	case r.GC && r.Kind != "heap":
		return fmt.Errorf("%w: gc applies to heap only", ErrInvalid)
	}
	return nil
}

// Text reports whether r's output is text rather than pprof's binary
// format (or a trace).
func (r Request) Text() bool { return r.Debug > 0 }

// timed holds the one CPU profile or trace this process may take; named
// the slots of the named profiles.
var (
	timed sync.Mutex
	named = make(chan struct{}, MaxNamed)
)

// Take writes r's profile to w. A CPU profile or a trace stops early,
// with ctx's error, when ctx ends; output past MaxBytes fails it with
// ErrTooLarge.
func Take(ctx context.Context, r Request, w io.Writer) error {
	if err := r.Validate(); err != nil {
		return err
	}
	lw := &limitWriter{w: w, left: MaxBytes}
	switch r.Kind {
	case CPU, Trace:
		if !timed.TryLock() {
			return ErrBusy
		}
		defer timed.Unlock()
		secs := r.Seconds
		if secs == 0 {
			secs = DefaultSeconds
		}
		start, stop := pprof.StartCPUProfile, pprof.StopCPUProfile
		if r.Kind == Trace {
			start, stop = trace.Start, trace.Stop
		}
		if err := start(lw); err != nil {
			// Someone outside this package (a test's -cpuprofile) holds
			// the profiler.
			return fmt.Errorf("%w: %v", ErrBusy, err)
		}
		t := time.NewTimer(time.Duration(secs) * time.Second)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		stop()
		if lw.err != nil {
			return lw.err
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s stopped early: %w", r.Kind, err)
		}
		return nil
	}
	select {
	case named <- struct{}{}:
		defer func() { <-named }()
	default:
		return fmt.Errorf("%w: %d named profiles are being taken", ErrBusy, MaxNamed)
	}
	if r.GC {
		runtime.GC()
	}
	if err := pprof.Lookup(r.Kind).WriteTo(lw, r.Debug); err != nil {
		if lw.err != nil {
			return lw.err
		}
		return fmt.Errorf("write %s profile: %w", r.Kind, err)
	}
	return nil
}

// limitWriter fails once more than left bytes are written.
type limitWriter struct {
	w    io.Writer
	left int
	err  error
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	if len(p) > l.left {
		l.err = ErrTooLarge
		return 0, l.err
	}
	n, err := l.w.Write(p)
	l.left -= n
	if err != nil {
		l.err = err
	}
	return n, err
}
