package raftlog

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// The space watcher's decisions, check by check: warn when space first
// runs low, again only every rewarnEvery while it stays low, and say so
// once when it is back.
func TestSpaceNotice(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	low, plenty := uint64(lowSpaceBytes-1), uint64(lowSpaceBytes)
	cases := []struct {
		name                string
		st                  spaceState
		free                uint64
		now                 time.Time
		want                spaceState
		warn, recoveredWant bool
	}{
		{"plenty, was fine", spaceState{}, plenty, t0, spaceState{}, false, false},
		{"low, was fine: warn", spaceState{}, low, t0, spaceState{low: true, lastWarn: t0}, true, false},
		{"still low, warned just now", spaceState{low: true, lastWarn: t0}, low, t0.Add(time.Minute),
			spaceState{low: true, lastWarn: t0}, false, false},
		{"still low, warned long ago: warn again", spaceState{low: true, lastWarn: t0}, low, t0.Add(rewarnEvery),
			spaceState{low: true, lastWarn: t0.Add(rewarnEvery)}, true, false},
		{"back", spaceState{low: true, lastWarn: t0}, plenty, t0.Add(time.Second), spaceState{}, false, true},
		{"empty disk", spaceState{}, 0, t0, spaceState{low: true, lastWarn: t0}, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			next, warn, recovered := spaceNotice(c.st, c.free, c.now)
			must.Eq(t, c.want, next)
			must.EqOp(t, c.warn, warn)
			must.EqOp(t, c.recoveredWant, recovered)
		})
	}
}
