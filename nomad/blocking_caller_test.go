package nomad

import (
	"context"
	"net/rpc"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// neverQuery is a Node.List that blocks for ten minutes: no write in a
// test reaches its index.
func neverQuery() *structs.NodeListRequest {
	return &structs.NodeListRequest{QueryOptions: structs.QueryOptions{
		MinQueryIndex: 1 << 40, MaxQueryTime: 10 * time.Minute,
	}}
}

func TestBlocking_EndsWhenInProcessCallerGoes(t *testing.T) {
	srv := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, srv)

	const n = 200
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, n)
	for range n {
		go func() {
			var reply structs.NodeListResponse
			errs <- srv.RPCContext(ctx, "Node.List", neverQuery(), &reply)
		}()
	}
	waitForBlockedQueries(t, n)
	cancel()
	waitForBlockedQueries(t, 0)
	for range n {
		// The error crossed net/rpc's wire form, which keeps the text.
		must.ErrorContains(t, <-errs, "caller is gone")
	}
}

func TestBlocking_EndsWhenConnectionCloses(t *testing.T) {
	t.Parallel()
	countBlockedQueriesAlone(t)
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.RPCMaxConnsPerClient = 0
	})
	waitForLeaderDuties(t, srv)

	// Each caller on a connection of its own, as pool connections or
	// clients' query streams are; its calls cannot be cancelled any other
	// way than by closing it.
	const n = 50
	var clients []*rpc.Client
	for range n {
		c := rpcClientOn(t, rawConn(t, srv, structs.RPCNomad))
		c.Go("Node.List", neverQuery(), &structs.NodeListResponse{}, make(chan *rpc.Call, 1))
		clients = append(clients, c)
	}
	// And on streams of one client session.
	session := yamuxSession(t, srv)
	for range n {
		stream, err := session.Open()
		must.NoError(t, err)
		_, err = stream.Write([]byte{structs.RPCNomad})
		must.NoError(t, err)
		c := rpcClientOn(t, stream)
		c.Go("Node.List", neverQuery(), &structs.NodeListResponse{}, make(chan *rpc.Call, 1))
	}
	waitForBlockedQueries(t, 2*n)

	for _, c := range clients {
		must.NoError(t, c.Close())
	}
	waitForBlockedQueries(t, n)
	must.NoError(t, session.Close())
	waitForBlockedQueries(t, 0)
}

func TestBlocking_ForwardingEndsWithCaller(t *testing.T) {
	t.Parallel()
	countBlockedQueriesAlone(t)
	// Steady Raft timers: a leader that loses its lease under load fails
	// the forwarded queries, which is not what this test is about.
	servers := testMemClusterWith(t, 3, func(c *Config) { withLongHeartbeats(c); withSteadyRaft(c) }).servers
	leader := waitForLeaderDuties(t, servers...)
	follower := followers(servers)[0]

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// Far more than the leader's per-address connection cap: they share
	// the follower's one connection to the leader.
	const n = 300
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			var reply structs.NodeListResponse
			errs <- follower.RPCContext(ctx, "Node.List", neverQuery(), &reply)
		})
	}
	// Forwarded: the leader holds them, each named for cancelling.
	waitForBlockedQueries(t, n)
	must.Eq(t, n, leader.queryCancels.len())
	cancel()
	// The leader lets go of every one, though their connection stays open.
	waitForBlockedQueries(t, 0)
	must.Eq(t, 0, leader.queryCancels.len())
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("forwarded queries did not return to their callers once they left")
	}
	for range n {
		must.ErrorContains(t, <-errs, "context canceled")
	}
}
