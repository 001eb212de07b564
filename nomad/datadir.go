package nomad

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/roamhq/roam/internal/fsutil"
)

// ErrDataDirDamaged is returned by NewServer for a data dir it will not
// trust: one that belongs to another region, or whose Raft log or
// snapshots fall short of what this server had already applied.
var ErrDataDirDamaged = errors.New("server data dir refused")

// dataDirMarkerFile, under <data_dir>/server, records what the data dir
// belongs to and how far its Raft state had reached.
const dataDirMarkerFile = "data-dir.json"

// dataDirRecordInterval is how often a running server records its applied
// index in the marker.
const dataDirRecordInterval = 5 * time.Second

// dataDirSpaceInterval is how often a server checks the free space of its
// data dir (see raftlog.WatchSpace).
const dataDirSpaceInterval = 10 * time.Second

// dataDirMarker is the content of the marker file.
type dataDirMarker struct {
	// Region is the region of the server that created the data dir.
	Region string `json:"region"`
	// ClusterID names the cluster this data dir's Raft state belongs to:
	// assigned by the first leader, learned by every other server from
	// the leader it joins.
	ClusterID string `json:"cluster_id,omitempty"`
	// AppliedIndex is a Raft index this server had applied, recorded while
	// it ran and when it stopped. Applied entries are in the local Raft
	// log or a local snapshot before they are applied, and Raft never
	// takes an applied entry back, so on the next start the log and the
	// snapshots together must reach at least this index; if they do not,
	// the log was truncated or lost.
	AppliedIndex uint64 `json:"applied_index"`
}

// dataDirState keeps the marker of one server's data dir.
type dataDirState struct {
	path string // the marker file

	// mu guards marker and serialises writes of the file.
	mu     sync.Mutex
	marker dataDirMarker
}

// openDataDir reads the marker under dataDir (a missing one is an empty
// marker) and refuses a data dir of another region.
func openDataDir(dataDir, region string) (*dataDirState, error) {
	d := &dataDirState{path: filepath.Join(dataDir, "server", dataDirMarkerFile)}
	buf, err := os.ReadFile(d.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		d.marker.Region = region
		return d, nil
	case err != nil:
		return nil, fmt.Errorf("%w: read %s: %w", ErrDataDirDamaged, d.path, err)
	}
	if err := json.Unmarshal(buf, &d.marker); err != nil {
		return nil, fmt.Errorf("%w: %s is not valid JSON (%w); the data dir is damaged: "+
			"move %s aside and start this server on an empty data dir so it rejoins the cluster",
			ErrDataDirDamaged, d.path, err, dataDir)
	}
	if d.marker.Region != region {
		return nil, fmt.Errorf("%w: data dir %s belongs to a server of region %q, and this server is configured for region %q: "+
			"point data_dir at this region's data, or move %s aside to start this server empty",
			ErrDataDirDamaged, dataDir, d.marker.Region, region, dataDir)
	}
	return d, nil
}

// checkRaft refuses Raft state that falls short of the recorded applied
// index: a truncated or missing log.
func (d *dataDirState) checkRaft(dataDir string, logs raft.LogStore, snaps raft.SnapshotStore) error {
	d.mu.Lock()
	want := d.marker.AppliedIndex
	d.mu.Unlock()
	if want == 0 {
		return nil
	}
	last, err := logs.LastIndex()
	if err != nil {
		return fmt.Errorf("%w: read the raft log's last index: %w", ErrDataDirDamaged, err)
	}
	have, from := last, "raft log"
	list, err := snaps.List()
	if err != nil {
		return fmt.Errorf("%w: list raft snapshots: %w", ErrDataDirDamaged, err)
	}
	for _, s := range list {
		if s.Index > have {
			have, from = s.Index, "raft snapshot "+s.ID
		}
	}
	if have < want {
		return fmt.Errorf("%w: the raft state in %s ends at index %d (%s), but this server had already applied index %d: "+
			"the raft log is truncated or damaged. Do not start this server on it. If the other servers are healthy, "+
			"move %s aside and start this server on an empty data dir so it rejoins and catches up from the leader; "+
			"if every server lost its data, start fresh servers and run 'roam operator snapshot restore'",
			ErrDataDirDamaged, filepath.Join(dataDir, "raft"), have, from, want, dataDir)
	}
	return nil
}

// clusterID returns the recorded cluster ID, or "".
func (d *dataDirState) clusterID() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.marker.ClusterID
}

// appliedIndex is the applied index the marker holds.
func (d *dataDirState) appliedIndex() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.marker.AppliedIndex
}

// setClusterID records id as the cluster this data dir belongs to.
func (d *dataDirState) setClusterID(id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.marker
	m.ClusterID = id
	return d.writeLocked(m)
}

// record stores applied in the marker if it moved forward.
func (d *dataDirState) record(applied uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if applied <= d.marker.AppliedIndex && fileExists(d.path) {
		return nil
	}
	m := d.marker
	m.AppliedIndex = max(applied, m.AppliedIndex)
	return d.writeLocked(m)
}

// writeLocked replaces the marker file with m.
func (d *dataDirState) writeLocked(m dataDirMarker) error {
	buf, err := json.Marshal(&m)
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(d.path, append(buf, '\n'), 0o600); err != nil {
		return fmt.Errorf("record data dir marker: %w", err)
	}
	d.marker = m
	return nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// recordAppliedLoop records the applied index every dataDirRecordInterval
// until shutdown.
func (s *Server) recordAppliedLoop() {
	ticker := time.NewTicker(dataDirRecordInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
			if err := s.dataDir.record(s.raft.AppliedIndex()); err != nil {
				s.logger.Warn("could not record the applied index in the data dir", "error", err)
			}
			s.syncClusterID()
		case <-s.shutdownCtx.Done():
			return
		}
	}
}
