package client

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	bolt "go.etcd.io/bbolt"

	"github.com/roamhq/roam/client/driver/rawexec"
	"github.com/roamhq/roam/structs"
)

// The client's local state lives in <DataDir>/client/state.db (bbolt):
//
//	meta/version                   schema version
//	meta/last-contact              serverContact: the last heartbeat that
//	                               succeeded, for outageWatch after a restart
//	meta/csi-leader-term           the highest leader term seen on controller
//	                               calls (csiManager.admitTerm), 8 bytes
//	                               big-endian
//	allocs/<alloc ID>/alloc        the allocation as last received
//	allocs/<alloc ID>/state/<task> the task's localTaskState
//	allocs/<alloc ID>/handle/<task> the task's rawexec.HandleState, present
//	                               only while a started task's exit has not
//	                               been processed
//
// A task's state and its handle are written in one transaction, so after a
// crash the handle is there exactly when the exit still has to be handled.
// Values are msgpack, with the wire codec.
const stateDBVersion = "1"

var (
	bucketMeta   = []byte("meta")
	bucketAllocs = []byte("allocs")
	bucketState  = []byte("state")
	bucketHandle = []byte("handle")
	keyAlloc     = []byte("alloc")
	// keyLocalStop, in an allocation's bucket, is the reason the client
	// itself stopped the allocation (the outage stop), kept so that a
	// restart carries the stop out instead of running the tasks again.
	keyLocalStop = []byte("local-stop")
	// keyCSIMounts, in an allocation's bucket, is the CSI volumes mounted
	// for it, by volume name (see csiVolumeManager).
	keyCSIMounts = []byte("csi-mounts")
	keyVersion   = []byte("version")
	keyCSITerm   = []byte("csi-leader-term")
	keyContact   = []byte("last-contact")
)

// serverContact is the last heartbeat the servers answered: when it was
// sent, and the window they gave from then to freeing this node's claims.
type serverContact struct {
	Sent            time.Time
	FreeClaimsAfter time.Duration
}

// stateDB is the client's persistent view of its allocations.
type stateDB struct {
	db *bolt.DB
}

// localTaskState is what a task runner persists about its task.
type localTaskState struct {
	State   *structs.TaskState
	Restart restartTracker
}

// restoredAlloc is one allocation read back from the state DB.
type restoredAlloc struct {
	Alloc   *structs.Allocation
	Tasks   map[string]*localTaskState
	Handles map[string]*rawexec.HandleState
	// LocalStop is why the client stopped the allocation on its own;
	// empty when it did not.
	LocalStop string
}

// errStateDBVersion is returned for a state DB of another schema version:
// not damage, and not to be moved aside.
var errStateDBVersion = errors.New("state db schema version")

// errStateDBDamaged is returned for a state DB that bbolt cannot open, or
// whose pages fail its consistency check.
var errStateDBDamaged = errors.New("state db is damaged")

// openStateDBRecovering opens the state DB under dataDir; one that is
// damaged is moved aside (to state.db.damaged-<unix time>) and replaced by
// an empty one. movedTo and damage say where it went and why; both are
// empty when the DB opened as it was. A DB held by another process, or of
// another schema version, is an error, not damage.
func openStateDBRecovering(dataDir string) (db *stateDB, movedTo string, damage error, err error) {
	db, err = openStateDBChecked(dataDir)
	if err == nil {
		return db, "", nil, nil
	}
	if !errors.Is(err, errStateDBDamaged) {
		return nil, "", nil, err
	}
	path := filepath.Join(dataDir, "client", "state.db")
	movedTo = fmt.Sprintf("%s.damaged-%d", path, time.Now().Unix())
	if rerr := os.Rename(path, movedTo); rerr != nil {
		return nil, "", nil, fmt.Errorf("%w; moving it aside failed: %w", err, rerr)
	}
	db, oerr := openStateDB(dataDir)
	if oerr != nil {
		return nil, "", nil, fmt.Errorf("client: open a fresh state db after moving the damaged one to %s: %w", movedTo, oerr)
	}
	return db, movedTo, err, nil
}

// openStateDBChecked is openStateDB followed by a read of every bucket and
// key, in this goroutine. bbolt panics on some damaged pages, and a page
// past the end of a truncated file faults in the mmap; with
// SetPanicOnFault both are panics recovered here, and both are damage.
// (bbolt's own tx.Check runs in a goroutine of its own, where neither
// could be recovered.)
func openStateDBChecked(dataDir string) (db *stateDB, err error) {
	path := filepath.Join(dataDir, "client", "state.db")
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("client: %w: %s: %v", errStateDBDamaged, path, r)
			db = nil
		}
	}()
	db, err = openStateDB(dataDir)
	if err != nil {
		return nil, err
	}
	err = db.db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return walkBucket(b) })
	})
	if err != nil {
		db.close()
		return nil, fmt.Errorf("client: %w: %s: %w", errStateDBDamaged, path, err)
	}
	return db, nil
}

// walkBucket reads every key and value of b and its nested buckets, byte
// by byte, so that a fault in the mmap happens here and not later in a
// decode.
func walkBucket(b *bolt.Bucket) error {
	var sum byte
	return b.ForEach(func(k, v []byte) error {
		for _, c := range k {
			sum ^= c
		}
		for _, c := range v {
			sum ^= c
		}
		if v == nil {
			nested := b.Bucket(k)
			if nested == nil {
				return fmt.Errorf("key %q has no value and is not a bucket", k)
			}
			return walkBucket(nested)
		}
		return nil
	})
}

// openStateDB opens (creating) the state DB under dataDir. Another client
// holding the same file makes it fail after a short wait instead of
// blocking forever.
func openStateDB(dataDir string) (*stateDB, error) {
	dir := filepath.Join(dataDir, "client")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("client: create state dir: %w", err)
	}
	path := filepath.Join(dir, "state.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("client: open state db %s: held by another process: %w", path, err)
	}
	if err != nil {
		if boltDamage(err) {
			return nil, fmt.Errorf("client: %w: open %s: %w", errStateDBDamaged, path, err)
		}
		return nil, fmt.Errorf("client: open state db %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get(keyVersion); v != nil && string(v) != stateDBVersion {
			return fmt.Errorf("%w %q, this client knows %q", errStateDBVersion, v, stateDBVersion)
		}
		if err := meta.Put(keyVersion, []byte(stateDBVersion)); err != nil {
			return err
		}
		_, err = tx.CreateBucketIfNotExists(bucketAllocs)
		return err
	})
	if err != nil {
		db.Close()
		if !errors.Is(err, errStateDBVersion) {
			err = fmt.Errorf("%w: %w", errStateDBDamaged, err)
		}
		return nil, fmt.Errorf("client: init state db %s: %w", path, err)
	}
	return &stateDB{db: db}, nil
}

func (s *stateDB) close() error { return s.db.Close() }

// meta reads key of the meta bucket; nil when it is not there. The value
// is a copy, valid after the transaction.
func (s *stateDB) meta(key []byte) ([]byte, error) {
	var v []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketMeta); b != nil {
			v = bytes.Clone(b.Get(key))
		}
		return nil
	})
	return v, err
}

// putMeta writes key of the meta bucket.
func (s *stateDB) putMeta(key, v []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		return b.Put(key, v)
	})
}

// contact reads the last heartbeat recorded; zero when none is.
func (s *stateDB) contact() (serverContact, error) {
	var rec serverContact
	v, err := s.meta(keyContact)
	if err != nil || v == nil {
		return rec, err
	}
	if err := codec.NewDecoderBytes(v, structs.MsgpackHandle).Decode(&rec); err != nil {
		return rec, fmt.Errorf("state db: decode %s: %w", keyContact, err)
	}
	return rec, nil
}

// putContact records the last heartbeat the servers answered.
func (s *stateDB) putContact(rec serverContact) error {
	buf, err := encodeMsgpack(rec)
	if err != nil {
		return fmt.Errorf("state db: encode %s: %w", keyContact, err)
	}
	return s.putMeta(keyContact, buf)
}

// leaderTerm reads the highest controller-call leader term recorded; zero
// when none is.
func (s *stateDB) leaderTerm() (uint64, error) {
	v, err := s.meta(keyCSITerm)
	if err != nil || v == nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("state db: %s is %d bytes, want 8", keyCSITerm, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// putLeaderTerm records the highest controller-call leader term seen.
func (s *stateDB) putLeaderTerm(term uint64) error {
	return s.putMeta(keyCSITerm, binary.BigEndian.AppendUint64(nil, term))
}

// boltDamage reports whether bolt.Open failed on the file's contents, as
// opposed to permissions or a lock.
func boltDamage(err error) bool {
	return errors.Is(err, bolt.ErrInvalid) || errors.Is(err, bolt.ErrVersionMismatch) ||
		errors.Is(err, bolt.ErrChecksum) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.Contains(err.Error(), "file size too small")
}

func encodeMsgpack(v any) ([]byte, error) {
	var buf []byte
	err := codec.NewEncoderBytes(&buf, structs.MsgpackHandle).Encode(v)
	return buf, err
}

// allocBucket returns the allocation's bucket, creating it and its
// sub-buckets.
func allocBucket(tx *bolt.Tx, allocID string) (*bolt.Bucket, error) {
	b, err := tx.Bucket(bucketAllocs).CreateBucketIfNotExists([]byte(allocID))
	if err != nil {
		return nil, err
	}
	for _, name := range [][]byte{bucketState, bucketHandle} {
		if _, err := b.CreateBucketIfNotExists(name); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// putAlloc records the allocation as received from the servers.
func (s *stateDB) putAlloc(alloc *structs.Allocation) error {
	buf, err := encodeMsgpack(alloc)
	if err != nil {
		return fmt.Errorf("state db: encode alloc %s: %w", alloc.ID, err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		b, err := allocBucket(tx, alloc.ID)
		if err != nil {
			return err
		}
		return b.Put(keyAlloc, buf)
	})
	if err != nil {
		return fmt.Errorf("state db: put alloc %s: %w", alloc.ID, err)
	}
	return nil
}

// putLocalStop records that the client stopped the allocation on its own,
// and why. It is never cleared: a stopped allocation does not run again
// here, and its record goes with the allocation's bucket. An allocation
// already forgotten (deleteAlloc) is left forgotten: a bucket made here
// would hold no allocation record.
func (s *stateDB) putLocalStop(allocID, reason string) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketAllocs).Bucket([]byte(allocID))
		if b == nil {
			return nil
		}
		return b.Put(keyLocalStop, []byte(reason))
	})
	if err != nil {
		return fmt.Errorf("state db: put local stop %s: %w", allocID, err)
	}
	return nil
}

// updateCSIMounts changes the allocation's recorded CSI mounts with fn.
// An allocation already forgotten is left forgotten, as in putLocalStop.
func (s *stateDB) updateCSIMounts(allocID string, fn func(map[string]*csiAllocMount)) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketAllocs).Bucket([]byte(allocID))
		if b == nil {
			return nil
		}
		mounts := map[string]*csiAllocMount{}
		if raw := b.Get(keyCSIMounts); raw != nil {
			if err := structs.Decode(raw, &mounts); err != nil {
				return fmt.Errorf("decode csi mounts: %w", err)
			}
		}
		fn(mounts)
		if len(mounts) == 0 {
			return b.Delete(keyCSIMounts)
		}
		buf, err := encodeMsgpack(mounts)
		if err != nil {
			return err
		}
		return b.Put(keyCSIMounts, buf)
	})
	if err != nil {
		return fmt.Errorf("state db: csi mounts of %s: %w", allocID, err)
	}
	return nil
}

// putCSIMount records that a volume is mounted for an allocation.
func (s *stateDB) putCSIMount(allocID, name string, mnt *csiAllocMount) error {
	return s.updateCSIMounts(allocID, func(m map[string]*csiAllocMount) { m[name] = mnt })
}

// deleteCSIMount forgets one of an allocation's mounts.
func (s *stateDB) deleteCSIMount(allocID, name string) error {
	return s.updateCSIMounts(allocID, func(m map[string]*csiAllocMount) { delete(m, name) })
}

// csiMounts reads back every allocation's recorded mounts. A record that
// cannot be decoded is reported in errs and skipped.
func (s *stateDB) csiMounts() (mounts map[string]map[string]*csiAllocMount, errs []error) {
	mounts = map[string]map[string]*csiAllocMount{}
	_ = s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketAllocs).ForEach(func(k, v []byte) error {
			if v != nil {
				return nil // not a bucket
			}
			raw := tx.Bucket(bucketAllocs).Bucket(k).Get(keyCSIMounts)
			if raw == nil {
				return nil
			}
			m := map[string]*csiAllocMount{}
			if err := structs.Decode(raw, &m); err != nil {
				errs = append(errs, fmt.Errorf("state db: csi mounts of %s: %w", k, err))
				return nil
			}
			mounts[string(k)] = m
			return nil
		})
	})
	return mounts, errs
}

// putTask records a task's state and, in the same transaction, its handle:
// handle nil removes a stored one.
func (s *stateDB) putTask(allocID, task string, st *localTaskState, handle *rawexec.HandleState) error {
	stBuf, err := encodeMsgpack(st)
	if err != nil {
		return fmt.Errorf("state db: encode task %s/%s: %w", allocID, task, err)
	}
	var hBuf []byte
	if handle != nil {
		if hBuf, err = encodeMsgpack(handle); err != nil {
			return fmt.Errorf("state db: encode handle %s/%s: %w", allocID, task, err)
		}
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		b, err := allocBucket(tx, allocID)
		if err != nil {
			return err
		}
		if err := b.Bucket(bucketState).Put([]byte(task), stBuf); err != nil {
			return err
		}
		if hBuf == nil {
			return b.Bucket(bucketHandle).Delete([]byte(task))
		}
		return b.Bucket(bucketHandle).Put([]byte(task), hBuf)
	})
	if err != nil {
		return fmt.Errorf("state db: put task %s/%s: %w", allocID, task, err)
	}
	return nil
}

// deleteAlloc forgets an allocation and everything about its tasks.
func (s *stateDB) deleteAlloc(allocID string) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		err := tx.Bucket(bucketAllocs).DeleteBucket([]byte(allocID))
		if errors.Is(err, bolt.ErrBucketNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("state db: delete alloc %s: %w", allocID, err)
	}
	return nil
}

// loadAllocs reads back every allocation. An entry that cannot be decoded
// is reported in errs and skipped, so one bad record does not keep the
// client from re-attaching to the rest.
func (s *stateDB) loadAllocs() (allocs []*restoredAlloc, errs []error) {
	_ = s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketAllocs).ForEach(func(k, v []byte) error {
			if v != nil {
				return nil // not a bucket
			}
			id := string(k)
			b := tx.Bucket(bucketAllocs).Bucket(k)
			ra, err := decodeAllocBucket(b)
			if err != nil {
				errs = append(errs, fmt.Errorf("state db: alloc %s: %w", id, err))
				return nil
			}
			allocs = append(allocs, ra)
			return nil
		})
	})
	return allocs, errs
}

func decodeAllocBucket(b *bolt.Bucket) (*restoredAlloc, error) {
	raw := b.Get(keyAlloc)
	if raw == nil {
		return nil, errors.New("no allocation record")
	}
	ra := &restoredAlloc{
		Alloc:   new(structs.Allocation),
		Tasks:   make(map[string]*localTaskState),
		Handles: make(map[string]*rawexec.HandleState),
	}
	if err := structs.Decode(raw, ra.Alloc); err != nil {
		return nil, fmt.Errorf("decode allocation: %w", err)
	}
	ra.LocalStop = string(b.Get(keyLocalStop))
	var errs []string
	if sb := b.Bucket(bucketState); sb != nil {
		_ = sb.ForEach(func(k, v []byte) error {
			st := new(localTaskState)
			if err := structs.Decode(v, st); err != nil {
				errs = append(errs, fmt.Sprintf("task %s state: %v", k, err))
				return nil
			}
			ra.Tasks[string(k)] = st
			return nil
		})
	}
	if hb := b.Bucket(bucketHandle); hb != nil {
		_ = hb.ForEach(func(k, v []byte) error {
			h := new(rawexec.HandleState)
			if err := structs.Decode(v, h); err != nil {
				errs = append(errs, fmt.Sprintf("task %s handle: %v", k, err))
				return nil
			}
			ra.Handles[string(k)] = h
			return nil
		})
	}
	if len(errs) > 0 {
		return nil, errors.New(strings.Join(errs, "; "))
	}
	return ra, nil
}
