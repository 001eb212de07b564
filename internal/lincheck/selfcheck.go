package lincheck

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/roamhq/roam/structs"
)

// InjectedAlloc is the allocation a stale write is injected for.
const InjectedAlloc = "injected-stale-writer"

// SelfCheck is a check of the checker on a part of a recorded history:
// the part must pass the model (Control) and, altered so that no correct
// volume could have produced it, must fail (Result).
type SelfCheck struct {
	Name string
	// Ops and Unknowns count the operations of the part checked, and
	// those of them whose outcome is unknown.
	Ops, Unknowns   int
	Control, Result porcupine.CheckResult
	Took            time.Duration
}

// Passed says whether the checker showed its teeth.
func (s SelfCheck) Passed() bool { return s.Control == porcupine.Ok && s.Result == porcupine.Illegal }

func (s SelfCheck) String() string {
	return fmt.Sprintf("self-check: %s: %s (must be Illegal; unaltered: %s, must be Ok) on %d operations (%d outcome unknown) in %s",
		s.Name, s.Result, s.Control, s.Ops, s.Unknowns, s.Took.Round(time.Millisecond))
}

// SelfChecks shows that the check has teeth on this very history, with
// two checks, each on the cut of one volume's history where it is
// cheapest to prove a violation (see Cut):
//   - a model that forgets that claims conflict must find a cut that ends
//     with a claim refused as busy illegal;
//   - a cut that ends with a second writer let in beside a holder of a
//     single-writer volume (InjectStaleWrite) must be illegal.
//
// Proving a history illegal is an exhaustive search, exponential in the
// operations whose outcome is unknown; on a whole chaos history it ran
// past 3 minutes. A cut keeps the search short, and the unaltered cut
// passing shows that the alteration is what the check caught.
func SelfChecks(spec Spec, history []porcupine.Operation, timeout time.Duration) ([]SelfCheck, error) {
	var out []SelfCheck
	var refused []porcupine.Operation
	for _, op := range history {
		if op.Input.(Input).Kind == KindClaim && op.Output.(Output).Result == Busy {
			refused = append(refused, op)
		}
	}
	busy, ok := cheapest(history, refused)
	if !ok {
		return nil, errors.New("lincheck: no claim refused as busy in the history")
	}
	cut := Cut(history, busy.Input.(Input).Volume, busy.Return)
	out = append(out, selfCheck("a model that forgets claim conflicts", cut, func() porcupine.CheckResult {
		return checkQuick(model{spec: spec}, cut, timeout)
	}, func() porcupine.CheckResult {
		return checkQuick(model{spec: spec, broken: true}, cut, timeout)
	}))

	injected, ok := InjectStaleWrite(spec, history)
	if !ok {
		return out, errors.New("lincheck: no window in the history to inject a stale write into")
	}
	control := injected[1:]
	out = append(out, selfCheck("the history with a stale write injected", injected, func() porcupine.CheckResult {
		return checkQuick(model{spec: spec}, control, timeout)
	}, func() porcupine.CheckResult {
		return checkQuick(model{spec: spec}, injected, timeout)
	}))
	return out, nil
}

func selfCheck(name string, part []porcupine.Operation, control, altered func() porcupine.CheckResult) SelfCheck {
	s := SelfCheck{Name: name, Ops: len(part), Unknowns: countUnknown(part)}
	start := time.Now()
	s.Control = control()
	s.Result = altered()
	s.Took = time.Since(start)
	return s
}

// Cut is the history of volume as it stood at time at: the operations on
// it called by then, those that had not returned by then with their
// outcome unknown (they were in flight), and the reads in flight left out
// (they changed nothing). A history that is linearizable has every cut
// linearizable: the operations its linearization puts before the first
// one called after at are a linearization of the cut, with the rest of
// those in flight taking no effect.
func Cut(history []porcupine.Operation, volume string, at int64) []porcupine.Operation {
	var out []porcupine.Operation
	for _, op := range history {
		in := op.Input.(Input)
		if in.Volume != volume || op.Call > at {
			continue
		}
		if op.Return > at {
			if in.Kind == KindRead {
				continue
			}
			op.Output = Output{Result: Unknown, Detail: "in flight at the cut"}
			op.Return = math.MaxInt64
		}
		out = append(out, op)
	}
	return out
}

// cheapest returns the one of candidates whose cut of history at its
// return has the fewest operations of unknown outcome, then the fewest
// operations.
func cheapest(history, candidates []porcupine.Operation) (best porcupine.Operation, ok bool) {
	bestUnknown, bestLen := math.MaxInt, math.MaxInt
	for _, op := range candidates {
		if op.Return == math.MaxInt64 {
			continue
		}
		cut := Cut(history, op.Input.(Input).Volume, op.Return)
		if u := countUnknown(cut); u < bestUnknown || (u == bestUnknown && len(cut) < bestLen) {
			best, ok, bestUnknown, bestLen = op, true, u, len(cut)
		}
	}
	return best, ok
}

func countUnknown(history []porcupine.Operation) int {
	n := 0
	for _, op := range history {
		if op.Output.(Output).Result == Unknown {
			n++
		}
	}
	return n
}

// InjectStaleWrite returns a cut of history (see Cut) that ends with one
// write added, first, that no correct volume could have accepted: while
// an allocation that is not doomed held a write claim of a single-writer
// volume (after its claim returned ok, before its next operation on that
// volume was called), a second allocation on another node is told its
// write claim succeeded. It is how a checker run shows that it would
// catch a second writer let in by a stale leader. Of the windows in
// history, the one whose cut is cheapest to check is taken. ok is false
// when history holds no such window.
func InjectStaleWrite(spec Spec, history []porcupine.Operation) (_ []porcupine.Operation, ok bool) {
	windows := make(map[int64]porcupine.Operation) // by the injected write's return
	holder, ok := cheapest(history, injectionsOf(spec, history, windows))
	if !ok {
		return nil, false
	}
	stale := windows[holder.Return]
	return append([]porcupine.Operation{stale}, Cut(history, stale.Input.(Input).Volume, stale.Return)...), true
}

// sameClaim says whether a and b are claims of one allocation in the same
// modes.
func sameClaim(a, b Input) bool {
	return a.Kind == KindClaim && b.Kind == KindClaim && a.Alloc == b.Alloc && a.Node == b.Node &&
		a.Mode == b.Mode && a.Access == b.Access && a.Attach == b.Attach
}

// injectionsOf returns, for each window of history where a stale write
// can be injected, the holder's claim with its return moved to the
// injected write's, and fills windows with the writes.
func injectionsOf(spec Spec, history []porcupine.Operation, windows map[int64]porcupine.Operation) []porcupine.Operation {
	var holders []porcupine.Operation
	for _, op := range history {
		in, out := op.Input.(Input), op.Output.(Output)
		if in.Kind != KindClaim || out.Result != OK || in.Mode != structs.CSIVolumeClaimWrite ||
			writerLimit(in.Access) != 1 || spec.Doomed[in.Alloc] || op.Return == math.MaxInt64 {
			continue
		}
		// The window ends when the holder next acts on the volume. An
		// earlier call of the holder's whose outcome is unknown could land
		// inside it: a release would free the volume, and a claim in
		// another mode or access could leave the holder's entry in that
		// mode (a reservation it made first is what the claim then
		// takes). Such a holder is passed over. An earlier claim exactly
		// like the holder's changes nothing wherever it lands; in a run
		// with many leader changes every holder has one, and passing
		// them over left no window at all (chaos seed 4, 2026-12-07).
		end := int64(math.MaxInt64)
		open := false
		for _, other := range history {
			oi := other.Input.(Input)
			if oi.Volume != in.Volume || oi.Alloc != in.Alloc {
				continue
			}
			if other.Call > op.Return && other.Call < end {
				end = other.Call
			}
			if other.Output.(Output).Result == Unknown && other.Call < op.Return && !sameClaim(oi, in) {
				open = true
			}
		}
		if open || end == math.MaxInt64 || end-op.Return < 3 {
			continue
		}
		gap := (end - op.Return) / 3
		stale := porcupine.Operation{
			ClientId: op.ClientId,
			Input: Input{Volume: in.Volume, Kind: KindClaim, Alloc: InjectedAlloc, Node: in.Node + "-other",
				Mode: structs.CSIVolumeClaimWrite, Access: in.Access, Attach: in.Attach},
			Call:   op.Return + gap,
			Output: Output{Result: OK, Detail: "injected"},
			Return: op.Return + 2*gap,
		}
		if _, dup := windows[stale.Return]; dup {
			continue
		}
		windows[stale.Return] = stale
		op.Return = stale.Return
		holders = append(holders, op)
	}
	return holders
}
