package raftlog

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/roamhq/roam/structs"
)

// termKey is the stable key under which hashicorp/raft keeps its current
// term.
var termKey = []byte("CurrentTerm")

// Stable is Raft's stable store (its term and vote) with one change: a
// term that cannot be written stops the server, where Raft would crash
// it.
//
// Raft panics when it cannot write its current term, and only then: a
// vote it cannot write is a vote not cast. On a disk that fails every
// write, a server that stepped down after a failed append can stand for
// election before it has stopped, and it died with exit 2 and a stack
// rather than exit 1 and the reason. Once armed, a failed term write is
// reported to fail and the goroutine that made it ends (runtime.Goexit)
// instead of returning. After start-up that goroutine is Raft's main
// loop, or, for a heartbeat that carries a higher term, the transport
// goroutine serving it (the server's relay, after which it answers no
// Raft RPC until it has stopped, as if it were down). Either stops where
// it stood, before Raft changed
// the term in memory; deferred cleanup still runs (a leader steps down,
// the RPC is answered), and the server shuts down on the fatal error as
// it does after a failed append. Raft's Shutdown needs neither.
//
// Before Arm the error is returned: raft.NewRaft writes the term back on
// its caller's goroutine, which must not end, and the server's own
// single-server bootstrap waits on a future that an ended main loop
// would never answer; NewRaft's panic on the error is the server's to
// report (TermWriteFailed). A term write that fails between NewRaft
// starting Raft and Arm still panics: a start-up window left open.
type Stable struct {
	store raft.StableStore
	dir   string
	fail  func(error)
	armed atomic.Bool

	mu     sync.Mutex
	failed error
}

var _ raft.StableStore = (*Stable)(nil)

// NewStable wraps store, whose files are in dir (named in errors); fail is
// called once, with the first failed term write's error.
func NewStable(store raft.StableStore, dir string, fail func(error)) *Stable {
	return &Stable{store: store, dir: dir, fail: fail}
}

// Arm makes a failed term write end its goroutine. Call it once Raft runs
// and the server's own bootstrap, if any, is done.
func (s *Stable) Arm() { s.armed.Store(true) }

// TermWriteFailed returns the first failed term write's error, or nil.
func (s *Stable) TermWriteFailed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

func (s *Stable) Set(key, val []byte) error { return s.store.Set(key, val) }

func (s *Stable) Get(key []byte) ([]byte, error) { return s.store.Get(key) }

func (s *Stable) GetUint64(key []byte) (uint64, error) { return s.store.GetUint64(key) }

func (s *Stable) SetUint64(key []byte, val uint64) error {
	err := s.store.SetUint64(key, val)
	if err == nil || !bytes.Equal(key, termKey) {
		return err
	}
	wrapped := fmt.Errorf("%w: write raft's term %d on %s: %w; this server stops so that its supervisor restarts it",
		structs.ErrRaftLogWrite, val, s.dir, err)
	s.mu.Lock()
	first := s.failed == nil
	if first {
		s.failed = wrapped
	}
	s.mu.Unlock()
	if !s.armed.Load() {
		return wrapped
	}
	if first && s.fail != nil {
		s.fail(wrapped)
	}
	runtime.Goexit()
	return nil // not reached
}
