package readgate

import (
	"testing"

	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"
)

func TestCaughtUp(t *testing.T) {
	// A follower that heard a leader's append: commit 12 (it started at
	// 4), the newest command at or below it 11, the FSM at 11.
	caught := View{Applied: 11, Target: 11, State: raft.Follower, Contacted: true, Commit: 12, CommitAtStart: 4}
	with := func(f func(*View)) View { v := caught; f(&v); return v }
	cases := []struct {
		name string
		v    View
		want bool
	}{
		{"follower caught up", caught, true},
		{"follower never contacted", with(func(v *View) { v.Contacted = false }), false},
		{"heard only heartbeats: commit as at start", with(func(v *View) { v.Commit = 4; v.Target = 4; v.Applied = 4 }), false},
		{"FSM behind the queued entries", with(func(v *View) { v.Applied = 9 }), false},
		{"commit below the floor", with(func(v *View) { v.Floor = 20 }), false},
		{"commit at the floor", with(func(v *View) { v.Floor = 12 }), true},
		{"candidate", with(func(v *View) { v.State = raft.Candidate }), false},
		{"shut down", with(func(v *View) { v.State = raft.Shutdown }), false},
		{"leader before its duties run", View{State: raft.Leader, Commit: 20}, false},
		{"leader running its duties", View{State: raft.Leader, Leading: true, Commit: 20}, true},
		{"leader running its duties, commit below the floor", View{State: raft.Leader, Leading: true, Commit: 5, Floor: 20}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { must.Eq(t, c.want, CaughtUp(c.v)) })
	}
}
