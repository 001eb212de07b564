package heartbeatlag

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// TestDecide is the verdict as a table of window × extensions so far.
func TestDecide(t *testing.T) {
	cases := []struct {
		name       string
		w          Window
		extensions int
		want       Verdict
	}{
		{"quiet leader, silent node", Window{Answered: 1000, Late: 0}, 0, MarkDown},
		{"zone outage: the rest on time", Window{Answered: 800, Late: 1}, 0, MarkDown},
		{"a few slow clients are not a slow leader", Window{Answered: 40, Late: 9}, 0, MarkDown},
		{"many late: the leader is behind", Window{Answered: 1000, Late: 100}, 0, Extend},
		{"just under the share", Window{Answered: 1001, Late: 100}, 0, MarkDown},
		{"smallest count that is behind", Window{Answered: 100, Late: 10}, 0, Extend},
		{"behind, extended once", Window{Answered: 100, Late: 40}, 1, Extend},
		{"behind, extended to the bound", Window{Answered: 100, Late: 40}, MaxExtensions, MarkDown},
		{"nothing answered at all", Window{}, 0, MarkDown},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, Decide(tc.w, tc.extensions))
		})
	}
}

func TestCounter_SlidingWindow(t *testing.T) {
	c := NewCounter(10 * time.Second)
	t0 := time.Unix(1_000_000, 0)
	for i := range 10 {
		c.Add(t0.Add(time.Duration(i)*time.Second), i%2 == 0)
	}
	must.Eq(t, Window{Answered: 10, Late: 5}, c.Window(t0.Add(9*time.Second)))
	// Three seconds on, the first three buckets have left the window.
	must.Eq(t, Window{Answered: 7, Late: 3}, c.Window(t0.Add(12*time.Second)))
	// A bucket reused for a later second starts from zero.
	c.Add(t0.Add(12*time.Second), true)
	must.Eq(t, Window{Answered: 8, Late: 4}, c.Window(t0.Add(12*time.Second)))
	// Long after, nothing is left.
	must.Eq(t, Window{}, c.Window(t0.Add(time.Hour)))
	// Span below a second is one second.
	small := NewCounter(time.Millisecond)
	small.Add(t0, true)
	must.Eq(t, Window{Answered: 1, Late: 1}, small.Window(t0))
}
