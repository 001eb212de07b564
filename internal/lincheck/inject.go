package lincheck

import (
	"math"

	"github.com/anishathalye/porcupine"

	"github.com/roamhq/roam/structs"
)

// InjectedAlloc is the allocation InjectStaleWrite claims for.
const InjectedAlloc = "injected-stale-writer"

// InjectStaleWrite returns history with one write added that no correct
// volume could have accepted: while an allocation that is not doomed held
// a write claim of a single-writer volume (after its claim returned ok,
// before its next operation on that volume was called), a second
// allocation on another node is told its write claim succeeded. It is
// how a checker run shows that it would catch a second writer let in by
// a stale leader. The history returned ends with the injected write: only
// the operations called before it returned are kept. ok is false when
// history holds no such window.
func InjectStaleWrite(spec Spec, history []porcupine.Operation) (_ []porcupine.Operation, ok bool) {
	for _, op := range history {
		in, out := op.Input.(Input), op.Output.(Output)
		if in.Kind != KindClaim || out.Result != OK || in.Mode != structs.CSIVolumeClaimWrite ||
			writerLimit(in.Access) != 1 || spec.Doomed[in.Alloc] || op.Return == math.MaxInt64 {
			continue
		}
		// The window ends when the holder next acts on the volume; an
		// earlier call of the holder's whose outcome is unknown could land
		// inside it and free the volume, so such a holder is passed over.
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
			if other.Output.(Output).Result == Unknown && other.Call < op.Return {
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
		// Only what was called before the injected write returned is kept:
		// the prefix is as illegal as the whole, and proving a long history
		// illegal with many outcomes unknown took porcupine past 3 minutes
		// (chaos seed 2).
		res := []porcupine.Operation{stale}
		for _, o := range history {
			if o.Call <= stale.Return {
				res = append(res, o)
			}
		}
		return res, true
	}
	return history, false
}
