package lincheck

import (
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

const (
	snw  = structs.CSIAccessModeSingleNodeWriter
	mnmw = structs.CSIAccessModeMultiNodeMultiWriter
	mnro = structs.CSIAccessModeMultiNodeReader
	fs   = structs.CSIAttachmentModeFilesystem
	wr   = structs.CSIVolumeClaimWrite
	rd   = structs.CSIVolumeClaimRead
)

var testSpec = Spec{
	Capabilities: map[string][]Capability{
		"single": {{snw, fs}},
		"multi":  {{mnmw, fs}, {mnro, fs}},
	},
	Doomed: map[string]bool{"doomed": true},
}

func claimIn(vol, alloc, node, mode, access string) Input {
	return Input{Volume: vol, Kind: KindClaim, Alloc: alloc, Node: node, Mode: mode, Access: access, Attach: fs}
}

func releaseIn(vol, alloc string) Input { return Input{Volume: vol, Kind: KindRelease, Alloc: alloc} }

func readOut(claims map[string]Phase) Output {
	return Output{Result: OK, Registered: true, Claims: claims}
}

func st(entries ...entry) volState { return volState{registered: true}.withAll(entries...) }

func (s volState) withAll(entries ...entry) volState {
	for _, e := range entries {
		s = s.with(e)
	}
	return s
}

func held1(alloc, node, mode, access string) entry {
	return entry{alloc: alloc, node: node, mode: mode, access: access, st: held}
}

// TestModel_Step is the model as a state × operation table: which
// answers each state allows, and the states they lead to.
func TestModel_Step(t *testing.T) {
	m := model{spec: testSpec}
	a := held1("a", "n1", wr, snw)
	aRes := a
	aRes.st = reserved
	aRel := a
	aRel.st = releasing
	doomed := held1("doomed", "n2", wr, snw)
	cases := []struct {
		name string
		s    volState
		in   Input
		out  Output
		want []volState // nil: the answer is impossible
	}{
		{"claim of a free volume succeeds", st(), claimIn("single", "a", "n1", wr, snw), Output{Result: OK}, []volState{st(a)}},
		{"claim of a free volume cannot be busy", st(), claimIn("single", "a", "n1", wr, snw), Output{Result: Busy}, nil},
		{"second writer on another node is busy", st(a), claimIn("single", "b", "n2", wr, snw), Output{Result: Busy}, []volState{st(a)}},
		{"second writer on another node cannot succeed", st(a), claimIn("single", "b", "n2", wr, snw), Output{Result: OK}, nil},
		{"second writer on the same node is busy (writer limit)", st(a), claimIn("single", "b", "n1", wr, snw), Output{Result: Busy}, []volState{st(a)}},
		{"reader on the same node fits", st(a), claimIn("single", "b", "n1", rd, snw), Output{Result: OK},
			[]volState{st(a, held1("b", "n1", rd, snw))}},
		{"a capability the volume lacks is invalid", st(), claimIn("single", "a", "n1", wr, mnmw), Output{Result: Invalid}, []volState{st()}},
		{"a write in a read-only mode is invalid", st(), claimIn("multi", "a", "n1", wr, mnro), Output{Result: Invalid}, []volState{st()}},
		{"many writers in multi-writer mode", st(held1("b", "n2", wr, mnmw)), claimIn("multi", "a", "n1", wr, mnmw), Output{Result: OK},
			[]volState{st(held1("b", "n2", wr, mnmw), held1("a", "n1", wr, mnmw))}},
		{"claim again of a held claim is ok", st(a), claimIn("single", "a", "n1", wr, snw), Output{Result: OK}, []volState{st(a)}},
		{"claim of a claim being released is invalid", st(aRel), claimIn("single", "a", "n1", wr, snw), Output{Result: Invalid},
			[]volState{st(aRel)}},
		{"claim of a claim being released succeeds only once it is freed", st(aRel), claimIn("single", "a", "n1", wr, snw), Output{Result: OK},
			[]volState{st(a)}},
		{"unknown claim may or may not have reserved", st(), claimIn("single", "a", "n1", wr, snw), Output{Result: Unknown},
			[]volState{st(), st(aRes)}},
		{"unknown claim that cannot fit changes nothing", st(a), claimIn("single", "b", "n2", wr, snw), Output{Result: Unknown}, []volState{st(a)}},
		{"in progress changes nothing", st(a), claimIn("single", "b", "n2", wr, snw), Output{Result: InProgress}, []volState{st(a)}},
		{"release frees", st(a), releaseIn("single", "a"), Output{Result: OK}, []volState{st()}},
		{"release of a free claim is ok", st(), releaseIn("single", "a"), Output{Result: OK}, []volState{st()}},
		{"unknown release: held, releasing or freed", st(a), releaseIn("single", "a"), Output{Result: Unknown},
			[]volState{st(a), st(aRel), st()}},
		{"a doomed claim may be released by the servers", st(doomed), claimIn("single", "b", "n1", wr, snw), Output{Result: OK},
			[]volState{st(held1("b", "n1", wr, snw))}},
		{"a doomed allocation's new claim is invalid, maybe reserved part way", st(), claimIn("single", "doomed", "n2", wr, snw), Output{Result: Invalid},
			[]volState{st(), st(entry{alloc: "doomed", node: "n2", mode: wr, access: snw, st: reserved})}},
		{"a claim that is not doomed is never invalid where it fits", st(), claimIn("single", "a", "n1", wr, snw), Output{Result: Invalid}, nil},
		{"read sees a held claim taken", st(a), Input{Volume: "single", Kind: KindRead}, readOut(map[string]Phase{"a": PhaseTaken}), []volState{st(a)}},
		{"read cannot miss a held claim", st(a), Input{Volume: "single", Kind: KindRead}, readOut(nil), nil},
		{"read may see a held claim mid-walk", st(a), Input{Volume: "single", Kind: KindRead}, readOut(map[string]Phase{"a": PhasePublishing}), []volState{st(a)}},
		{"read may see a held claim mid-release", st(a), Input{Volume: "single", Kind: KindRead}, readOut(map[string]Phase{"a": PhaseReleasing}), []volState{st(a)}},
		{"read cannot see a claim that is not there", st(), Input{Volume: "single", Kind: KindRead}, readOut(map[string]Phase{"a": PhaseTaken}), nil},
		{"read of a reserved claim taken makes it held", st(aRes), Input{Volume: "single", Kind: KindRead}, readOut(map[string]Phase{"a": PhaseTaken}),
			[]volState{st(a)}},
		{"a reserved claim may be rolled back", st(aRes), Input{Volume: "single", Kind: KindRead}, readOut(nil), []volState{st()}},
		{"deregister of a claimed volume is invalid", st(a), Input{Volume: "single", Kind: KindDeregister}, Output{Result: Invalid}, []volState{st(a)}},
		{"deregister of a claimed volume cannot succeed", st(a), Input{Volume: "single", Kind: KindDeregister}, Output{Result: OK}, nil},
		{"deregister of a free volume", st(), Input{Volume: "single", Kind: KindDeregister}, Output{Result: OK}, []volState{{}}},
		{"claim of a deregistered volume is not found", volState{}, claimIn("single", "a", "n1", wr, snw), Output{Result: NotFound}, []volState{{}}},
		{"claim of a deregistered volume cannot succeed", volState{}, claimIn("single", "a", "n1", wr, snw), Output{Result: OK}, nil},
		{"register again", volState{}, Input{Volume: "single", Kind: KindRegister}, Output{Result: OK}, []volState{st()}},
		{"read of a deregistered volume", volState{}, Input{Volume: "single", Kind: KindRead}, Output{Result: OK}, []volState{{}}},
	}
	eq := func(x, y volState) bool { return m.porcupine().Equal([]interface{}{x}, []interface{}{y}) }
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := m.step(tc.s, tc.in, tc.out)
			if tc.want == nil {
				must.SliceEmpty(t, got, must.Sprintf("from %s, %s must be impossible", tc.s, describeOperation(tc.in, tc.out)))
				return
			}
			for _, w := range tc.want {
				found := false
				for _, g := range got {
					found = found || eq(g, w)
				}
				must.True(t, found, must.Sprintf("from %s, %s: want %s among %v", tc.s, describeOperation(tc.in, tc.out), w, got))
			}
			for _, g := range got {
				found := false
				for _, w := range tc.want {
					found = found || eq(g, w)
				}
				must.True(t, found, must.Sprintf("from %s, %s: %s not expected (want %v)", tc.s, describeOperation(tc.in, tc.out), g, tc.want))
			}
		})
	}
}

func op(client int, in Input, call, ret int64, out Output) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
}

// goodHistory is two holders taking turns with a single-writer volume,
// one refused while the other holds it, a lost answer, and reads.
func goodHistory() []porcupine.Operation {
	read := Input{Volume: "single", Kind: KindRead}
	return []porcupine.Operation{
		op(0, claimIn("single", "a", "n1", wr, snw), 0, 10, Output{Result: OK}),
		op(1, claimIn("single", "b", "n2", wr, snw), 5, 15, Output{Result: Busy}),
		op(2, read, 12, 14, readOut(map[string]Phase{"a": PhaseTaken})),
		op(0, releaseIn("single", "a"), 20, 30, Output{Result: OK}),
		op(1, claimIn("single", "b", "n2", wr, snw), 31, math.MaxInt64, Output{Result: Unknown}),
		op(2, read, 40, 45, readOut(map[string]Phase{"b": PhasePublishing})),
		op(2, read, 50, 55, readOut(map[string]Phase{"b": PhaseTaken})),
		op(0, claimIn("single", "a", "n1", wr, snw), 60, 70, Output{Result: Busy}),
		op(1, releaseIn("single", "b"), 80, 90, Output{Result: OK}),
		op(2, read, 95, 99, readOut(map[string]Phase{})),
	}
}

func TestCheck_GoodHistoryPasses(t *testing.T) {
	v := Check(testSpec, goodHistory(), 10*time.Second)
	must.Eq(t, porcupine.Ok, v.Result, must.Sprint(v))
	must.Eq(t, 10, v.Ops)
	must.Eq(t, 1, v.Unknowns)
	must.Eq(t, 4, v.Reads)
}

// TestCheck_BrokenModelFails: a judge that forgets that claims conflict
// finds the refusal of a second writer impossible.
func TestCheck_BrokenModelFails(t *testing.T) {
	h := []porcupine.Operation{
		op(0, claimIn("single", "a", "n1", wr, snw), 0, 10, Output{Result: OK}),
		op(1, claimIn("single", "b", "n1", wr, snw), 20, 30, Output{Result: Busy}),
	}
	must.Eq(t, porcupine.Ok, Check(testSpec, h, 10*time.Second).Result)
	must.Eq(t, porcupine.Illegal, CheckBroken(testSpec, h, 10*time.Second).Result)
}

func TestCheck_StaleWriteInjectedFails(t *testing.T) {
	h, ok := InjectStaleWrite(testSpec, goodHistory())
	must.True(t, ok)
	must.Eq(t, InjectedAlloc, h[0].Input.(Input).Alloc)
	must.Less(t, len(goodHistory())+1, len(h)) // the cut at the injected write
	must.Eq(t, porcupine.Ok, Check(testSpec, h[1:], 10*time.Second).Result)
	v := Check(testSpec, h, 10*time.Second)
	must.Eq(t, porcupine.Illegal, v.Result, must.Sprint(v))
	// The view of the failure is written.
	path := filepath.Join(t.TempDir(), "lin.html")
	must.NoError(t, v.Visualize(path))
	must.FileExists(t, path)
}

// An unknown release before the holder's claim could land inside the
// window and free the volume: such a holder offers no window.
func TestInjectStaleWrite_SkipsHoldersWithOpenCalls(t *testing.T) {
	h := []porcupine.Operation{
		op(0, releaseIn("single", "a"), 0, math.MaxInt64, Output{Result: Unknown}),
		op(0, claimIn("single", "a", "n1", wr, snw), 10, 20, Output{Result: OK}),
		op(0, releaseIn("single", "a"), 40, 50, Output{Result: OK}),
	}
	_, ok := InjectStaleWrite(testSpec, h)
	must.False(t, ok)
}

// An unknown earlier claim just like the holder's changes nothing where
// it lands: the holder still offers a window, and the stale write there is
// caught. One in another mode could leave the holder a reader: no window.
func TestInjectStaleWrite_UnknownEarlierClaims(t *testing.T) {
	same := []porcupine.Operation{
		op(0, claimIn("single", "a", "n1", wr, snw), 0, math.MaxInt64, Output{Result: Unknown}),
		op(1, claimIn("single", "a", "n1", wr, snw), 10, 20, Output{Result: OK}),
		op(1, releaseIn("single", "a"), 40, 50, Output{Result: OK}),
	}
	got, ok := InjectStaleWrite(testSpec, same)
	must.True(t, ok, must.Sprint("no window beside an earlier unknown claim in the same modes"))
	must.Eq(t, porcupine.Ok, Check(testSpec, got[1:], 10*time.Second).Result)
	must.Eq(t, porcupine.Illegal, Check(testSpec, got, 10*time.Second).Result)

	other := []porcupine.Operation{
		op(0, claimIn("single", "a", "n1", rd, snw), 0, math.MaxInt64, Output{Result: Unknown}),
		op(1, claimIn("single", "a", "n1", wr, snw), 10, 20, Output{Result: OK}),
		op(1, releaseIn("single", "a"), 40, 50, Output{Result: OK}),
	}
	_, ok = InjectStaleWrite(testSpec, other)
	must.False(t, ok)
}

// TestInjectStaleWrite_PicksTheCheapestWindow: of two windows, the one
// whose cut has fewer outcomes unknown is taken, though it is later: a
// claim in flight across the first window is unknown in its cut.
func TestInjectStaleWrite_PicksTheCheapestWindow(t *testing.T) {
	h := []porcupine.Operation{
		op(0, claimIn("single", "a", "n1", wr, snw), 0, 10, Output{Result: OK}),
		op(1, claimIn("single", "b", "n2", wr, snw), 5, 35, Output{Result: Busy}),
		op(0, releaseIn("single", "a"), 40, 50, Output{Result: OK}),
		op(0, claimIn("single", "a", "n1", wr, snw), 60, 70, Output{Result: OK}),
		op(0, releaseIn("single", "a"), 100, 110, Output{Result: OK}),
	}
	got, ok := InjectStaleWrite(testSpec, h)
	must.True(t, ok)
	must.Greater(t, int64(70), got[0].Call)
	must.Eq(t, 0, countUnknown(got))
	must.Eq(t, porcupine.Illegal, Check(testSpec, got, 10*time.Second).Result)
}

// TestCut: a cut keeps what was called by its time, of one volume; what
// was in flight has an unknown outcome, reads in flight are left out.
func TestCut(t *testing.T) {
	h := append(goodHistory(),
		op(3, claimIn("multi", "c", "n3", wr, mnmw), 0, 10, Output{Result: OK}),
		op(3, Input{Volume: "single", Kind: KindRead}, 52, 65, readOut(map[string]Phase{"b": PhaseTaken})))
	cut := Cut(h, "single", 53)
	must.Len(t, 6, cut) // goodHistory up to 40; the reads in flight are left out
	for _, o := range cut {
		must.Eq(t, "single", o.Input.(Input).Volume)
		must.LessEq(t, int64(53), o.Call)
	}
	mid := Cut(h, "single", 25) // the release is in flight
	must.Len(t, 4, mid)
	must.Eq(t, Unknown, mid[3].Output.(Output).Result)
	must.Eq(t, int64(math.MaxInt64), mid[3].Return)
	must.Eq(t, porcupine.Ok, Check(testSpec, mid, 10*time.Second).Result)
}

// TestSelfChecks: on a good history both self-checks pass, each on a
// cut of one volume; a history without a refusal or a window is an
// error, not a pass.
func TestSelfChecks(t *testing.T) {
	checks, err := SelfChecks(testSpec, goodHistory(), 10*time.Second)
	must.NoError(t, err)
	must.Len(t, 2, checks)
	for _, c := range checks {
		must.True(t, c.Passed(), must.Sprint(c))
	}
	_, err = SelfChecks(testSpec, goodHistory()[:1], 10*time.Second)
	must.ErrorContains(t, err, "busy")
	noWindow := []porcupine.Operation{
		op(0, claimIn("single", "a", "n1", wr, snw), 0, 10, Output{Result: OK}),
		op(1, claimIn("single", "b", "n2", wr, snw), 5, 30, Output{Result: Busy}),
	}
	checks, err = SelfChecks(testSpec, noWindow, 10*time.Second)
	must.ErrorContains(t, err, "no window")
	must.Len(t, 1, checks)
	must.True(t, checks[0].Passed(), must.Sprint(checks[0]))
}

// A stale read may see an earlier state, a read that is not stale may
// not.
func TestCheck_StaleReads(t *testing.T) {
	base := []porcupine.Operation{
		op(0, claimIn("single", "a", "n1", wr, snw), 0, 10, Output{Result: OK}),
		op(0, releaseIn("single", "a"), 20, 30, Output{Result: OK}),
	}
	seen := readOut(map[string]Phase{"a": PhaseTaken})
	fresh := append(base, op(1, Input{Volume: "single", Kind: KindRead}, 40, 45, seen))
	must.Eq(t, porcupine.Illegal, Check(testSpec, fresh, 10*time.Second).Result)
	stale := append(base, op(1, Input{Volume: "single", Kind: KindRead, Stale: true}, 0, 45, seen))
	must.Eq(t, porcupine.Ok, Check(testSpec, stale, 10*time.Second).Result)
}

// A claim acknowledged and then missing from a read with no release in
// between is a lost claim.
func TestCheck_LostClaimFails(t *testing.T) {
	h := []porcupine.Operation{
		op(0, claimIn("single", "a", "n1", wr, snw), 0, 10, Output{Result: OK}),
		op(1, Input{Volume: "single", Kind: KindRead}, 20, 25, readOut(nil)),
	}
	must.Eq(t, porcupine.Illegal, Check(testSpec, h, 10*time.Second).Result)
	// ... unless its allocation is over: the servers release it.
	doomed := Spec{Capabilities: testSpec.Capabilities, Doomed: map[string]bool{"a": true}}
	must.Eq(t, porcupine.Ok, Check(doomed, h, 10*time.Second).Result)
}

func TestRecorder(t *testing.T) {
	r := NewRecorder()
	before := time.Now()
	c := r.Begin(0, claimIn("single", "a", "n1", wr, snw))
	c.End(Output{Result: OK})
	after := time.Now()
	r.Begin(1, claimIn("single", "b", "n2", wr, snw)).End(Output{Result: Unknown})
	r.Begin(2, Input{Volume: "single", Kind: KindRead}).End(Output{Result: Unknown}) // a failed read: left out
	r.Begin(2, Input{Volume: "single", Kind: KindRead, Stale: true}).End(readOut(nil))
	h := r.History()
	must.Len(t, 3, h)
	must.Eq(t, int64(math.MaxInt64), h[1].Return)
	must.Eq(t, int64(0), h[2].Call)
	// Offset places times on the history's clock: the first call lies
	// between the offsets of the times taken around it.
	must.LessEq(t, h[0].Call, r.Offset(before))
	must.LessEq(t, r.Offset(after), h[0].Return)
	v := Check(testSpec, h, 10*time.Second)
	must.Eq(t, porcupine.Ok, v.Result, must.Sprint(v))
}
