package hostpath

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

const (
	stateFile    = "state.json"
	lockFile     = "state.lock"
	volumesDir   = "volumes"
	snapshotsDir = "snapshots"

	// stateVersion is the format of state.json. Bump it when a change would
	// make an older plugin misread the file.
	stateVersion = 1
)

// state is everything plugin processes sharing a state dir agree on. The
// format is documented in doc.go.
type state struct {
	Version   int                  `json:"version"`
	Volumes   map[string]*volume   `json:"volumes"`
	Snapshots map[string]*snapshot `json:"snapshots"`
	Nodes     map[string]*node     `json:"nodes"`
}

// volume is a simulated network disk.
type volume struct {
	ID               string            `json:"id"`
	Name             string            `json:"name"`
	CapacityBytes    int64             `json:"capacity_bytes"`
	Parameters       map[string]string `json:"parameters,omitempty"`
	SourceSnapshotID string            `json:"source_snapshot_id,omitempty"`
	SourceVolumeID   string            `json:"source_volume_id,omitempty"`
	// Zone is the zone the volume lives in; empty is every zone.
	Zone      string    `json:"zone,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// snapshot is a point-in-time copy of a volume's data.
type snapshot struct {
	ID             string    `json:"id"`
	Name           string    `json:"name"`
	SourceVolumeID string    `json:"source_volume_id"`
	SizeBytes      int64     `json:"size_bytes"`
	CreatedAt      time.Time `json:"created_at"`
}

// node is a machine that a node plugin registered, with what is attached to,
// staged on and published on it.
type node struct {
	ID           string    `json:"id"`
	MaxVolumes   int64     `json:"max_volumes_per_node"`
	Zone         string    `json:"zone,omitempty"`
	RegisteredAt time.Time `json:"registered_at"`

	// Attachments maps volume ID to the controller-side attachment.
	Attachments map[string]*attachment `json:"attachments"`
	// Staged maps volume ID to its staging path on this node.
	Staged map[string]string `json:"staged"`
	// Published maps volume ID, then target path, to a node publication.
	Published map[string]map[string]*publication `json:"published"`
}

// attachment is a volume attached to a node under a device name.
type attachment struct {
	Device     string    `json:"device"`
	Readonly   bool      `json:"readonly"`
	AccessMode string    `json:"access_mode"`
	AttachedAt time.Time `json:"attached_at"`
}

// publication is a volume published at one target path on a node.
type publication struct {
	Readonly   bool   `json:"readonly"`
	AccessMode string `json:"access_mode"`
}

func newState() *state {
	return &state{
		Version:   stateVersion,
		Volumes:   map[string]*volume{},
		Snapshots: map[string]*snapshot{},
		Nodes:     map[string]*node{},
	}
}

// fillMaps makes every map non-nil so callers can write without checks.
func (s *state) fillMaps() {
	if s.Volumes == nil {
		s.Volumes = map[string]*volume{}
	}
	if s.Snapshots == nil {
		s.Snapshots = map[string]*snapshot{}
	}
	if s.Nodes == nil {
		s.Nodes = map[string]*node{}
	}
	for _, n := range s.Nodes {
		n.fillMaps()
	}
}

func (n *node) fillMaps() {
	if n.Attachments == nil {
		n.Attachments = map[string]*attachment{}
	}
	if n.Staged == nil {
		n.Staged = map[string]string{}
	}
	if n.Published == nil {
		n.Published = map[string]map[string]*publication{}
	}
}

// store reads and writes the state file shared by every plugin process using
// one state dir. Each operation opens the lock file afresh, so its flock
// excludes other goroutines of this process as well as other processes.
type store struct {
	dir string
}

func newStore(dir string) (*store, error) {
	for _, d := range []string{dir, filepath.Join(dir, volumesDir), filepath.Join(dir, snapshotsDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("creating state dir: %w", err)
		}
	}
	return &store{dir: dir}, nil
}

// view calls fn with the current state under a shared lock. fn must not
// keep or change the state.
func (s *store) view(fn func(*state) error) error {
	unlock, err := s.lock(syscall.LOCK_SH)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := s.read()
	if err != nil {
		return err
	}
	return fn(st)
}

// update calls fn with the current state under an exclusive lock and, if fn
// returns nil, writes the changed state back atomically. fn's error is
// returned unchanged.
func (s *store) update(fn func(*state) error) error {
	unlock, err := s.lock(syscall.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := s.read()
	if err != nil {
		return err
	}
	if err := fn(st); err != nil {
		return err
	}
	buf, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding state: %w", err)
	}
	return writeFileAtomic(filepath.Join(s.dir, stateFile), append(buf, '\n'), true)
}

// lock takes a flock of the given kind on the lock file and returns the
// function that releases it.
func (s *store) lock(how int) (func(), error) {
	f, err := os.OpenFile(filepath.Join(s.dir, lockFile), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening state lock: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking state: %w", err)
	}
	// Closing the file releases the lock.
	return func() { f.Close() }, nil
}

func (s *store) read() (*state, error) {
	buf, err := os.ReadFile(filepath.Join(s.dir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return newState(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading state: %w", err)
	}
	st := newState()
	if err := json.Unmarshal(buf, st); err != nil {
		return nil, fmt.Errorf("decoding state file %s: %w", filepath.Join(s.dir, stateFile), err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("state file version %d, this plugin understands %d", st.Version, stateVersion)
	}
	st.fillMaps()
	return st, nil
}

// writeFileAtomic replaces path with data: write a temporary file in the same
// directory, fsync it, rename it over path, fsync the directory. Readers
// never see a partial file. Without durable the fsyncs are skipped: the
// file still survives this process crashing (the kernel has it), only not
// the machine losing power.
func writeFileAtomic(path string, data []byte, durable bool) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("creating temporary file for %s: %w", path, err)
	}
	cleanup := func() { os.Remove(tmp.Name()) }
	// Other users' processes (a test reading the overlap file) may read it.
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		cleanup()
		return fmt.Errorf("setting mode of %s: %w", tmp.Name(), err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		cleanup()
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if durable {
		if err := tmp.Sync(); err != nil {
			tmp.Close()
			cleanup()
			return fmt.Errorf("syncing %s: %w", tmp.Name(), err)
		}
	}
	if err := tmp.Close(); err != nil {
		cleanup()
		return fmt.Errorf("closing %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		cleanup()
		return fmt.Errorf("replacing %s: %w", path, err)
	}
	if !durable {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("opening %s to sync: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}
