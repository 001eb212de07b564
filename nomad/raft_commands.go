package nomad

import (
	"sync"

	"github.com/hashicorp/raft"
)

// maxCommandRefs bounds how many of the newest commands a commandIndex
// remembers. A new leader needs only the last command of an earlier term,
// so it is reached after at most the commands of its own term written
// before its duties open.
const maxCommandRefs = 256

// seedScan bounds how many entries a commandIndex reads back from the end
// of the log, looking for the newest command, when it starts.
const seedScan = 1024

// commandIndex is Raft's log store with a record of where the newest
// commands are, so that a new leader can tell without reading the log
// which command of an earlier term its FSM must have applied (see
// catchUp). Commands are the only entries the FSM applies; the rest (a
// leader's no-op, barriers, configuration changes) can be many in a quiet
// cluster that changes leader often, and reading them back one by one
// from the log cost up to milliseconds on the takeover's critical path.
type commandIndex struct {
	raft.LogStore

	mu sync.Mutex
	// refs lists the newest commands in the log, oldest first.
	refs []commandRef
	// known is the index above which refs lists every command in the log.
	known uint64
}

type commandRef struct{ index, term uint64 }

// newCommandIndex wraps logs, reading back from its end to its newest
// command (at most seedScan entries). Only that one is needed: a lookup
// wants the newest command of a term before this server's next term as
// leader, which is later than every term in the log now, and every
// command written later is recorded as it is stored.
func newCommandIndex(logs raft.LogStore) (*commandIndex, error) {
	c := &commandIndex{LogStore: logs}
	first, err := logs.FirstIndex()
	if err != nil {
		return nil, err
	}
	last, err := logs.LastIndex()
	if err != nil {
		return nil, err
	}
	if last == 0 {
		return c, nil
	}
	low := max(first, 1)
	if last >= seedScan && last-seedScan+1 > low {
		low = last - seedScan + 1
	}
	for i := last; i >= low; i-- {
		var l raft.Log
		if err := logs.GetLog(i, &l); err != nil {
			return nil, err
		}
		if l.Type == raft.LogCommand {
			c.refs = []commandRef{{l.Index, l.Term}}
			c.known = i - 1
			return c, nil
		}
	}
	c.known = low - 1
	return c, nil
}

var _ raft.MonotonicLogStore = (*commandIndex)(nil)

// IsMonotonic passes on whether the wrapped store takes only consecutive
// indexes (raft-wal does), so that Raft clears it after restoring a user
// snapshot instead of leaving a gap it would refuse.
func (c *commandIndex) IsMonotonic() bool {
	m, ok := c.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func (c *commandIndex) StoreLog(l *raft.Log) error {
	return c.StoreLogs([]*raft.Log{l})
}

// StoreLogs records the commands among logs, then stores them. Recording
// first means a lookup never misses a stored command; one whose write then
// fails is a command to wait for that never comes, and the barrier that
// runs alongside decides.
func (c *commandIndex) StoreLogs(logs []*raft.Log) error {
	c.mu.Lock()
	for _, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		// Raft overwrites a conflicting suffix only after deleting it, but
		// should an index come again, its old record goes.
		for len(c.refs) > 0 && c.refs[len(c.refs)-1].index >= l.Index {
			c.refs = c.refs[:len(c.refs)-1]
		}
		c.refs = append(c.refs, commandRef{l.Index, l.Term})
		if len(c.refs) > maxCommandRefs {
			c.known = c.refs[0].index
			c.refs = c.refs[1:]
		}
	}
	c.mu.Unlock()
	return c.LogStore.StoreLogs(logs)
}

// DeleteRange deletes [min, max] (a conflicting suffix Raft removes, or a
// prefix compacted into a snapshot), then forgets its commands. Forgetting
// only once they are gone means a lookup never misses one still in the
// log; one that sees them in between waits for a command that is gone, and
// the barrier decides.
func (c *commandIndex) DeleteRange(min, max uint64) error {
	if err := c.LogStore.DeleteRange(min, max); err != nil {
		return err
	}
	c.mu.Lock()
	kept := c.refs[:0]
	for _, r := range c.refs {
		if r.index < min || r.index > max {
			kept = append(kept, r)
		}
	}
	c.refs = kept
	c.mu.Unlock()
	return nil
}

// lastEarlierCommand returns the index of the last command of a term
// before term that the FSM, having applied up to applied, has still to
// apply (0 if none), and whether the index can tell. It cannot when that
// command may be one it no longer lists (more than maxCommandRefs
// commands since, or beyond the scan it started with).
func (c *commandIndex) lastEarlierCommand(term, applied uint64) (uint64, bool) {
	c.mu.Lock()
	for i := len(c.refs) - 1; i >= 0; i-- {
		r := c.refs[i]
		if r.term >= term {
			continue
		}
		c.mu.Unlock()
		if r.index <= applied {
			return 0, true
		}
		return r.index, true
	}
	known := c.known
	c.mu.Unlock()
	if applied >= known {
		return 0, true
	}
	// Commands below the log's first entry were compacted into a
	// snapshot taken of, or restored into, the FSM.
	first, err := c.LogStore.FirstIndex()
	if err != nil {
		return 0, false
	}
	return 0, known < first
}

// lastCommandThrough returns the newest command at or below index, and
// whether the index can tell: it cannot when every command it lists is
// above index and an older one may sit below (at or under known). 0, true
// means there is none.
func (c *commandIndex) lastCommandThrough(index uint64) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.refs) - 1; i >= 0; i-- {
		if c.refs[i].index <= index {
			return c.refs[i].index, true
		}
	}
	return 0, c.known == 0
}
