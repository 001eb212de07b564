package nomad

import (
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// A follower sends Raft nothing; keepRaftLinks gives it a connection to
// every other voter anyway, so that an election it starts does not wait
// for dials.
func TestKeepRaftLinks_FollowersHoldALinkToEachOther(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	fs := followers(servers)
	must.Len(t, 2, fs)
	linked := func() {
		t.Helper()
		for i, f := range fs {
			other := raft.ServerAddress(fs[1-i].advertise)
			must.Wait(t, wait.InitialSuccess(
				wait.BoolFunc(func() bool { return f.raftLayer.linked(other) }),
				wait.Timeout(5*time.Second), wait.Gap(10*time.Millisecond)),
				must.Sprintf("follower %s holds no raft connection to follower %s", f.config.NodeName, fs[1-i].config.NodeName))
		}
	}
	linked()
	// A follower may have dialed the other as a candidate in the first
	// election. Closed under the transport (as a failed request does),
	// the links come back all the same.
	for i, f := range fs {
		other := raft.ServerAddress(fs[1-i].advertise)
		f.raftLayer.linksMu.Lock()
		var conns []*raftConn
		for c := range f.raftLayer.links[other] {
			conns = append(conns, c)
		}
		f.raftLayer.linksMu.Unlock()
		for _, c := range conns {
			c.Close()
		}
		must.False(t, f.raftLayer.linked(other))
	}
	linked()
}

// The probe is a request of term 0, which Raft answers without acting on.
func TestKeepRaftLinks_ProbeChangesNothing(t *testing.T) {
	t.Parallel()
	servers := testCluster(t, 3)
	leader := waitForLeader(t, servers...)
	term := leader.raft.CurrentTerm()
	f := followers(servers)[0]
	for range 3 {
		must.NoError(t, f.probeRaftPeer(raft.Server{ID: raft.ServerID(leader.config.NodeID), Address: raft.ServerAddress(leader.advertise)}))
	}
	must.Eq(t, raft.Leader, leader.raft.State())
	must.Eq(t, term, leader.raft.CurrentTerm())
	must.Eq(t, leader, waitForLeader(t, servers...))
}

// A probe is answered by the receiving server's transport: a Raft still at
// term 0, which would take any AppendEntries of its own term for one from
// the leader, never sees it.
func TestLinkProbe_NeverReachesRaft(t *testing.T) {
	addrA, a := raft.NewInmemTransport("")
	addrB, inner := raft.NewInmemTransport("")
	b := newRaftTransport(inner, func(raft.RPC) error { return nil })
	a.Connect(addrB, inner)
	inner.Connect(addrA, a)
	conf := raft.DefaultConfig()
	conf.LocalID = "b"
	conf.LogOutput = io.Discard
	r, err := raft.NewRaft(conf, &raft.MockFSM{}, raft.NewInmemStore(), raft.NewInmemStore(), raft.NewInmemSnapshotStore(), b)
	must.NoError(t, err)
	t.Cleanup(func() { r.Shutdown().Error() })
	must.Eq(t, 0, r.CurrentTerm())

	var resp raft.AppendEntriesResponse
	must.NoError(t, a.AppendEntries("b", addrB, linkProbe("a", a.EncodePeer("a", addrA)), &resp))
	must.False(t, resp.Success)
	leader, id := r.LeaderWithID()
	must.Eq(t, "", leader, must.Sprintf("the probe made its sender %s the leader", id))
	must.Eq(t, 0, r.CurrentTerm())
	must.Eq(t, raft.Follower, r.State())
}
