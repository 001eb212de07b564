package nomad

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// waitClusterID waits until every server has the same cluster ID.
func waitClusterID(t *testing.T, servers ...*Server) string {
	t.Helper()
	var id string
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		id = servers[0].ClusterID()
		for _, s := range servers {
			if got := s.ClusterID(); got == "" || got != id {
				return fmt.Errorf("server %s has cluster id %q, server %s %q", s.ID(), got, servers[0].ID(), id)
			}
		}
		return nil
	}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))
	return id
}

func TestClusterID_ForeignDataDirIsFatal(t *testing.T) {
	t.Parallel()
	// Cluster A: one server, stopped; its data dir is what gets misused.
	aDir := t.TempDir()
	a := testServer(t, func(c *Config) { c.BootstrapExpect = 1; c.DataDir = aDir })
	waitForLeader(t, a)
	aCluster := waitClusterID(t, a)
	aID := a.ID()
	must.NoError(t, a.Shutdown(context.Background()))

	// Cluster B: three servers, with a cluster ID of their own.
	servers := testCluster(t, 3)
	bCluster := waitClusterID(t, servers...)
	must.NotEq(t, aCluster, bCluster)
	var addrs []string
	for _, s := range servers {
		addrs = append(addrs, s.Addr())
	}

	// A's data dir, started pointed at B.
	foreign := testServer(t, func(c *Config) {
		c.NodeName = "foreign"
		c.DataDir = aDir
		c.BootstrapExpect = 3
		c.RetryJoin = addrs
	})
	select {
	case err := <-foreign.Fatal():
		must.True(t, errors.Is(err, ErrClusterMismatch), must.Sprint(err))
		must.StrContains(t, err.Error(), aCluster)
		must.StrContains(t, err.Error(), bCluster)
		must.StrContains(t, err.Error(), "Move "+aDir+" aside")
		t.Logf("fatal: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("a server on another cluster's data dir was not told to stop")
	}
	// B never took it in.
	leader := waitForLeader(t, servers...)
	cfg, _, err := leader.raftConfiguration()
	must.NoError(t, err)
	for _, s := range cfg.Servers {
		must.NotEq(t, raft.ServerID(aID), s.ID)
	}
	for _, s := range servers {
		select {
		case err := <-s.Fatal():
			t.Fatalf("server %s of the healthy cluster was told to stop: %v", s.ID(), err)
		default:
		}
		_, seen := s.members.lastSeen(aID)
		must.False(t, seen, must.Sprintf("server %s counts the foreign server as a member", s.ID()))
	}

	// A new server with an empty data dir learns B's cluster ID.
	fresh := testServer(t, func(c *Config) {
		c.NodeName = "fresh"
		c.BootstrapExpect = 3
		c.RetryJoin = addrs
	})
	must.Eq(t, bCluster, waitClusterID(t, append(servers, fresh)...))
}

// The cluster ID lives in Raft state: a snapshot carries it, and servers
// rebuilt from that snapshot answer for the snapshot's cluster again, so
// the clients of that cluster recognise them.
func TestClusterID_RestoredWithSnapshot(t *testing.T) {
	t.Parallel()
	old := testServer(t, func(c *Config) { c.BootstrapExpect = 1 })
	waitForLeader(t, old)
	oldID := waitClusterID(t, old)
	file := downloadSnapshot(t, old)
	hdr, _, err := ReadSnapshotFile(bytes.NewReader(file), 0)
	must.NoError(t, err)
	must.Eq(t, 1, hdr.Counts["cluster_meta"])

	servers := testCluster(t, 3)
	newID := waitClusterID(t, servers...)
	must.NotEq(t, oldID, newID)
	_, err = uploadSnapshot(followers(servers)[0], file)
	must.NoError(t, err)
	must.Eq(t, oldID, waitClusterID(t, servers...))
	for _, s := range servers {
		must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
			if got := s.markerClusterID(); got != oldID {
				return fmt.Errorf("server %s marker has %q", s.ID(), got)
			}
			return nil
		}), wait.Timeout(15*time.Second), wait.Gap(50*time.Millisecond)))
	}
}
