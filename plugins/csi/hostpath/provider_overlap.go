package hostpath

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// The provider-wide overlap record. Plugin instances on different nodes
// that share one state directory are one simulated storage provider, whose
// promise is broken when any two of them run destructive calls at once —
// the per-process record cannot see that. Each instance, under an
// exclusive flock on provider.lock, adds its call to provider-inflight.json
// at the start and removes it at the end; a call that starts while the
// file lists another call of a live process bumps provider-overlaps.

// ProviderOverlapsFile is the path of the provider-wide overlap count in
// stateDir: a decimal count and a newline.
func ProviderOverlapsFile(stateDir string) string {
	return filepath.Join(stateDir, "provider-overlaps")
}

func providerInFlightFile(stateDir string) string {
	return filepath.Join(stateDir, "provider-inflight.json")
}

func providerLockFile(stateDir string) string {
	return filepath.Join(stateDir, "provider.lock")
}

// ReadProviderOverlaps reads the provider-wide overlap count in stateDir;
// a missing file reads as zero.
func ReadProviderOverlaps(stateDir string) (int64, error) {
	buf, err := os.ReadFile(ProviderOverlapsFile(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading provider overlap count: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(buf)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing provider overlap count: %w", err)
	}
	return n, nil
}

// providerCall is one destructive call in flight somewhere in the
// provider.
type providerCall struct {
	PID    int    `json:"pid"`
	NodeID string `json:"node_id"`
	Method string `json:"method"`
	Seq    uint64 `json:"seq"`
}

// providerRecord adds this process's destructive calls to the shared
// record.
type providerRecord struct {
	stateDir, nodeID string
	pid              int

	mu  sync.Mutex
	seq uint64
}

func newProviderRecord(stateDir, nodeID string) *providerRecord {
	return &providerRecord{stateDir: stateDir, nodeID: nodeID, pid: os.Getpid()}
}

// start records a call and reports the calls of other processes or of this
// one that were in flight at that moment. done removes it again.
func (r *providerRecord) start(method string) (others []providerCall, done func(), err error) {
	r.mu.Lock()
	r.seq++
	me := providerCall{PID: r.pid, NodeID: r.nodeID, Method: method, Seq: r.seq}
	r.mu.Unlock()
	err = r.locked(func(calls []providerCall) ([]providerCall, error) {
		others = calls
		if len(calls) > 0 {
			n, err := ReadProviderOverlaps(r.stateDir)
			if err != nil {
				return nil, err
			}
			if err := writeFileAtomic(ProviderOverlapsFile(r.stateDir), []byte(strconv.FormatInt(n+1, 10)+"\n"), true); err != nil {
				return nil, fmt.Errorf("writing provider overlap count: %w", err)
			}
		}
		return append(calls, me), nil
	})
	if err != nil {
		return nil, func() {}, err
	}
	return others, func() {
		_ = r.locked(func(calls []providerCall) ([]providerCall, error) {
			out := calls[:0]
			for _, c := range calls {
				if c != me {
					out = append(out, c)
				}
			}
			return out, nil
		})
	}, nil
}

// locked runs edit on the calls in flight, under the provider lock, and
// writes back what it returns. Calls of processes that no longer exist
// (killed mid-call) are dropped first: their calls are over.
func (r *providerRecord) locked(edit func([]providerCall) ([]providerCall, error)) error {
	f, err := os.OpenFile(providerLockFile(r.stateDir), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("opening provider lock: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("locking provider record: %w", err)
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)

	var calls []providerCall
	buf, err := os.ReadFile(providerInFlightFile(r.stateDir))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("reading provider calls in flight: %w", err)
	default:
		if err := json.Unmarshal(buf, &calls); err != nil {
			return fmt.Errorf("parsing provider calls in flight: %w", err)
		}
	}
	live := calls[:0]
	for _, c := range calls {
		if c.PID == r.pid || processAlive(c.PID) {
			live = append(live, c)
		}
	}
	out, err := edit(live)
	if err != nil {
		return err
	}
	if out == nil {
		out = []providerCall{}
	}
	enc, err := json.Marshal(out)
	if err != nil {
		return fmt.Errorf("encoding provider calls in flight: %w", err)
	}
	if err := writeFileAtomic(providerInFlightFile(r.stateDir), append(enc, '\n'), false); err != nil {
		return fmt.Errorf("writing provider calls in flight: %w", err)
	}
	return nil
}

// processAlive reports whether pid names a process (a stopped one counts:
// its call is still in flight).
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
