// Package raftmeta keeps the metadata of Raft's write-ahead log
// (hashicorp/raft-wal): the list of log segments, and Raft's stable store,
// which holds the current term and the vote.
//
// Raft writes its term and its vote at every election (once on the
// candidate before it asks for votes, twice more for its own vote, three
// times on each voter) and waits for each write to be on disk before it
// goes on, so these writes lie on the critical path of every change of
// leader. raft-wal's own store is a bolt database: each write is a
// transaction with two syncs. This store syncs once per write, overwriting
// a record in place, so nothing but data blocks has to reach the disk; and
// it writes a vote's two keys as one record (see VoteTermKey), so that an
// election costs the candidate two syncs and each voter two.
//
// Two files in the log's directory, meta-a and meta-b, each hold at most
// one record, at offset 0:
//
//	magic (8 bytes) | seq (uint64) | length (uint32) | crc32c (uint32) | payload
//
// The checksum covers seq, length and payload; the payload is JSON. A
// write goes to the file that does not hold the newest record, with the
// next seq, and is synced before it returns: a crash during it leaves the
// other file's record, the newest one acknowledged. Load takes the valid
// record with the highest seq. Files that exist but hold no valid record
// are an error, never an empty store: a server that forgot its vote could
// vote twice in one term.
//
// A directory that holds raft-wal's bolt metadata (wal-meta.db) and no
// meta files is imported once: its state and stable keys are written to
// meta-a; the bolt file is copied to wal-meta.db.imported, and wal-meta.db
// replaced by one that names a log segment in a codec raft-wal does not
// know. A build that reads only wal-meta.db then refuses to open the log
// instead of taking it for empty (raft-wal deletes the segment files its
// metadata does not list, and the server would forget its vote). There is
// no way back to such a build.
//
// Meta files that are missing while the log has segments, or while
// wal-meta.db says the metadata moved, are an error too.
package raftmeta

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/types"
	"github.com/roamhq/roam/internal/fsutil"
	bolt "go.etcd.io/bbolt"
)

const (
	fileA    = "meta-a"
	fileB    = "meta-b"
	lockFile = "meta.lock"
	// importedSuffix names the copy of raft-wal's bolt file kept once
	// imported.
	importedSuffix = ".imported"
	// movedKey, in the stable bucket of the wal-meta.db left after an
	// import, marks it as the file that sends older builds away.
	movedKey = "roam-raftmeta-moved-to"
	// refusedCodec is the codec of the one segment that file lists: not
	// one raft-wal knows, so it refuses to open the log.
	refusedCodec = 0x526f616d // "Roam"
	// segmentSuffix ends raft-wal's segment file names.
	segmentSuffix = ".wal"

	headerLen = 8 + 8 + 4 + 4
	// preallocate is the size each file starts with, so that the usual
	// write does not grow it (a write that grows a file must also sync
	// its size).
	preallocate = 4096
	// VoteTermKey and VoteCandidateKey are the keys under which
	// hashicorp/raft records a vote, writing the term and then, in the
	// same call and before it acts on the vote, the candidate. The term is
	// held in memory and written with the candidate, in one record and one
	// sync: a crash between the two calls leaves the vote before, as a
	// crash before the first would, and never a vote's term beside the
	// previous vote's candidate. TestRaftWritesTheVoteAsAPair keeps Raft
	// to that order.
	VoteTermKey      = "LastVoteTerm"
	VoteCandidateKey = "LastVoteCand"

	// maxPayload bounds what Load reads, so that a damaged length cannot
	// make it allocate without limit. The segment list grows by one entry
	// (about 200 bytes) per 64 MiB of log kept.
	maxPayload = 64 << 20
)

var (
	magic = [8]byte{'R', 'M', 'E', 'T', 'A', '0', '0', '1'}
	crc   = crc32.MakeTable(crc32.Castagnoli)

	// ErrDamaged is returned by Load when meta files exist but none holds
	// a valid record.
	ErrDamaged = errors.New("raft log metadata damaged")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("raft log metadata store closed")
	// errNotOpen is GetStable's answer before Load or after Close.
	errNotOpen = errors.New("raft log metadata store not open")
)

// record is what each write stores whole.
type record struct {
	State  types.PersistentState `json:"state"`
	Stable map[string][]byte     `json:"stable"`
}

// Store is a types.MetaStore for raft-wal. The zero value is ready for
// Load; raftwal.WithMetaStore passes it in.
type Store struct {
	// mu serialises writes, Load and Close, and guards everything below
	// but rec.
	mu     sync.Mutex
	dir    string
	lock   *os.File
	files  [2]*os.File
	newest int    // index into files of the newest record
	seq    uint64 // the newest record's seq
	// failed is set when a write's outcome on disk is unknown (a failed
	// write or sync): the store refuses every later write.
	failed error
	closed bool

	// recMu guards rec, the newest record on disk, which GetStable reads
	// while a write runs, and heldTerm.
	recMu sync.RWMutex
	rec   record
	// heldTerm is a vote's term not yet written: set by SetStable of
	// VoteTermKey, written and cleared by that of VoteCandidateKey.
	heldTerm []byte
}

var _ types.MetaStore = (*Store)(nil)

// Load opens (creating or importing if need be) the metadata in dir and
// returns the log's persisted state.
func (s *Store) Load(dir string) (types.PersistentState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return types.PersistentState{}, ErrClosed
	}
	if s.dir != "" {
		if s.dir != dir {
			return types.PersistentState{}, fmt.Errorf("raftmeta: already open in %s, asked for %s", s.dir, dir)
		}
		return s.snapshot().State, nil
	}
	if err := s.openLocked(dir); err != nil {
		s.closeFiles()
		return types.PersistentState{}, err
	}
	s.dir = dir
	return s.snapshot().State, nil
}

func (s *Store) openLocked(dir string) error {
	lock, err := lockDir(dir)
	if err != nil {
		return err
	}
	s.lock = lock

	pathA, pathB := filepath.Join(dir, fileA), filepath.Join(dir, fileB)
	// raft-wal's bolt file, read once: to import if this store has no
	// files yet, else to set aside once it is known to hold what the
	// store does.
	bolted := filepath.Join(dir, metadb.FileName)
	var fromBolt *record
	moved := false
	if exists(bolted) {
		rec, m, err := importBolt(bolted)
		if err != nil {
			return err
		}
		fromBolt, moved = &rec, m
	}
	if !exists(pathA) && !exists(pathB) {
		// A new directory, or one that raft-wal's bolt store kept until now.
		rec := record{Stable: map[string][]byte{}}
		switch {
		case moved:
			return fmt.Errorf("%w: %s and %s are missing from %s, and %s says the metadata moved to them",
				ErrDamaged, fileA, fileB, dir, metadb.FileName)
		case fromBolt != nil:
			rec = *fromBolt
		default:
			has, err := hasLog(dir)
			if err != nil {
				return err
			}
			if has {
				return fmt.Errorf("%w: %s and %s are missing from %s while its log has segments; "+
					"without them this server cannot know its Raft term and vote", ErrDamaged, fileA, fileB, dir)
			}
		}
		if err := createFile(pathA, encode(1, rec)); err != nil {
			return err
		}
	}
	// One file may be missing: the other was written whole before this
	// one was created.
	for _, path := range []string{pathA, pathB} {
		if !exists(path) {
			if err := createFile(path, nil); err != nil {
				return err
			}
		}
	}

	var best *decoded
	for i, path := range []string{pathA, pathB} {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("raftmeta: %w", err)
		}
		s.files[i] = f
		d, ok := readRecord(f)
		if !ok {
			continue // torn or damaged: the other file holds the newest
		}
		if best == nil || d.seq > best.seq {
			best, s.newest = d, i
		}
	}
	if best == nil {
		return fmt.Errorf("%w: neither %s nor %s in %s holds a valid record; "+
			"this server cannot know its Raft term and vote", ErrDamaged, fileA, fileB, dir)
	}
	s.seq = best.seq
	if best.rec.Stable == nil {
		best.rec.Stable = map[string][]byte{}
	}
	s.setRecord(best.rec)
	if fromBolt != nil && !moved {
		return setAsideImported(bolted, *fromBolt, best.rec)
	}
	return nil
}

// setAsideImported replaces raft-wal's bolt file, once its contents are in
// this store, with one that older builds refuse (see the package comment),
// keeping a copy. The original is still there when a run imported it and
// stopped before this, and then it holds what the store does. If it
// differs, a build that writes only the bolt file ran here after the
// import, and neither can be trusted to hold the latest term and vote.
func setAsideImported(bolted string, imported, current record) error {
	a, _ := json.Marshal(imported)
	b, _ := json.Marshal(current)
	if !bytes.Equal(a, b) {
		return fmt.Errorf("%w: %s and this store's files in %s disagree (a build that keeps the metadata "+
			"only in %s ran here); move one of them aside once you know which is newer",
			ErrDamaged, metadb.FileName, filepath.Dir(bolted), metadb.FileName)
	}
	original, err := os.ReadFile(bolted)
	if err != nil {
		return fmt.Errorf("raftmeta: %w", err)
	}
	if err := fsutil.WriteFileAtomic(bolted+importedSuffix, original, 0o600); err != nil {
		return fmt.Errorf("raftmeta: keep a copy of %s: %w", metadb.FileName, err)
	}
	return writeRefusal(bolted)
}

// writeRefusal replaces the bolt file at path, atomically, with one whose
// log state lists a single segment in a codec raft-wal does not know.
func writeRefusal(path string) error {
	tmp := path + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("raftmeta: %w", err)
	}
	state, _ := json.Marshal(types.PersistentState{Segments: []types.SegmentInfo{{Codec: refusedCodec}}})
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return fmt.Errorf("raftmeta: %w", err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket([]byte(metadb.MetaBucket))
		if err != nil {
			return err
		}
		if err := meta.Put([]byte(metadb.MetaKey), state); err != nil {
			return err
		}
		stable, err := tx.CreateBucket([]byte(metadb.StableBucket))
		if err != nil {
			return err
		}
		return stable.Put([]byte(movedKey), []byte(fileA+" and "+fileB))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("raftmeta: replace %s: %w", metadb.FileName, err)
	}
	return syncDir(filepath.Dir(path))
}

// hasLog reports whether dir holds raft-wal segment files.
func hasLog(dir string) (bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false, fmt.Errorf("raftmeta: %w", err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), segmentSuffix) {
			return true, nil
		}
	}
	return false, nil
}

// CommitState replaces the persisted log state. It returns once the new
// state is on disk. A vote's term held for its candidate is not written:
// raft-wal commits its state from its own goroutines, which may run
// between the two halves of a vote.
func (s *Store) CommitState(state types.PersistentState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.snapshot()
	rec.State = state
	return s.writeLocked(rec)
}

// GetStable returns the value stored under key, or nil; a vote's term
// held for its candidate (VoteTermKey) is returned too.
func (s *Store) GetStable(key []byte) ([]byte, error) {
	s.recMu.RLock()
	defer s.recMu.RUnlock()
	if s.rec.Stable == nil {
		return nil, errNotOpen
	}
	if string(key) == VoteTermKey && s.heldTerm != nil {
		return bytes.Clone(s.heldTerm), nil
	}
	v, ok := s.rec.Stable[string(key)]
	if !ok {
		return nil, nil
	}
	return bytes.Clone(v), nil
}

// SetStable stores value under key. It returns once the write is on
// disk, but for the vote's term (VoteTermKey), which is written with the
// vote's candidate. If that write fails, the held term is dropped: the
// vote was not cast.
func (s *Store) SetStable(key, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writableLocked(); err != nil {
		return err
	}
	if string(key) == VoteTermKey {
		s.recMu.Lock()
		s.heldTerm = bytes.Clone(value)
		s.recMu.Unlock()
		return nil
	}
	rec := s.snapshot()
	stable := maps.Clone(rec.Stable)
	stable[string(key)] = bytes.Clone(value)
	vote := string(key) == VoteCandidateKey
	if vote {
		s.recMu.RLock()
		if s.heldTerm != nil {
			stable[VoteTermKey] = s.heldTerm
		}
		s.recMu.RUnlock()
	}
	rec.Stable = stable
	err := s.writeLocked(rec)
	if vote {
		s.recMu.Lock()
		s.heldTerm = nil
		s.recMu.Unlock()
	}
	return err
}

// Close releases the files and the directory's lock. It is safe to call
// twice. A vote's term still held for its candidate is dropped: that vote
// was never cast.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.recMu.Lock()
	s.rec, s.heldTerm = record{}, nil
	s.recMu.Unlock()
	return s.closeFiles()
}

func (s *Store) closeFiles() error {
	var errs []error
	for i, f := range s.files {
		if f != nil {
			errs = append(errs, f.Close())
			s.files[i] = nil
		}
	}
	if s.lock != nil {
		errs = append(errs, s.lock.Close()) // closing drops the flock
		s.lock = nil
	}
	return errors.Join(errs...)
}

// writeLocked stores rec as the next record, in the file that does not
// hold the newest, and makes it the newest once it is on disk.
func (s *Store) writeLocked(rec record) error {
	if err := s.writableLocked(); err != nil {
		return err
	}
	next := 1 - s.newest
	f := s.files[next]
	if _, err := f.WriteAt(encode(s.seq+1, rec), 0); err != nil {
		s.failed = err
		return fmt.Errorf("raftmeta: write %s: %w", f.Name(), err)
	}
	if err := datasync(f); err != nil {
		s.failed = err
		return fmt.Errorf("raftmeta: sync %s: %w", f.Name(), err)
	}
	s.newest, s.seq = next, s.seq+1
	s.setRecord(rec)
	return nil
}

// writableLocked says why the store cannot take a write, if it cannot.
func (s *Store) writableLocked() error {
	switch {
	case s.closed:
		return ErrClosed
	case s.dir == "":
		return errors.New("raftmeta: write before Load")
	case s.failed != nil:
		return fmt.Errorf("raftmeta: an earlier write failed, so what is on disk is unknown: %w", s.failed)
	}
	return nil
}

func (s *Store) snapshot() record {
	s.recMu.RLock()
	defer s.recMu.RUnlock()
	return s.rec
}

func (s *Store) setRecord(rec record) {
	s.recMu.Lock()
	s.rec = rec
	s.recMu.Unlock()
}

// encode lays rec out as a record with seq.
func encode(seq uint64, rec record) []byte {
	payload, err := json.Marshal(rec)
	if err != nil {
		// Only maps of bytes, integers and times: cannot fail.
		panic(fmt.Sprintf("raftmeta: encode: %v", err))
	}
	buf := make([]byte, headerLen+len(payload))
	copy(buf, magic[:])
	binary.BigEndian.PutUint64(buf[8:], seq)
	binary.BigEndian.PutUint32(buf[16:], uint32(len(payload)))
	copy(buf[headerLen:], payload)
	sum := crc32.Checksum(buf[8:20], crc)
	sum = crc32.Update(sum, crc, payload)
	binary.BigEndian.PutUint32(buf[20:], sum)
	return buf
}

type decoded struct {
	seq uint64
	rec record
}

// readRecord reads the record at the start of f and reports whether it is
// whole and valid.
func readRecord(f *os.File) (*decoded, bool) {
	var hdr [headerLen]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil || !bytes.Equal(hdr[:8], magic[:]) {
		return nil, false
	}
	n := binary.BigEndian.Uint32(hdr[16:])
	if n > maxPayload {
		return nil, false
	}
	payload := make([]byte, n)
	if _, err := f.ReadAt(payload, headerLen); err != nil {
		return nil, false
	}
	sum := crc32.Update(crc32.Checksum(hdr[8:20], crc), crc, payload)
	if sum != binary.BigEndian.Uint32(hdr[20:]) {
		return nil, false
	}
	d := &decoded{seq: binary.BigEndian.Uint64(hdr[8:])}
	if err := json.Unmarshal(payload, &d.rec); err != nil {
		return nil, false
	}
	return d, true
}

// createFile creates path holding data, padded with zeros to preallocate
// bytes, atomically: a crash leaves either no file or the whole one.
func createFile(path string, data []byte) error {
	buf := make([]byte, max(len(data), preallocate))
	copy(buf, data)
	if err := fsutil.WriteFileAtomic(path, buf, 0o600); err != nil {
		return fmt.Errorf("raftmeta: create %s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("raftmeta: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("raftmeta: sync %s: %w", dir, err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, fs.ErrNotExist)
}

// importBolt reads raft-wal's bolt metadata file, and reports whether it
// is the one an import leaves behind.
func importBolt(path string) (rec record, moved bool, err error) {
	rec = record{Stable: map[string][]byte{}}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return rec, false, fmt.Errorf("raftmeta: open %s to import it: %w", path, err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket([]byte(metadb.MetaBucket)); b != nil {
			if raw := b.Get([]byte(metadb.MetaKey)); raw != nil {
				if err := json.Unmarshal(raw, &rec.State); err != nil {
					return fmt.Errorf("log state: %w", err)
				}
			}
		}
		b := tx.Bucket([]byte(metadb.StableBucket))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			rec.Stable[string(k)] = bytes.Clone(v)
			return nil
		})
	})
	if err != nil {
		return rec, false, fmt.Errorf("raftmeta: import %s: %w", path, err)
	}
	_, moved = rec.Stable[movedKey]
	return rec, moved, nil
}
