package nomad

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func TestLeadershipLog(t *testing.T) {
	var l leadershipLog
	t0 := time.Unix(1000, 0)
	l.observe("a", "10.0.0.1:4647", t0)
	l.observe("a", "10.0.0.1:4647", t0.Add(time.Second)) // no change
	l.observe("", "", t0.Add(10*time.Second))
	l.observe("b", "10.0.0.2:4647", t0.Add(10*time.Second+300*time.Millisecond))
	// A direct change, with no leaderless moment seen.
	l.observe("c", "10.0.0.3:4647", t0.Add(20*time.Second))

	got := l.list()
	must.Len(t, 3, got)
	must.EqOp(t, "a", got[0].LeaderID)
	must.EqOp(t, "", got[0].PreviousID)
	must.False(t, got[0].GapKnown)
	must.EqOp(t, "b", got[1].LeaderID)
	must.EqOp(t, "a", got[1].PreviousID)
	must.True(t, got[1].GapKnown)
	must.EqOp(t, 300*time.Millisecond, got[1].Gap)
	must.EqOp(t, "c", got[2].LeaderID)
	must.False(t, got[2].GapKnown)

	// The new leader's own measure replaces what it observed.
	l.leaderGap("c", "10.0.0.3:4647", 450*time.Millisecond, t0.Add(21*time.Second))
	got = l.list()
	must.Len(t, 3, got)
	must.True(t, got[2].MeasuredByLeader)
	must.EqOp(t, 450*time.Millisecond, got[2].Gap)
	// list returns copies.
	got[2].Gap = 0
	must.EqOp(t, 450*time.Millisecond, l.list()[2].Gap)

	// A gap reported before the observation arrives records the change.
	l.leaderGap("d", "10.0.0.4:4647", time.Second, t0.Add(30*time.Second))
	got = l.list()
	must.EqOp(t, "d", got[len(got)-1].LeaderID)
	must.True(t, got[len(got)-1].MeasuredByLeader)

	// Bounded.
	for i := range structs.LeadershipHistoryRecent * 2 {
		l.observe(string(rune('e'+i%2)), "", t0.Add(time.Duration(40+i)*time.Second))
	}
	must.Len(t, structs.LeadershipHistoryRecent, l.list())
}
