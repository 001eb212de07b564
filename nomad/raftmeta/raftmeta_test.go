package raftmeta

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/types"
	"github.com/shoenig/test/must"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s := &Store{}
	_, err := s.Load(dir)
	must.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// reopen loads the store in dir again, as a restarted server would.
func reopen(t *testing.T, dir string) (*Store, types.PersistentState) {
	t.Helper()
	r := &Store{}
	st, err := r.Load(dir)
	must.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	return r, st
}

func someState(n uint64) types.PersistentState {
	return types.PersistentState{NextSegmentID: n, Segments: []types.SegmentInfo{{
		ID: n - 1, BaseIndex: 1, MinIndex: 1, Codec: 1, CreateTime: time.Unix(1700000000, 0).UTC(), SizeLimit: 64 << 20,
	}}}
}

func TestStore_NewDirIsEmpty(t *testing.T) {
	s := &Store{}
	st, err := s.Load(t.TempDir())
	must.NoError(t, err)
	defer s.Close()
	must.Eq(t, types.PersistentState{}, st)
	v, err := s.GetStable([]byte("CurrentTerm"))
	must.NoError(t, err)
	must.Nil(t, v)
}

func TestStore_WritesSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	// More writes than files, so both files are written over.
	for term := range uint64(5) {
		must.NoError(t, s.SetStable([]byte("CurrentTerm"), []byte{byte(term)}))
	}
	must.NoError(t, s.SetStable([]byte("LastVoteCand"), []byte("server-1")))
	must.NoError(t, s.CommitState(someState(3)))
	must.NoError(t, s.Close())

	r, st := reopen(t, dir)
	must.Eq(t, someState(3), st)
	v, err := r.GetStable([]byte("CurrentTerm"))
	must.NoError(t, err)
	must.Eq(t, []byte{4}, v)
	v, err = r.GetStable([]byte("LastVoteCand"))
	must.NoError(t, err)
	must.Eq(t, []byte("server-1"), v)
}

// newestFile returns the path of the file that holds the newest record.
func newestFile(s *Store) string { return s.files[s.newest].Name() }

func TestStore_TornWriteLeavesThePreviousRecord(t *testing.T) {
	for _, damage := range []struct {
		name string
		do   func(t *testing.T, path string)
	}{
		{"payload half written", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			must.NoError(t, err)
			defer f.Close()
			_, err = f.WriteAt(bytes.Repeat([]byte{0xAA}, 16), headerLen+4)
			must.NoError(t, err)
		}},
		{"header only", func(t *testing.T, path string) {
			must.NoError(t, os.Truncate(path, headerLen))
		}},
		{"file emptied", func(t *testing.T, path string) {
			must.NoError(t, os.Truncate(path, 0))
		}},
		{"length past the end", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			must.NoError(t, err)
			defer f.Close()
			_, err = f.WriteAt([]byte{0x03, 0xff, 0xff, 0xff}, 16)
			must.NoError(t, err)
		}},
	} {
		t.Run(damage.name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			must.NoError(t, s.SetStable([]byte("CurrentTerm"), []byte{7}))
			must.NoError(t, s.SetStable([]byte("CurrentTerm"), []byte{8}))
			torn := newestFile(s)
			must.NoError(t, s.Close())
			damage.do(t, torn)

			r := open(t, dir)
			v, err := r.GetStable([]byte("CurrentTerm"))
			must.NoError(t, err)
			must.Eq(t, []byte{7}, v, must.Sprint("the record before the torn one is the newest left"))
			// And writing goes on from there, over the damaged file.
			must.NoError(t, r.SetStable([]byte("CurrentTerm"), []byte{9}))
			must.NoError(t, r.Close())
			v, err = open(t, dir).GetStable([]byte("CurrentTerm"))
			must.NoError(t, err)
			must.Eq(t, []byte{9}, v)
		})
	}
}

func TestStore_NoValidRecordIsAnError(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	must.NoError(t, s.SetStable([]byte("CurrentTerm"), []byte{7}))
	must.NoError(t, s.Close())
	for _, name := range []string{fileA, fileB} {
		must.NoError(t, os.WriteFile(filepath.Join(dir, name), bytes.Repeat([]byte{0}, 100), 0o600))
	}
	_, err := (&Store{}).Load(dir)
	must.ErrorIs(t, err, ErrDamaged)
	must.StrContains(t, err.Error(), "term and vote")
}

func TestStore_OneFileMissing(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	must.NoError(t, s.SetStable([]byte("CurrentTerm"), []byte{7}))
	newest := newestFile(s)
	must.NoError(t, s.Close())
	// A crash between creating meta-a and meta-b leaves only the one that
	// holds a record; here the one that does not is removed.
	for _, name := range []string{fileA, fileB} {
		if p := filepath.Join(dir, name); p != newest {
			must.NoError(t, os.Remove(p))
		}
	}
	r := open(t, dir)
	v, err := r.GetStable([]byte("CurrentTerm"))
	must.NoError(t, err)
	must.Eq(t, []byte{7}, v)
	must.NoError(t, r.SetStable([]byte("CurrentTerm"), []byte{8}))
}

func TestStore_OneProcessAtATime(t *testing.T) {
	dir := t.TempDir()
	open(t, dir)
	_, err := (&Store{}).Load(dir)
	must.ErrorContains(t, err, "in use by another process")
}

func TestStore_AfterCloseAndBeforeLoad(t *testing.T) {
	s := &Store{}
	must.Error(t, s.SetStable([]byte("k"), []byte("v")))
	dir := t.TempDir()
	_, err := s.Load(dir)
	must.NoError(t, err)
	_, err = s.Load(t.TempDir())
	must.ErrorContains(t, err, "already open")
	must.NoError(t, s.Close())
	must.NoError(t, s.Close())
	must.ErrorIs(t, s.SetStable([]byte("k"), []byte("v")), ErrClosed)
	_, err = s.GetStable([]byte("k"))
	must.ErrorIs(t, err, errNotOpen)
	// The lock went with Close.
	open(t, dir)
}

func TestStore_FailedWriteRefusesLaterOnes(t *testing.T) {
	s := open(t, t.TempDir())
	must.NoError(t, s.SetStable([]byte("CurrentTerm"), []byte{1}))
	// The file the next write goes to, closed under the store: the write
	// fails, and what is on disk is then unknown.
	s.files[1-s.newest].Close()
	must.Error(t, s.SetStable([]byte("CurrentTerm"), []byte{2}))
	err := s.SetStable([]byte("CurrentTerm"), []byte{3})
	must.ErrorContains(t, err, "an earlier write failed")
	v, err := s.GetStable([]byte("CurrentTerm"))
	must.NoError(t, err)
	must.Eq(t, []byte{1}, v, must.Sprint("a failed write is not read back"))
}

func TestStore_GetReturnsACopy(t *testing.T) {
	s := open(t, t.TempDir())
	val := []byte("abc")
	must.NoError(t, s.SetStable([]byte("k"), val))
	val[0] = 'x'
	got, err := s.GetStable([]byte("k"))
	must.NoError(t, err)
	must.Eq(t, []byte("abc"), got)
	got[0] = 'y'
	again, err := s.GetStable([]byte("k"))
	must.NoError(t, err)
	must.Eq(t, []byte("abc"), again)
}

func TestStore_ConcurrentReadsAndWrites(t *testing.T) {
	s := open(t, t.TempDir())
	var wg sync.WaitGroup
	errs := make(chan error, 4*20*3)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				errs <- s.SetStable([]byte(fmt.Sprintf("k%d", w)), []byte{byte(i)})
				if w == 0 {
					errs <- s.CommitState(someState(uint64(i + 1)))
				}
				_, err := s.GetStable([]byte("k0"))
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must.NoError(t, err)
	}
	for w := range 4 {
		v, err := s.GetStable([]byte(fmt.Sprintf("k%d", w)))
		must.NoError(t, err)
		must.Eq(t, []byte{19}, v)
	}
}

// boltDir writes raft-wal's own bolt metadata into a new directory.
func boltDir(t *testing.T, state types.PersistentState, stable map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	db := &metadb.BoltMetaDB{}
	_, err := db.Load(dir)
	must.NoError(t, err)
	must.NoError(t, db.CommitState(state))
	for k, v := range stable {
		must.NoError(t, db.SetStable([]byte(k), v))
	}
	must.NoError(t, db.Close())
	return dir
}

// walDirWithBolt makes a log as a build with raft-wal's own bolt metadata
// leaves it: two entries, term 9, a vote.
func walDirWithBolt(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	w, err := raftwal.Open(dir)
	must.NoError(t, err)
	must.NoError(t, w.StoreLogs([]*raft.Log{{Index: 1, Term: 1, Data: []byte("a")}, {Index: 2, Term: 9, Data: []byte("b")}}))
	must.NoError(t, w.SetUint64([]byte("CurrentTerm"), 9))
	must.NoError(t, w.Set([]byte("LastVoteCand"), []byte("server-2")))
	must.NoError(t, w.Close())
	return dir
}

// segments lists the log's segment files.
func segments(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*"+segmentSuffix))
	must.NoError(t, err)
	return m
}

// mustHoldLog opens dir through raft-wal with a Store and checks the log,
// term and vote walDirWithBolt wrote.
func mustHoldLog(t *testing.T, dir string) {
	t.Helper()
	meta := &Store{}
	w, err := raftwal.Open(dir, raftwal.WithMetaStore(meta))
	must.NoError(t, err)
	defer meta.Close()
	defer w.Close()
	term, err := w.GetUint64([]byte("CurrentTerm"))
	must.NoError(t, err)
	must.Eq(t, 9, term)
	cand, err := w.Get([]byte("LastVoteCand"))
	must.NoError(t, err)
	must.Eq(t, []byte("server-2"), cand)
	var l raft.Log
	must.NoError(t, w.GetLog(2, &l))
	must.Eq(t, []byte("b"), l.Data)
}

func TestStore_ImportsBoltMetadata(t *testing.T) {
	dir := walDirWithBolt(t)
	mustHoldLog(t, dir)
	// A copy of the original is kept, and wal-meta.db now turns away a
	// build that reads only it, before raft-wal deletes anything.
	_, err := os.Stat(filepath.Join(dir, metadb.FileName+importedSuffix))
	must.NoError(t, err)
	before := segments(t, dir)
	must.SliceNotEmpty(t, before)
	older := &metadb.BoltMetaDB{}
	_, err = raftwal.Open(dir, raftwal.WithMetaStore(older))
	must.ErrorContains(t, err, "unknown codec")
	must.NoError(t, older.Close())
	must.Eq(t, before, segments(t, dir), must.Sprint("an older build deleted segment files"))
	// And this store opens it again, the refusal file left as it is.
	mustHoldLog(t, dir)
}

func TestStore_ImportStoppedBeforeTheRefusal(t *testing.T) {
	dir := walDirWithBolt(t)
	// What an import leaves when it stops after writing meta-a: the
	// original bolt file, holding what meta-a does.
	rec, moved, err := importBolt(filepath.Join(dir, metadb.FileName))
	must.NoError(t, err)
	must.False(t, moved)
	must.NoError(t, createFile(filepath.Join(dir, fileA), encode(1, rec)))

	mustHoldLog(t, dir)
	_, moved, err = importBolt(filepath.Join(dir, metadb.FileName))
	must.NoError(t, err)
	must.True(t, moved, must.Sprint("the import finished on the next start"))
}

func TestStore_BoltWrittenAfterTheImportIsRefused(t *testing.T) {
	dir := walDirWithBolt(t)
	mustHoldLog(t, dir)
	// Someone puts the original back and runs a build that keeps its
	// metadata only in bolt, which votes.
	must.NoError(t, os.Rename(filepath.Join(dir, metadb.FileName+importedSuffix), filepath.Join(dir, metadb.FileName)))
	db := &metadb.BoltMetaDB{}
	_, err := db.Load(dir)
	must.NoError(t, err)
	must.NoError(t, db.SetStable([]byte("CurrentTerm"), []byte{10}))
	must.NoError(t, db.Close())

	_, err = (&Store{}).Load(dir)
	must.ErrorIs(t, err, ErrDamaged)
	must.StrContains(t, err.Error(), "disagree")
}

func TestStore_MissingFilesAreRefused(t *testing.T) {
	remove := func(t *testing.T, dir string) {
		for _, name := range []string{fileA, fileB} {
			must.NoError(t, os.Remove(filepath.Join(dir, name)))
		}
	}
	t.Run("the log has segments", func(t *testing.T) {
		dir := t.TempDir()
		meta := &Store{}
		w, err := raftwal.Open(dir, raftwal.WithMetaStore(meta))
		must.NoError(t, err)
		must.NoError(t, w.StoreLogs([]*raft.Log{{Index: 1, Term: 1}}))
		must.NoError(t, w.Close())
		must.NoError(t, meta.Close())
		remove(t, dir)
		_, err = (&Store{}).Load(dir)
		must.ErrorIs(t, err, ErrDamaged)
		must.StrContains(t, err.Error(), "log has segments")
	})
	t.Run("wal-meta.db says they moved", func(t *testing.T) {
		dir := walDirWithBolt(t)
		mustHoldLog(t, dir)
		remove(t, dir)
		_, err := (&Store{}).Load(dir)
		must.ErrorIs(t, err, ErrDamaged)
		must.StrContains(t, err.Error(), "moved")
	})
}

func TestStore_RecordLayout(t *testing.T) {
	rec := record{State: someState(2), Stable: map[string][]byte{"k": []byte("v")}}
	buf := encode(42, rec)
	must.Eq(t, magic[:], buf[:8])
	payload, err := json.Marshal(rec)
	must.NoError(t, err)
	must.Eq(t, payload, buf[headerLen:])
	// Every single flipped bit is caught.
	path := filepath.Join(t.TempDir(), "f")
	for i := range len(buf) * 8 {
		b := bytes.Clone(buf)
		b[i/8] ^= 1 << (i % 8)
		must.NoError(t, os.WriteFile(path, b, 0o600))
		f, err := os.Open(path)
		must.NoError(t, err)
		d, ok := readRecord(f)
		f.Close()
		if ok {
			t.Fatalf("bit %d flipped: read back seq %d", i, d.seq)
		}
	}
}

// The store under raft-wal, under Raft: a log and a term survive a restart.
func TestStore_UnderTheWAL(t *testing.T) {
	dir := t.TempDir()
	openWAL := func() (*raftwal.WAL, *Store) {
		meta := &Store{}
		w, err := raftwal.Open(dir, raftwal.WithMetaStore(meta))
		must.NoError(t, err)
		return w, meta
	}
	w, meta := openWAL()
	must.NoError(t, w.StoreLogs([]*raft.Log{{Index: 1, Term: 1, Data: []byte("a")}, {Index: 2, Term: 1, Data: []byte("b")}}))
	must.NoError(t, w.SetUint64([]byte("CurrentTerm"), 3))
	must.NoError(t, w.Close())
	must.NoError(t, meta.Close())

	w, meta = openWAL()
	defer meta.Close()
	defer w.Close()
	term, err := w.GetUint64([]byte("CurrentTerm"))
	must.NoError(t, err)
	must.Eq(t, 3, term)
	last, err := w.LastIndex()
	must.NoError(t, err)
	must.Eq(t, 2, last)
	var l raft.Log
	must.NoError(t, w.GetLog(2, &l))
	must.Eq(t, []byte("b"), l.Data)
}

// The write Raft waits for at every election, here and in raft-wal's own
// bolt store, on the same disk: run with -bench SetStable -benchtime 2s.
func BenchmarkSetStable(b *testing.B) {
	for _, impl := range []struct {
		name string
		new  func() types.MetaStore
	}{
		{"raftmeta", func() types.MetaStore { return &Store{} }},
		{"bolt", func() types.MetaStore { return &metadb.BoltMetaDB{} }},
	} {
		b.Run(impl.name, func(b *testing.B) {
			m := impl.new()
			if _, err := m.Load(b.TempDir()); err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			v := make([]byte, 8)
			for i := 0; b.Loop(); i++ {
				v[7] = byte(i)
				if err := m.SetStable([]byte("CurrentTerm"), v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// onDisk returns the stable keys of the newest valid record in dir's
// files, as a crash would leave them.
func onDisk(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	var newest *decoded
	for _, name := range []string{fileA, fileB} {
		f, err := os.Open(filepath.Join(dir, name))
		must.NoError(t, err)
		d, ok := readRecord(f)
		f.Close()
		if ok && (newest == nil || d.seq > newest.seq) {
			newest = d
		}
	}
	must.NotNil(t, newest, must.Sprint("no valid record on disk"))
	return newest.rec.Stable
}

var term, cand = []byte(VoteTermKey), []byte(VoteCandidateKey)

// votedFor4 opens a store in dir that holds a vote for server-a in term 4.
func votedFor4(t *testing.T, dir string) *Store {
	t.Helper()
	s := open(t, dir)
	must.NoError(t, s.SetStable(term, []byte{4}))
	must.NoError(t, s.SetStable(cand, []byte("server-a")))
	return s
}

func TestStore_VoteIsWrittenAsOnePair(t *testing.T) {
	dir := t.TempDir()
	s := votedFor4(t, dir)
	seq := s.seq

	// The next vote's term is read back at once but not yet written...
	must.NoError(t, s.SetStable(term, []byte{5}))
	v, err := s.GetStable(term)
	must.NoError(t, err)
	must.Eq(t, []byte{5}, v)
	must.Eq(t, seq, s.seq, must.Sprint("the vote's term was written on its own"))
	disk := onDisk(t, dir)
	must.Eq(t, []byte{4}, disk[VoteTermKey], must.Sprint("a crash here must leave the previous vote whole"))
	must.Eq(t, []byte("server-a"), disk[VoteCandidateKey])

	// ...and reaches the disk with its candidate, in one write.
	must.NoError(t, s.SetStable(cand, []byte("server-b")))
	must.Eq(t, seq+1, s.seq)
	disk = onDisk(t, dir)
	must.Eq(t, []byte{5}, disk[VoteTermKey])
	must.Eq(t, []byte("server-b"), disk[VoteCandidateKey])

	// A term whose candidate was never written is not on disk after a
	// restart.
	must.NoError(t, s.SetStable(term, []byte{6}))
	must.NoError(t, s.Close())
	v, err = open(t, dir).GetStable(term)
	must.NoError(t, err)
	must.Eq(t, []byte{5}, v)
}

func TestStore_FailedVoteDropsTheHeldTerm(t *testing.T) {
	s := votedFor4(t, t.TempDir())
	must.NoError(t, s.SetStable(term, []byte{5}))
	s.files[1-s.newest].Close()
	must.Error(t, s.SetStable(cand, []byte("server-a")))
	// Raft takes a vote's term beside a candidate for a vote cast; term 5
	// with server-a is not on disk, so it must not be read back, or the
	// server would grant server-a's request in term 5 again and, after a
	// restart, vote for another candidate in the same term.
	v, err := s.GetStable(term)
	must.NoError(t, err)
	must.Eq(t, []byte{4}, v)
}

func TestStore_LogStateBetweenTheHalvesOfAVote(t *testing.T) {
	dir := t.TempDir()
	s := votedFor4(t, dir)
	must.NoError(t, s.SetStable(term, []byte{5}))
	// raft-wal commits its segment list from its own goroutines, which
	// may land between the two halves of a vote: not with the new term.
	must.NoError(t, s.CommitState(someState(3)))
	disk := onDisk(t, dir)
	must.Eq(t, []byte{4}, disk[VoteTermKey])
	must.Eq(t, []byte("server-a"), disk[VoteCandidateKey])
	v, err := s.GetStable(term)
	must.NoError(t, err)
	must.Eq(t, []byte{5}, v)
	// Another key alone does not carry it either.
	must.NoError(t, s.SetStable([]byte("CurrentTerm"), []byte{5}))
	must.Eq(t, []byte{4}, onDisk(t, dir)[VoteTermKey])

	must.NoError(t, s.SetStable(cand, []byte("server-b")))
	disk = onDisk(t, dir)
	must.Eq(t, []byte{5}, disk[VoteTermKey])
	must.Eq(t, []byte("server-b"), disk[VoteCandidateKey])
	must.NoError(t, s.Close())
	_, st := reopen(t, dir)
	must.Eq(t, someState(3), st)
}

// recordingStable is a raft.StableStore that records the keys written.
type recordingStable struct {
	*raft.InmemStore
	mu   sync.Mutex
	keys []string
}

func (r *recordingStable) Set(k, v []byte) error {
	r.note(k)
	return r.InmemStore.Set(k, v)
}

func (r *recordingStable) SetUint64(k []byte, v uint64) error {
	r.note(k)
	return r.InmemStore.SetUint64(k, v)
}

func (r *recordingStable) note(k []byte) {
	r.mu.Lock()
	r.keys = append(r.keys, string(k))
	r.mu.Unlock()
}

func (r *recordingStable) written() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.keys)
}

// The store holds a vote's term until its candidate is written; that is
// only safe while Raft writes the candidate right after the term, every
// time. This runs elections in a real Raft cluster and checks the order.
func TestRaftWritesTheVoteAsAPair(t *testing.T) {
	const n = 3
	var (
		nodes   []*raft.Raft
		stables []*recordingStable
		trans   []*raft.InmemTransport
		servers []raft.Server
	)
	for i := range n {
		addr, tr := raft.NewInmemTransport(raft.ServerAddress(fmt.Sprintf("node-%d", i)))
		trans = append(trans, tr)
		servers = append(servers, raft.Server{ID: raft.ServerID(addr), Address: addr})
	}
	for i := range trans {
		for j := range trans {
			if i != j {
				trans[i].Connect(trans[j].LocalAddr(), trans[j])
			}
		}
	}
	for i, tr := range trans {
		conf := raft.DefaultConfig()
		conf.LocalID = servers[i].ID
		conf.HeartbeatTimeout = 50 * time.Millisecond
		conf.ElectionTimeout = 50 * time.Millisecond
		conf.LeaderLeaseTimeout = 50 * time.Millisecond
		conf.CommitTimeout = 5 * time.Millisecond
		conf.LogOutput = io.Discard
		st := &recordingStable{InmemStore: raft.NewInmemStore()}
		stables = append(stables, st)
		r, err := raft.NewRaft(conf, &raft.MockFSM{}, raft.NewInmemStore(), st, raft.NewInmemSnapshotStore(), tr)
		must.NoError(t, err)
		t.Cleanup(func() { r.Shutdown().Error() })
		nodes = append(nodes, r)
	}
	must.NoError(t, nodes[0].BootstrapCluster(raft.Configuration{Servers: servers}).Error())

	leader := func() *raft.Raft {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			for _, r := range nodes {
				if r.State() == raft.Leader {
					return r
				}
			}
			select {
			case <-nodes[0].LeaderCh():
			case <-time.After(10 * time.Millisecond):
			}
		}
		t.Fatal("no leader within 10s")
		return nil
	}
	// The first election, then transfers: each an election with a
	// candidate voting for itself and a voter granting its vote.
	// The leader found a moment ago may have lost leadership since, or
	// still be handing it over: those are tried again, anything else
	// fails the test.
	deadline := time.Now().Add(30 * time.Second)
	for done := 0; done < 4; {
		err := leader().LeadershipTransfer().Error()
		switch {
		case err == nil:
			done++
		case (errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipTransferInProgress)) && time.Now().Before(deadline):
		default:
			t.Fatalf("leadership transfer %d: %v", done+1, err)
		}
	}
	leader()

	pairs := 0
	for i, st := range stables {
		keys := st.written()
		for j, k := range keys {
			if k != VoteTermKey {
				continue
			}
			must.True(t, j+1 < len(keys) && keys[j+1] == VoteCandidateKey,
				must.Sprintf("node %d wrote %v: the vote's term is not followed by its candidate", i, keys))
			pairs++
		}
	}
	// Five elections: at least a candidate's and a voter's vote each.
	must.GreaterEq(t, 10, pairs)
}
