// Package lincheck checks recorded histories of Roam's volume and claim
// API for linearizability, with porcupine: a sequential model of one
// volume (its registration, its capabilities, its claims by allocation)
// says which answers each operation may get, and porcupine looks for an
// order of the operations, consistent with their real-time order, that
// the model accepts. A history without one is a history no correct
// single copy of the volume could have produced: a lost claim, two
// writers admitted, a release that did not happen, a stale read.
//
// The model is written from the rules Roam documents (docs/volumes.md,
// docs/faults.md), not from its code, so that a bug in the code is not
// copied into the judge.
//
// Three things make the model nondeterministic:
//   - an operation whose outcome is unknown (a timeout, a lost
//     connection, a leader that changed with the write in flight) may
//     have taken effect or not, at any point from its call on;
//   - the servers change claims by themselves: a claim left part way
//     (publishing, or part way released) may be rolled back or finished
//     by the volume watcher at any time, and every claim of an allocation
//     that is over (Spec.Doomed) may be released at any time;
//   - a stale read (Input.Stale) may see any earlier state; the recorder
//     gives it the history's start as its call time, so that porcupine
//     may place it anywhere before its return.
package lincheck

import (
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"

	"github.com/roamhq/roam/structs"
)

// Kind is the kind of an operation.
type Kind uint8

const (
	// KindClaim is CSIVolume.Claim with state taken, as the allocation's
	// node.
	KindClaim Kind = iota + 1
	// KindRelease is CSIVolume.Claim with state unpublishing: the node let
	// go of the volume.
	KindRelease
	// KindRead is GET /v1/volume/csi/:id: the registration and its claims.
	KindRead
	// KindRegister is a registration of the volume with its Spec's
	// capabilities (PUT /v1/volume/csi/:id).
	KindRegister
	// KindDeregister is DELETE /v1/volume/csi/:id without force.
	KindDeregister
)

func (k Kind) String() string {
	switch k {
	case KindClaim:
		return "claim"
	case KindRelease:
		return "release"
	case KindRead:
		return "read"
	case KindRegister:
		return "register"
	case KindDeregister:
		return "deregister"
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Input is one operation as called.
type Input struct {
	Volume string
	Kind   Kind
	// Alloc and Node are the claiming allocation and its node (claim,
	// release).
	Alloc, Node string
	// Mode is structs.CSIVolumeClaimRead or Write; Access and Attach the
	// claim's access and attachment modes (claim).
	Mode, Access, Attach string
	// Stale marks a read any server may answer from its own copy.
	Stale bool
}

// Result is how an operation ended.
type Result uint8

const (
	// OK: done.
	OK Result = iota + 1
	// Busy: the claim does not fit beside the volume's other claims
	// (structs.ErrCSIMaxClaims). Nothing changed.
	Busy
	// Invalid: refused for what was asked (structs.ErrInvalidRequest): a
	// capability the volume lacks, a write in a read-only mode, a claim
	// being released, an allocation that is over, a deregistration of a
	// claimed volume. Nothing changed.
	Invalid
	// InProgress: another change to the same claim is in flight
	// (structs.ErrClaimInProgress). Nothing changed.
	InProgress
	// NotFound: the volume is not registered. Nothing changed.
	NotFound
	// Unknown: no answer, or one that does not say whether the change was
	// made.
	Unknown
)

func (r Result) String() string {
	switch r {
	case OK:
		return "ok"
	case Busy:
		return "busy"
	case Invalid:
		return "invalid"
	case InProgress:
		return "in-progress"
	case NotFound:
		return "not-found"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("result(%d)", r)
}

// Phase is where a claim is, as a read shows it.
type Phase uint8

const (
	// PhasePublishing: reserved, the controller publish not yet known done.
	PhasePublishing Phase = iota + 1
	// PhaseTaken: the allocation holds the volume.
	PhaseTaken
	// PhaseReleasing: on its way to freed (unpublishing, node-detached,
	// controller-detached).
	PhaseReleasing
)

// PhaseOf maps a stored claim state to its Phase.
func PhaseOf(s structs.CSIClaimState) (Phase, error) {
	switch s {
	case structs.CSIVolumeClaimStatePublishing:
		return PhasePublishing, nil
	case structs.CSIVolumeClaimStateTaken:
		return PhaseTaken, nil
	case structs.CSIVolumeClaimStateUnpublishing, structs.CSIVolumeClaimStateNodeDetached,
		structs.CSIVolumeClaimStateControllerDetached:
		return PhaseReleasing, nil
	}
	return 0, fmt.Errorf("lincheck: claim state %q has no phase", s)
}

func (p Phase) String() string {
	switch p {
	case PhasePublishing:
		return "publishing"
	case PhaseTaken:
		return "taken"
	case PhaseReleasing:
		return "releasing"
	}
	return fmt.Sprintf("phase(%d)", p)
}

// Output is how an operation ended, and what a read saw.
type Output struct {
	Result Result
	// Registered and Claims are a read's answer: whether the volume is
	// registered, and its claims' phases by allocation ID.
	Registered bool
	Claims     map[string]Phase
	// Detail is the error, for the report; the model ignores it.
	Detail string
}

// Capability is an access and attachment mode pair a volume is
// registered with.
type Capability struct{ Access, Attach string }

// Spec is what the model knows beyond the history.
type Spec struct {
	// Capabilities are each volume's, by volume ID; every volume starts
	// registered with them and without claims.
	Capabilities map[string][]Capability
	// Doomed are the allocations that were over (terminal, or lost with
	// their node) by the end of the run: the servers may release their
	// claims at any time, and refuse their new claims.
	Doomed map[string]bool
}

// entry is one claim in the model.
type entry struct {
	alloc, node, mode, access string
	st                        claimStatus
}

// claimStatus is what the model knows of a stored claim.
type claimStatus uint8

const (
	// held: stored taken; stays until released (or its allocation is
	// doomed).
	held claimStatus = iota + 1
	// reserved: stored publishing or taken, not known which: a claim whose
	// outcome is unknown. A publishing one the servers may roll back.
	reserved
	// releasing: stored part way to freed, or freed: the servers finish it.
	releasing
)

func (c claimStatus) String() string {
	switch c {
	case held:
		return "held"
	case reserved:
		return "reserved"
	case releasing:
		return "releasing"
	}
	return "?"
}

// volState is the model's state of one volume. It is never changed in
// place: each step makes new ones.
type volState struct {
	registered bool
	entries    []entry // sorted by alloc
}

func (s volState) find(alloc string) int {
	i, ok := slices.BinarySearchFunc(s.entries, alloc, func(e entry, a string) int { return strings.Compare(e.alloc, a) })
	if !ok {
		return -1
	}
	return i
}

// with returns s with e set (added or replaced).
func (s volState) with(e entry) volState {
	out := volState{registered: s.registered, entries: slices.Clone(s.entries)}
	if i := out.find(e.alloc); i >= 0 {
		out.entries[i] = e
		return out
	}
	out.entries = append(out.entries, e)
	sort.Slice(out.entries, func(i, j int) bool { return out.entries[i].alloc < out.entries[j].alloc })
	return out
}

// without returns s with alloc's entry removed.
func (s volState) without(alloc string) volState {
	out := volState{registered: s.registered, entries: slices.Clone(s.entries)}
	if i := out.find(alloc); i >= 0 {
		out.entries = slices.Delete(out.entries, i, i+1)
	}
	return out
}

func (s volState) String() string {
	if !s.registered {
		return "not registered"
	}
	if len(s.entries) == 0 {
		return "registered, no claims"
	}
	parts := make([]string, 0, len(s.entries))
	for _, e := range s.entries {
		parts = append(parts, fmt.Sprintf("%s: %s %s/%s on %s", short(e.alloc), e.st, e.mode, e.access, short(e.node)))
	}
	return "registered; " + strings.Join(parts, "; ")
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// singleNode reports whether an access mode lets the volume attach to one
// node only.
func singleNode(access string) bool {
	return access == structs.CSIAccessModeSingleNodeReader || access == structs.CSIAccessModeSingleNodeWriter
}

// writerLimit is how many write claims an access mode admits (-1: no
// limit).
func writerLimit(access string) int {
	switch access {
	case structs.CSIAccessModeSingleNodeWriter, structs.CSIAccessModeMultiNodeSingleWriter:
		return 1
	case structs.CSIAccessModeMultiNodeMultiWriter:
		return -1
	}
	return 0
}

// model is the sequential model of every volume of a Spec.
type model struct {
	spec Spec
	// broken, for the checker's own tests: the model forgets that claims
	// can conflict, as a judge with a bug would.
	broken bool
}

// admission is how a new claim of in fares beside s's claims: OK, Busy
// or Invalid.
func (m model) admission(s volState, in Input) Result {
	caps := m.spec.Capabilities[in.Volume]
	if !slices.Contains(caps, Capability{in.Access, in.Attach}) {
		return Invalid
	}
	if in.Mode != structs.CSIVolumeClaimRead && in.Mode != structs.CSIVolumeClaimWrite {
		return Invalid
	}
	if in.Mode == structs.CSIVolumeClaimWrite && writerLimit(in.Access) == 0 {
		return Invalid
	}
	if m.broken {
		return OK
	}
	writers := 0
	for _, o := range s.entries {
		if o.alloc == in.Alloc {
			continue
		}
		if (singleNode(in.Access) || singleNode(o.access)) && o.node != in.Node {
			return Busy
		}
		if o.mode == structs.CSIVolumeClaimWrite {
			writers++
		}
	}
	if in.Mode == structs.CSIVolumeClaimWrite {
		if limit := writerLimit(in.Access); limit >= 0 && writers >= limit {
			return Busy
		}
	}
	return OK
}

// drift returns every state the servers may move s to by themselves:
// each claim left part way may be finished or rolled back, and each claim
// of a doomed allocation released.
func (m model) drift(s volState) []volState {
	out := []volState{s}
	for _, e := range s.entries {
		var moves []claimStatus // 0: removed
		switch {
		case m.spec.Doomed[e.alloc] && e.st != releasing:
			moves = []claimStatus{releasing, 0}
		case e.st == reserved:
			moves = []claimStatus{releasing, 0}
		case e.st == releasing:
			moves = []claimStatus{0}
		}
		if len(moves) == 0 {
			continue
		}
		n := len(out)
		for i := 0; i < n; i++ {
			for _, mv := range moves {
				if mv == 0 {
					out = append(out, out[i].without(e.alloc))
					continue
				}
				x := e
				x.st = mv
				out = append(out, out[i].with(x))
			}
		}
	}
	return out
}

// step returns the states s may be in after the operation, none when the
// model cannot give that answer from s.
func (m model) step(s volState, in Input, out Output) []volState {
	var next []volState
	for _, d := range m.drift(s) {
		next = append(next, m.apply(d, in, out)...)
	}
	return next
}

// apply is one operation on a state, without drift.
func (m model) apply(s volState, in Input, out Output) []volState {
	if out.Result == InProgress {
		// Another change to the claim is in flight: this call changed
		// nothing, whatever the state.
		return []volState{s}
	}
	switch in.Kind {
	case KindRead:
		return m.read(s, out)
	case KindRegister:
		reg := s
		reg.registered = true
		switch out.Result {
		case OK:
			return []volState{reg}
		case Invalid:
			return []volState{s}
		case Unknown:
			return []volState{s, reg}
		}
		return nil
	case KindDeregister:
		gone := volState{}
		switch out.Result {
		case OK:
			if s.registered && len(s.entries) == 0 {
				return []volState{gone}
			}
		case Invalid:
			if s.registered && len(s.entries) > 0 {
				return []volState{s}
			}
		case NotFound:
			if !s.registered {
				return []volState{s}
			}
		case Unknown:
			if s.registered && len(s.entries) == 0 {
				return []volState{s, gone}
			}
			return []volState{s}
		}
		return nil
	}
	if !s.registered {
		if out.Result == NotFound || out.Result == Unknown {
			return []volState{s}
		}
		return nil
	}
	if out.Result == NotFound {
		return nil
	}
	i := s.find(in.Alloc)
	switch in.Kind {
	case KindClaim:
		return m.claim(s, i, in, out.Result)
	case KindRelease:
		return m.release(s, i, in, out.Result)
	}
	return nil
}

func (m model) claim(s volState, i int, in Input, r Result) []volState {
	if i >= 0 {
		e := s.entries[i]
		switch {
		case e.st == releasing:
			// A claim being released is not taken back.
			if r == Invalid || r == Unknown {
				return []volState{s}
			}
			return nil
		case r == OK:
			e.st = held
			return []volState{s.with(e)}
		case r == Unknown:
			return []volState{s}
		case r == Invalid && m.spec.Doomed[in.Alloc]:
			return []volState{s}
		}
		return nil
	}
	adm := m.admission(s, in)
	e := entry{alloc: in.Alloc, node: in.Node, mode: in.Mode, access: in.Access}
	switch r {
	case OK:
		if adm == OK {
			e.st = held
			return []volState{s.with(e)}
		}
	case Busy, Invalid:
		if adm == r {
			return []volState{s}
		}
		// An allocation that is over may not claim, but it ran once: it
		// is doomed by the end of the run, not from its start. Found over
		// part way through its claim, it leaves the reservation behind for
		// the servers to release.
		if r == Invalid && m.spec.Doomed[in.Alloc] && adm == OK {
			e.st = reserved
			return []volState{s, s.with(e)}
		}
		if r == Invalid && m.spec.Doomed[in.Alloc] {
			return []volState{s}
		}
	case Unknown:
		if adm == OK {
			e.st = reserved
			return []volState{s, s.with(e)}
		}
		return []volState{s}
	}
	return nil
}

func (m model) release(s volState, i int, in Input, r Result) []volState {
	gone := s.without(in.Alloc)
	switch r {
	case OK:
		return []volState{gone}
	case Unknown:
		if i < 0 {
			return []volState{s}
		}
		e := s.entries[i]
		e.st = releasing
		return []volState{s, s.with(e), gone}
	}
	return nil
}

// read keeps s if a read could see it as out says, refined by what it saw.
func (m model) read(s volState, out Output) []volState {
	if out.Result != OK {
		return nil // failed reads are left out of histories
	}
	if out.Registered != s.registered {
		return nil
	}
	if len(out.Claims) != len(s.entries) {
		return nil
	}
	refined := s
	for _, e := range s.entries {
		p, ok := out.Claims[e.alloc]
		if !ok {
			return nil
		}
		switch e.st {
		case held:
			// A claim's walk and a release's are several writes, and a
			// read may fall between them: a claim is linearized at its
			// reservation (where admission is decided) and shows
			// publishing until its walk ends; a release is linearized
			// where the claim is freed and shows releasing before.
		case reserved:
			if p == PhaseTaken {
				// Stored taken: it stays until released.
				e.st = held
				refined = refined.with(e)
			} else if p != PhasePublishing {
				return nil
			}
		case releasing:
			if p != PhaseReleasing {
				return nil
			}
		}
	}
	return []volState{refined}
}

// Model is the porcupine model of the volumes of spec, partitioned by
// volume.
func Model(spec Spec) porcupine.Model {
	return model{spec: spec}.porcupine()
}

func (m model) porcupine() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partitionByVolume,
		// Every volume starts registered without claims; a partition's
		// first step fixes which volume it is.
		Init: func() []interface{} { return []interface{}{volState{registered: true}} },
		Step: func(state, input, output interface{}) []interface{} {
			next := m.step(state.(volState), input.(Input), output.(Output))
			out := make([]interface{}, len(next))
			for i, s := range next {
				out[i] = s
			}
			return out
		},
		Equal: func(a, b interface{}) bool {
			x, y := a.(volState), b.(volState)
			return x.registered == y.registered && slices.Equal(x.entries, y.entries)
		},
		Hash: func(state interface{}) uint64 {
			h := fnv.New64a()
			fmt.Fprint(h, state.(volState).String())
			return h.Sum64()
		},
		DescribeOperation: describeOperation,
		DescribeState:     func(state interface{}) string { return state.(volState).String() },
	}
	return nm.ToModel()
}

func partitionByVolume(history []porcupine.Operation) [][]porcupine.Operation {
	byVol := make(map[string][]porcupine.Operation)
	var order []string
	for _, op := range history {
		v := op.Input.(Input).Volume
		if _, ok := byVol[v]; !ok {
			order = append(order, v)
		}
		byVol[v] = append(byVol[v], op)
	}
	sort.Strings(order)
	out := make([][]porcupine.Operation, 0, len(order))
	for _, v := range order {
		out = append(out, byVol[v])
	}
	return out
}

func describeOperation(input, output interface{}) string {
	in, out := input.(Input), output.(Output)
	var b strings.Builder
	b.WriteString(in.Kind.String())
	switch in.Kind {
	case KindClaim:
		fmt.Fprintf(&b, "(%s, %s %s/%s on %s)", short(in.Alloc), in.Mode, in.Access, in.Attach, short(in.Node))
	case KindRelease:
		fmt.Fprintf(&b, "(%s)", short(in.Alloc))
	case KindRead:
		if in.Stale {
			b.WriteString("(stale)")
		}
		if out.Result == OK {
			if !out.Registered {
				b.WriteString(" -> not registered")
				return b.String()
			}
			ids := make([]string, 0, len(out.Claims))
			for id, p := range out.Claims {
				ids = append(ids, short(id)+":"+p.String())
			}
			sort.Strings(ids)
			fmt.Fprintf(&b, " -> [%s]", strings.Join(ids, " "))
			return b.String()
		}
	}
	fmt.Fprintf(&b, " -> %s", out.Result)
	if out.Detail != "" {
		fmt.Fprintf(&b, " (%s)", out.Detail)
	}
	return b.String()
}
