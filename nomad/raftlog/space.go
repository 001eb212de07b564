package raftlog

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	metrics "github.com/hashicorp/go-metrics"
	"golang.org/x/sys/unix"
)

// SegmentSize is the size of each raft-wal segment file, preallocated
// whole when the log rotates to it: the log needs that much free space
// before its current segment fills.
const SegmentSize = 64 << 20

// lowSpaceBytes is the free space below which the agent warns: room for
// one more segment and as much again for snapshots, which are written
// beside the log before the old ones are removed.
const lowSpaceBytes = 2 * SegmentSize

// rewarnEvery is how often the warning repeats while space stays low.
const rewarnEvery = 5 * time.Minute

// spaceState is what the watcher remembers between checks.
type spaceState struct {
	low      bool
	lastWarn time.Time
}

// spaceNotice is the watcher's decision for one check: the next state, and
// whether to warn (low now, and newly so or not warned for rewarnEvery) or
// to note that space is back.
func spaceNotice(st spaceState, free uint64, now time.Time) (next spaceState, warn, recovered bool) {
	low := free < lowSpaceBytes
	switch {
	case low && (!st.low || now.Sub(st.lastWarn) >= rewarnEvery):
		return spaceState{low: true, lastWarn: now}, true, false
	case low:
		return st, false, false
	case st.low:
		return spaceState{}, false, true
	}
	return spaceState{}, false, false
}

// WatchSpace checks the free space of dir's file system every interval
// until ctx ends, and warns while it is below what the log needs to go on
// (see lowSpaceBytes). The free bytes are the gauge
// roam.server.raft.data_dir_free_bytes.
func WatchSpace(ctx context.Context, dir string, every time.Duration, logger hclog.Logger) {
	var st spaceState
	check := func() {
		var fs unix.Statfs_t
		if err := unix.Statfs(dir, &fs); err != nil {
			logger.Warn("could not read the free space of the data dir", "dir", dir, "error", err)
			return
		}
		free := fs.Bavail * uint64(fs.Bsize)
		metrics.SetGauge([]string{"server", "raft", "data_dir_free_bytes"}, float32(free))
		var warn, recovered bool
		st, warn, recovered = spaceNotice(st, free, time.Now())
		switch {
		case warn:
			logger.Warn("the data dir is running out of space: a server that cannot write its raft log stops",
				"dir", dir, "free_mib", free>>20, "needed_mib", lowSpaceBytes>>20)
		case recovered:
			logger.Info("the data dir has room again", "dir", dir, "free_mib", free>>20)
		}
	}
	check()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			check()
		}
	}
}
