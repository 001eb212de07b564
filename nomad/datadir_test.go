package nomad

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"
)

// walDataEnd returns the only WAL segment and the length of its written
// part (segments are preallocated with zeros).
func walDataEnd(t *testing.T, dataDir string) (string, int64) {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dataDir, "raft", "wal", "*.wal"))
	must.NoError(t, err)
	must.Len(t, 1, segs)
	b, err := os.ReadFile(segs[0])
	must.NoError(t, err)
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	return segs[0], int64(end)
}

// stoppedServerDir runs a one-server cluster on a data dir, writes n
// nodes, stops it cleanly and returns the dir and its last applied index.
func stoppedServerDir(t *testing.T, n int) (string, uint64) {
	t.Helper()
	dir := t.TempDir()
	s := testServer(t, func(c *Config) { c.BootstrapExpect = 1; c.DataDir = dir })
	waitForLeader(t, s)
	for range n {
		registerNode(t, s, testNode("n"))
	}
	applied := s.raft.AppliedIndex()
	must.NoError(t, s.Shutdown(context.Background()))
	return dir, applied
}

func TestDataDir_TruncatedRaftLogRefused(t *testing.T) {
	t.Parallel()
	dir, applied := stoppedServerDir(t, 40)
	seg, end := walDataEnd(t, dir)
	// The WAL recovers a cut tail silently, as a torn write: only the
	// marker tells that applied entries are gone.
	must.NoError(t, os.Truncate(seg, end/2))

	c := TestConfig(t)
	c.BootstrapExpect = 1
	c.DataDir = dir
	_, err := NewServer(c)
	must.Error(t, err)
	must.True(t, errors.Is(err, ErrDataDirDamaged), must.Sprint(err))
	must.StrContains(t, err.Error(), "truncated")
	must.StrContains(t, err.Error(), "move "+dir+" aside")
	t.Logf("refused: %v (had applied %d)", err, applied)
}

func TestDataDir_CleanRestartAccepted(t *testing.T) {
	dir, applied := stoppedServerDir(t, 5)
	s := testServer(t, func(c *Config) { c.BootstrapExpect = 1; c.DataDir = dir })
	waitForLeader(t, s)
	must.GreaterEq(t, applied, s.raft.LastIndex())
}

func TestDataDir_OtherRegionRefused(t *testing.T) {
	dir, _ := stoppedServerDir(t, 1)
	c := TestConfig(t)
	c.BootstrapExpect = 1
	c.DataDir = dir
	c.Region = "west"
	_, err := NewServer(c)
	must.True(t, errors.Is(err, ErrDataDirDamaged), must.Sprint(err))
	must.StrContains(t, err.Error(), `belongs to a server of region "global"`)
}
