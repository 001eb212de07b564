package testutil_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/nomad"
	"github.com/roamhq/roam/structs"
	"github.com/roamhq/roam/testutil"
)

// The helpers with the constructor a caller outside the server package
// gives them: a TCP cluster that elects one leader and forwards a
// follower's write to it.
func TestCluster_ElectsAndForwards(t *testing.T) {
	listeners, addrs := testutil.TCPListeners(t, 3)
	servers := testutil.StartCluster(t, 3, func(i int) (*nomad.Server, error) {
		c := nomad.TestConfig(t)
		c.NodeName = fmt.Sprintf("%s-%d", c.NodeName, i)
		c.Listener = listeners[i]
		c.BootstrapExpect = 3
		c.RetryJoin = addrs
		return nomad.NewServer(c)
	})
	leader := testutil.WaitForLeader(t, servers...)
	fs := testutil.Followers(servers)
	must.Len(t, 2, fs)
	for _, f := range fs {
		must.NotEq(t, leader.ID(), f.ID())
	}
	var resp structs.NodeUpdateResponse
	err := fs[0].RPC("Node.Register", &structs.NodeRegisterRequest{Node: &structs.Node{
		ID: "5c5e3e2a-3b7c-4d57-9d3e-6f0f3b6f0b11", SecretID: "0f6d7c4e-2f8b-4f51-8a52-3c2e1c9f7a10",
		Name: "n1", Datacenter: "dc1", Status: structs.NodeStatusReady,
	}}, &resp)
	must.NoError(t, err)
	must.Positive(t, resp.Index)
}

// A lone server with LoneServerTimers leads, and the same cluster on the
// in-memory network elects and forwards as over TCP.
func TestMemNetwork_ElectsAndForwards(t *testing.T) {
	mem := testutil.NewMemNetwork(3)
	addrs := mem.Addrs()
	servers := testutil.StartMemServers(t, mem, func(i int, addr string) (*nomad.Server, error) {
		c := nomad.TestConfig(t)
		c.NodeName = fmt.Sprintf("%s-%d", c.NodeName, i)
		c.Listener = mem.Listen(t, addr)
		c.Dial = mem.Dialer(addr)
		c.RaftTransport = mem.RaftTransport(addr)
		c.BootstrapExpect = 3
		c.RetryJoin = addrs
		return nomad.NewServer(c)
	})
	testutil.WaitForLeader(t, servers...)
	f := testutil.Followers(servers)[0]
	var resp structs.NodeUpdateResponse
	err := f.RPC("Node.Register", &structs.NodeRegisterRequest{Node: &structs.Node{
		ID: "6d6e3e2a-3b7c-4d57-9d3e-6f0f3b6f0b12", SecretID: "1f6d7c4e-2f8b-4f51-8a52-3c2e1c9f7a11",
		Name: "n2", Datacenter: "dc1", Status: structs.NodeStatusReady,
	}}, &resp)
	must.NoError(t, err)
	must.Positive(t, resp.Index)

	// Cut the follower off both ways: its write no longer reaches the
	// leader, and after a heal it does again.
	mem.Isolate(f.Addr())
	err = f.RPC("Node.Register", &structs.NodeRegisterRequest{Node: &structs.Node{
		ID: "7e6e3e2a-3b7c-4d57-9d3e-6f0f3b6f0b13", SecretID: "2f6d7c4e-2f8b-4f51-8a52-3c2e1c9f7a12",
		Name: "n3", Datacenter: "dc1", Status: structs.NodeStatusReady,
	}}, &resp)
	must.Error(t, err)
	must.True(t, structs.IsRetryable(err), must.Sprint(err))
	mem.HealAll()
	// Healed, the same write goes through.
	testutil.WaitForLeader(t, servers...)
	err = f.RPC("Node.Register", &structs.NodeRegisterRequest{Node: &structs.Node{
		ID: "7e6e3e2a-3b7c-4d57-9d3e-6f0f3b6f0b13", SecretID: "2f6d7c4e-2f8b-4f51-8a52-3c2e1c9f7a12",
		Name: "n3", Datacenter: "dc1", Status: structs.NodeStatusReady,
	}}, &resp)
	must.NoError(t, err)
}

func TestLoneServerTimers_ElectAlone(t *testing.T) {
	c := nomad.TestConfig(t)
	testutil.LoneServerTimers(c.RaftConfig)
	must.NoError(t, c.Validate())
	s := testutil.Start(t, func() (*nomad.Server, error) { return nomad.NewServer(c) })
	must.Eq(t, s.ID(), testutil.WaitForLeader(t, s).ID())
}

func TestLogWriter_DropsAfterCleanup(t *testing.T) {
	var w *testutil.LogWriter
	t.Run("inner", func(t *testing.T) {
		w = testutil.NewLogWriter(t)
		n, err := w.Write([]byte("line\n"))
		must.NoError(t, err)
		must.Eq(t, 5, n)
	})
	// The inner test has ended: t.Log would panic, the writer drops.
	n, err := w.Write([]byte("late\n"))
	must.NoError(t, err)
	must.Eq(t, 5, n)
}

// BenchmarkLoneServerElection times a lone server from NewServer to
// leading, with nomad.TestConfig's cluster timers and with
// LoneServerTimers, interleaved so both see the same machine. Compare the
// two ns/op figures of one run.
func BenchmarkLoneServerElection(b *testing.B) {
	for _, tc := range []struct {
		name string
		lone bool
	}{{"test-timers", false}, {"lone-timers", true}} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				c := nomad.TestConfig(b)
				c.Logger = hclog.NewNullLogger()
				if tc.lone {
					testutil.LoneServerTimers(c.RaftConfig)
				}
				s, err := nomad.NewServer(c)
				must.NoError(b, err)
				testutil.WaitForLeader(b, s)
				b.StopTimer()
				must.NoError(b, s.Shutdown(context.Background()))
				b.StartTimer()
			}
		})
	}
}
