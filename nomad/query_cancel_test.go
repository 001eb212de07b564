package nomad

import (
	"context"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

func TestQueryCancels_Bounds(t *testing.T) {
	q := newQueryCancels(2)
	parent := context.Background()

	// Not tracked: empty, overlong.
	for _, id := range []string{"", strings.Repeat("x", 65)} {
		ctx, release := q.track(parent, id)
		must.True(t, ctx == parent, must.Sprintf("id %q", id))
		release()
	}
	must.Eq(t, 0, q.len())

	a, releaseA := q.track(parent, "a")
	// A duplicate keeps its parent and does not displace the first.
	dup, releaseDup := q.track(parent, "a")
	must.True(t, dup == parent)
	releaseDup()
	_, releaseB := q.track(parent, "b")
	// Past the cap, nothing more is tracked.
	c, releaseC := q.track(parent, "c")
	must.True(t, c == parent)
	releaseC()
	must.Eq(t, 2, q.len())

	must.False(t, q.cancel("c"))
	must.True(t, q.cancel("a"))
	must.ErrorIs(t, a.Err(), context.Canceled)
	must.False(t, q.cancel("a"), must.Sprint("cancelled once only"))

	releaseA() // after a cancel: harmless
	releaseB()
	must.Eq(t, 0, q.len())
}
