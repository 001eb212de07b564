package nomad

import (
	"sync"
	"time"

	"github.com/roamhq/roam/structs"
)

// leadershipLog keeps the latest leadership changes a server saw, for
// operators (the UI's cluster page). It is local: each server has its
// own view, and the one that became leader has the exact gap.
type leadershipLog struct {
	mu sync.Mutex
	// current is the leader now seen ("" while there is none); lostAt is
	// when the server last went from a leader to none.
	current, last string
	lostAt        time.Time
	changes       []*structs.LeadershipChange
}

// observe records that the server now sees leader id (at addr) at now.
func (l *leadershipLog) observe(id, addr string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case id == l.current:
		return
	case id == "":
		l.current = ""
		l.lostAt = now
		return
	}
	c := &structs.LeadershipChange{At: now, LeaderID: id, LeaderAddr: addr, PreviousID: l.last}
	if !l.lostAt.IsZero() && l.current == "" {
		c.Gap, c.GapKnown = now.Sub(l.lostAt), true
	}
	l.current, l.last, l.lostAt = id, id, time.Time{}
	l.changes = append(l.changes, c)
	if n := len(l.changes) - structs.LeadershipHistoryRecent; n > 0 {
		l.changes = append([]*structs.LeadershipChange(nil), l.changes[n:]...)
	}
}

// leaderGap records the gap the server measured on becoming leader id,
// on its latest change naming itself.
func (l *leadershipLog) leaderGap(id, addr string, gap time.Duration, now time.Time) {
	l.mu.Lock()
	if l.current != id {
		l.mu.Unlock()
		l.observe(id, addr, now)
		l.mu.Lock()
	}
	defer l.mu.Unlock()
	for i := len(l.changes) - 1; i >= 0; i-- {
		if c := l.changes[i]; c.LeaderID == id {
			c.Gap, c.GapKnown, c.MeasuredByLeader = gap, true, true
			return
		}
	}
}

// list returns copies of the changes, oldest first.
func (l *leadershipLog) list() []*structs.LeadershipChange {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*structs.LeadershipChange, len(l.changes))
	for i, c := range l.changes {
		cp := *c
		out[i] = &cp
	}
	return out
}
