package client

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	keyVersion   = []byte("version")
)

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
	if err != nil {
		return nil, fmt.Errorf("client: open state db %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get(keyVersion); v != nil && string(v) != stateDBVersion {
			return fmt.Errorf("schema version %q, this client knows %q", v, stateDBVersion)
		}
		if err := meta.Put(keyVersion, []byte(stateDBVersion)); err != nil {
			return err
		}
		_, err = tx.CreateBucketIfNotExists(bucketAllocs)
		return err
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("client: init state db %s: %w", path, err)
	}
	return &stateDB{db: db}, nil
}

func (s *stateDB) close() error { return s.db.Close() }

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
