package lincheck

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Recorder records a history: each operation's call and return, on the
// monotonic clock, from any number of goroutines.
type Recorder struct {
	start time.Time

	mu  sync.Mutex
	ops []porcupine.Operation
}

// NewRecorder starts a history now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Offset is t as the history records it: nanoseconds since the
// recorder's start, on the monotonic clock (t must carry it, as time.Now's
// does). It lets a caller pick out the operations called within a window.
func (r *Recorder) Offset(t time.Time) int64 { return int64(t.Sub(r.start)) }

// Call is an operation called and not yet returned.
type Call struct {
	r      *Recorder
	client int
	in     Input
	at     int64
}

// Begin records a call by client (a worker's number, for the
// visualization) of in, now.
func (r *Recorder) Begin(client int, in Input) *Call {
	at := int64(time.Since(r.start))
	if in.Stale {
		// A stale read may see any state from the history's start on.
		at = 0
	}
	return &Call{r: r, client: client, in: in, at: at}
}

// End records the call's return, now, with out. An Unknown result is
// recorded as never returned: its effect, if any, may land at any point
// after the call. A read that failed is left out: it changed nothing and
// saw nothing.
func (c *Call) End(out Output) {
	if c.in.Kind == KindRead && out.Result != OK {
		return
	}
	ret := int64(time.Since(c.r.start))
	if out.Result == Unknown {
		ret = math.MaxInt64
	}
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	c.r.ops = append(c.r.ops, porcupine.Operation{ClientId: c.client, Input: c.in, Call: c.at, Output: out, Return: ret})
}

// History returns the operations recorded so far.
func (r *Recorder) History() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]porcupine.Operation(nil), r.ops...)
}

// Verdict is a check's outcome.
type Verdict struct {
	// Result is porcupine's: Ok, Illegal, or Unknown when the check ran
	// out of time.
	Result porcupine.CheckResult
	// Ops counts the operations checked, Unknowns those of them whose
	// outcome was unknown, Reads the reads and Stale the stale ones.
	Ops, Unknowns, Reads, Stale int
	// ByResult counts the operations by result.
	ByResult map[Result]int
	// Failed describes the stale read that could not be placed, when the
	// rest of the history passed and one could not.
	Failed string
	// Took is how long the check ran.
	Took time.Duration

	info  porcupine.LinearizationInfo
	model porcupine.Model
}

// Check checks history against the model of spec, for at most timeout.
func Check(spec Spec, history []porcupine.Operation, timeout time.Duration) Verdict {
	return check(model{spec: spec}, history, timeout)
}

// CheckBroken is Check with a model that forgets that claims conflict: a
// judge with a bug, for showing that the check is not blind to its model
// (any history with a claim refused as busy fails it).
func CheckBroken(spec Spec, history []porcupine.Operation, timeout time.Duration) Verdict {
	return check(model{spec: spec, broken: true}, history, timeout)
}

// check checks history in two passes: every operation but the stale
// reads together, then each stale read on its own, added to the
// operations on its volume.
//
// A stale read may show any state from the history's start to its
// return, so it is pending from the start and porcupine may place it
// anywhere before its return. Tens of them together make the search
// exponential: a 90-second chaos history with 49 stale reads
// (testdata/chaos-stale-reads.json.gz) ran past 90 s, and checks in
// milliseconds without them.
//
// A read changes no volume; in the model it only narrows what is known (a
// claim of unknown outcome that a read shows taken is held from then on).
// Taking such a read out leaves the claim reserved, which may drift to
// releasing and then must read as releasing, where a held one could read
// as anything: a history could pass with the read and fail without it
// only if a claim read releasing and later not releasing with no claim
// between, which no correct volume shows (a release, once begun, goes on).
// So the split fails no history that the joint check would pass. What it
// gives up is holding the stale reads to one linearization together: each
// may pick its own order of the writes whose outcome is unknown. Reads
// from different servers' own copies promise no order among themselves
// beyond that, so little is lost.
func check(m model, history []porcupine.Operation, timeout time.Duration) (v Verdict) {
	history = closeOpen(history)
	v = Verdict{Ops: len(history), ByResult: make(map[Result]int), model: m.porcupine()}
	var rest, stale []porcupine.Operation
	for _, op := range history {
		in, out := op.Input.(Input), op.Output.(Output)
		v.ByResult[out.Result]++
		if out.Result == Unknown {
			v.Unknowns++
		}
		if in.Kind == KindRead {
			v.Reads++
		}
		if in.Stale {
			v.Stale++
			stale = append(stale, op)
			continue
		}
		rest = append(rest, op)
	}
	start := time.Now()
	deadline := start.Add(timeout)
	defer func() { v.Took = time.Since(start) }()
	v.Result, v.info = porcupine.CheckOperationsVerbose(v.model, rest, timeout)
	for _, r := range stale {
		if v.Result != porcupine.Ok {
			break
		}
		left := time.Until(deadline)
		if left <= 0 {
			v.Result = porcupine.Unknown
			break
		}
		one := append(onVolume(rest, r.Input.(Input).Volume), r)
		if v.Result = porcupine.CheckOperationsTimeout(v.model, one, left); v.Result != porcupine.Illegal {
			continue // Ok, or Unknown: out of time, and the loop ends
		}
		v.Failed = describeOperation(r.Input, r.Output)
		// The view shows the volume's history with the read that failed;
		// an illegal one proves quickly, as the first pass did.
		_, v.info = porcupine.CheckOperationsVerbose(v.model, one, left)
	}
	return v
}

// onVolume returns a copy of the operations of history on volume.
func onVolume(history []porcupine.Operation, volume string) []porcupine.Operation {
	var out []porcupine.Operation
	for _, op := range history {
		if op.Input.(Input).Volume == volume {
			out = append(out, op)
		}
	}
	return out
}

// checkQuick is check's result alone.
func checkQuick(m model, history []porcupine.Operation, timeout time.Duration) porcupine.CheckResult {
	return check(m, history, timeout).Result
}

// closeOpen gives the operations that never returned a return time past
// every other event: porcupine's visualization needs finite times.
func closeOpen(history []porcupine.Operation) []porcupine.Operation {
	var last int64
	for _, op := range history {
		if op.Return != math.MaxInt64 && op.Return > last {
			last = op.Return
		}
		if op.Call > last {
			last = op.Call
		}
	}
	out := make([]porcupine.Operation, len(history))
	for i, op := range history {
		if op.Return == math.MaxInt64 {
			op.Return = last + 1
		}
		out[i] = op
	}
	return out
}

// Visualize writes porcupine's HTML view of the checked history (the
// longest linearizable prefix of each volume, and where it breaks) to
// path.
func (v Verdict) Visualize(path string) error {
	if v.model.Init == nil {
		return fmt.Errorf("lincheck: no check to visualize")
	}
	return porcupine.VisualizePath(v.model, v.info, path)
}

// String is the verdict for a report.
func (v Verdict) String() string {
	failed := ""
	if v.Failed != "" {
		failed = "; the stale read that cannot be placed: " + v.Failed
	}
	return fmt.Sprintf("linearizability: %s; %d operations checked (%d reads, %d of them stale and checked one at a time; %d outcome unknown; ok=%d busy=%d invalid=%d in-progress=%d not-found=%d) in %s%s",
		v.Result, v.Ops, v.Reads, v.Stale, v.Unknowns, v.ByResult[OK], v.ByResult[Busy], v.ByResult[Invalid],
		v.ByResult[InProgress], v.ByResult[NotFound], v.Took.Round(time.Millisecond), failed)
}
