package client

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/roamhq/roam/internal/fsutil"
)

// clusterGuard remembers which cluster placed this node's allocations
// (<data_dir>/client/cluster-id) and tells the allocation watcher to hold
// them while the servers answer for another cluster: servers rebuilt on
// empty disks, before their state is restored, list no allocations for
// this node, and reconciling against that list would stop every task.
type clusterGuard struct {
	path   string
	logger hclog.Logger
	// hasAllocs reports whether this client holds any allocation, running
	// or finished: a finished one whose end the servers have not heard of
	// would be run again by a cluster that never knew it ended.
	hasAllocs func() bool

	// mu guards known and holdingFor.
	mu         sync.Mutex
	known      string
	holdingFor string
}

func newClusterGuard(dataDir string, logger hclog.Logger, hasAllocs func() bool) (*clusterGuard, error) {
	g := &clusterGuard{path: filepath.Join(dataDir, "client", "cluster-id"), logger: logger, hasAllocs: hasAllocs}
	buf, err := os.ReadFile(g.path)
	switch {
	case err == nil:
		g.known = strings.TrimSpace(string(buf))
	case errors.Is(err, os.ErrNotExist):
	default:
		return nil, fmt.Errorf("client: read %s: %w", g.path, err)
	}
	return g, nil
}

// hold reports whether the allocation list of a cluster with ID observed
// must be left unreconciled. A first cluster ID, or a new one while this
// client holds no allocation at all, is adopted.
func (g *clusterGuard) hold(observed string) bool {
	if observed == "" {
		return false // servers that do not have an ID yet
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case observed == g.known:
		if g.holdingFor != "" {
			g.logger.Info("servers answer for this node's cluster again; reconciling allocations", "cluster_id", observed)
			g.holdingFor = ""
		}
		return false
	case g.known == "" || !g.hasAllocs():
		if err := fsutil.WriteFileAtomic(g.path, []byte(observed+"\n"), 0o600); err != nil {
			g.logger.Warn("could not record the cluster id", "error", err)
		}
		if g.known != "" {
			g.logger.Info("joined another cluster; this client held no allocations", "cluster_id", observed, "previous_cluster_id", g.known)
		}
		g.known, g.holdingFor = observed, ""
		return false
	}
	if g.holdingFor != observed {
		g.logger.Warn("servers answer for another cluster than the one that placed this node's allocations; "+
			"holding them (stopping and starting none) until that cluster's state is restored. "+
			"To join the new cluster for good, stop this client and remove "+g.path,
			"cluster_id", observed, "allocations_cluster_id", g.known)
		g.holdingFor = observed
	}
	return true
}
