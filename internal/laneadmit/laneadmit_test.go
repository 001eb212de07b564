package laneadmit

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/shoenig/test/must"
)

func vol(v string) Call       { return Call{Volume: v} }
func pub(v, node string) Call { return Call{Volume: v, Node: node} }
func calls(cs ...Call) []Call { return cs }

func TestAdmit(t *testing.T) {
	cases := []struct {
		name    string
		running []Call
		queue   []Call
		limit   int
		want    []int
	}{
		// Limit 1 is today's lane exactly: one call at a time, in order.
		{"limit 1, idle lane: the first starts", nil, calls(vol("a"), vol("b")), 1, []int{0}},
		{"limit 1, busy lane: nothing starts", calls(vol("x")), calls(vol("a")), 1, nil},
		{"limit 0 counts as 1", nil, calls(vol("a"), vol("b")), 0, []int{0}},
		{"negative limit counts as 1", nil, calls(vol("a"), vol("b")), -3, []int{0}},
		{"empty queue", calls(vol("x")), nil, 4, nil},

		{"free slots fill in queue order", nil, calls(vol("a"), vol("b"), vol("c")), 2, []int{0, 1}},
		{"running calls take slots", calls(vol("x")), calls(vol("a"), vol("b"), vol("c")), 3, []int{0, 1}},
		{"running over a lowered limit: nothing starts", calls(vol("x"), vol("y"), vol("z")), calls(vol("a")), 2, nil},

		{"a volume running blocks its next call", calls(vol("a")), calls(vol("a"), vol("b")), 4, []int{1}},
		{"a node running blocks publishes to it", calls(pub("a", "n1")), calls(pub("b", "n1"), pub("c", "n2")), 4, []int{1}},
		{"a call without a node is not held by a node", calls(pub("a", "n1")), calls(vol("b")), 4, []int{0}},
		{"two queued calls for one volume: only the first", nil, calls(vol("a"), vol("a"), vol("b")), 4, []int{0, 2}},
		{"two queued publishes to one node: only the first", nil, calls(pub("a", "n1"), pub("b", "n1"), pub("c", "n2")), 4, []int{0, 2}},

		// A blocked call keeps its place for both its keys.
		{"a blocked call holds its node against later calls",
			calls(vol("a")), calls(pub("a", "n1"), pub("b", "n1"), pub("c", "n2")), 4, []int{2}},
		{"a blocked call holds its volume against later calls",
			calls(pub("x", "n1")), calls(pub("a", "n1"), vol("a"), vol("b")), 4, []int{2}},

		// No head-of-line blocking: free calls pass waiting ones.
		{"free calls pass a waiting one",
			calls(vol("a")), calls(vol("a"), vol("b"), vol("c"), vol("d")), 3, []int{1, 2}},
		{"the oldest free call gets the last slot",
			calls(vol("a"), vol("b")), calls(vol("a"), vol("c"), vol("d")), 3, []int{1}},

		{"calls with no keys never conflict", nil, calls(Call{}, Call{}, Call{}), 2, []int{0, 1}},

		// A create holds its source as well as its own name.
		{"a create from a volume waits for a call on it", calls(vol("a")), calls(Call{Volume: "new", Source: "a"}), 4, nil},
		{"a call on a volume waits for a create from it", calls(Call{Volume: "new", Source: "a"}), calls(vol("a"), vol("b")), 4, []int{1}},
		{"two creates from one source: only the first", nil, calls(Call{Volume: "n1", Source: "s"}, Call{Volume: "n2", Source: "s"}), 4, []int{0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, Admit(tc.running, tc.queue, tc.limit))
		})
	}
}

func TestValid(t *testing.T) {
	for n, want := range map[int]bool{-1: false, 0: false, 1: true, 16: true, 64: true, 65: false} {
		must.Eq(t, want, Valid(n), must.Sprintf("Valid(%d)", n))
	}
}

// TestAdmit_Property drives random lanes through arrivals, admissions and
// finishes, and checks after every admission that:
//   - no two running calls share a volume or a node;
//   - no more calls run than the limit;
//   - no call started while an older queued call shared one of its keys;
//   - an idle lane with a queue starts something, and a free slot with a
//     queued call whose keys are free (of running and of older queued
//     calls) is never left unused;
//
// and, once arrivals stop, that every call ran (none starves).
func TestAdmit_Property(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		limit := 1 + r.IntN(6)
		nVols, nNodes := 1+r.IntN(6), 1+r.IntN(4)
		randomCall := func() Call {
			var c Call
			if r.IntN(8) > 0 {
				c.Volume = fmt.Sprintf("v%d", r.IntN(nVols))
			}
			if r.IntN(6) == 0 {
				c.Source = fmt.Sprintf("v%d", r.IntN(nVols))
			}
			if r.IntN(2) == 0 {
				c.Node = fmt.Sprintf("n%d", r.IntN(nNodes))
			}
			return c
		}
		var running, queue []Call
		arrived, finished := 0, 0
		const arrivals = 200
		for step := 0; step < 10_000 && (arrived < arrivals || len(queue)+len(running) > 0); step++ {
			// Arrivals, then finishes, then an admission.
			for n := r.IntN(3); n > 0 && arrived < arrivals; n-- {
				queue = append(queue, randomCall())
				arrived++
			}
			if len(running) > 0 && r.IntN(3) > 0 {
				i := r.IntN(len(running))
				running = append(running[:i], running[i+1:]...)
				finished++
			}
			rc, qq := running, queue
			start := Admit(rc, qq, limit)

			startSet := map[int]bool{}
			for _, i := range start {
				startSet[i] = true
			}
			// Work conserving: every call left queued either had no slot
			// or a key held by a running or older queued call.
			slots := limit - len(running) - len(start)
			for i, c := range qq {
				if startSet[i] || slots <= 0 {
					continue
				}
				blocked := conflicts(c, rc)
				for j := 0; j < i && !blocked; j++ {
					blocked = conflicts(c, []Call{qq[j]})
				}
				must.True(t, blocked, must.Sprintf("seed %d step %d: call %d %+v left queued with a free slot and free keys", seed, step, i, c))
			}
			// Order: no started call has an older queued call that stays
			// queued and shares a key.
			for _, i := range start {
				for j := 0; j < i; j++ {
					if !startSet[j] {
						must.False(t, conflicts(qq[i], []Call{qq[j]}),
							must.Sprintf("seed %d step %d: call %d passed older call %d on a shared key", seed, step, i, j))
					}
				}
			}
			var keep []Call
			for i, c := range queue {
				if startSet[i] {
					running = append(running, c)
				} else {
					keep = append(keep, c)
				}
			}
			queue = keep
			must.LessEq(t, limit, len(running), must.Sprintf("seed %d step %d: %d running, limit %d", seed, step, len(running), limit))
			vols, nodes := map[string]bool{}, map[string]bool{}
			for _, c := range running {
				own := map[string]bool{c.Volume: c.Volume != "", c.Source: c.Source != ""}
				for v, held := range own {
					if held {
						must.False(t, vols[v], must.Sprintf("seed %d step %d: two calls on volume %s", seed, step, v))
						vols[v] = true
					}
				}
				if c.Node != "" {
					must.False(t, nodes[c.Node], must.Sprintf("seed %d step %d: two calls for node %s", seed, step, c.Node))
					nodes[c.Node] = true
				}
			}
			if len(running) == 0 {
				must.SliceEmpty(t, queue, must.Sprintf("seed %d step %d: idle lane left %d queued", seed, step, len(queue)))
			}
		}
		must.SliceEmpty(t, queue, must.Sprintf("seed %d: calls starved", seed))
		must.Eq(t, arrivals, finished+len(running), must.Sprintf("seed %d", seed))
	}
}

func conflicts(c Call, others []Call) bool {
	for _, o := range others {
		for _, v := range []string{c.Volume, c.Source} {
			if v != "" && (v == o.Volume || v == o.Source) {
				return true
			}
		}
		if c.Node != "" && c.Node == o.Node {
			return true
		}
	}
	return false
}

func TestCreate(t *testing.T) {
	must.Eq(t, Call{Volume: "name:db"}, Create("db", "", ""))
	must.Eq(t, Call{Volume: "name:db", Source: "snap:s1"}, Create("db", "s1", ""))
	must.Eq(t, Call{Volume: "name:db", Source: "vol:ext-1"}, Create("db", "", "ext-1"))
	// A create from a snapshot waits for that snapshot's delete, and a
	// clone for a call on its source volume.
	must.Eq(t, []int(nil), Admit([]Call{{Volume: SnapshotKey("s1")}}, []Call{Create("db", "s1", "")}, 4))
	must.Eq(t, []int(nil), Admit([]Call{{Volume: VolumeKey("ext-1")}}, []Call{Create("db", "", "ext-1")}, 4))
}
