package nomad

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// countingBlockedQueries is held by a parallel test that counts blocked
// queries: the count is the whole process's, and two such tests at once
// each saw the other's (400 blocked queries, want 300).
var countingBlockedQueries sync.Mutex

// countBlockedQueriesAlone makes t the only parallel test counting
// blocked queries until it ends.
func countBlockedQueriesAlone(t *testing.T) {
	t.Helper()
	countingBlockedQueries.Lock()
	t.Cleanup(countingBlockedQueries.Unlock)
}

// blockedQueries counts goroutines parked in a blocking query, waiting on
// its watch set.
func blockedQueries() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "(*Server).blockingRPC") && strings.Contains(g, "WatchSet.WatchCtx") {
			count++
		}
	}
	return count
}

// waitForBlockedQueries waits until n queries are parked on their watch
// sets, so a test can write knowing the query is already waiting.
//
// Each look stops the world to dump every goroutine's stack, hundreds of
// them in the forwarding tests: CPU that Raft needs to keep its leader
// under -race on a loaded machine. Look every 50 ms, not every 5; the
// condition and the limit are the same.
func waitForBlockedQueries(t *testing.T, n int) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			if got := blockedQueries(); got != n {
				return fmt.Errorf("%d blocked queries, want %d", got, n)
			}
			return nil
		}),
		wait.Timeout(5*time.Second),
		wait.Gap(50*time.Millisecond),
	))
}

type listResult struct {
	resp    structs.NodeListResponse
	err     error
	elapsed time.Duration
}

// listAsync runs Node.List on s in a goroutine.
func listAsync(s *Server, opts structs.QueryOptions) <-chan listResult {
	ch := make(chan listResult, 1)
	go func() {
		var r listResult
		start := time.Now()
		r.err = s.RPC("Node.List", &structs.NodeListRequest{QueryOptions: opts}, &r.resp)
		r.elapsed = time.Since(start)
		ch <- r
	}()
	return ch
}

func TestBlocking_NodeListWakesOnWrite(t *testing.T) {
	srv := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, srv)
	registerNodeRetry(t, srv, testNode("first"))

	var now structs.NodeListResponse
	must.NoError(t, srv.RPC("Node.List", &structs.NodeListRequest{}, &now))
	must.Positive(t, now.Index)
	must.Len(t, 1, now.Nodes)

	const maxWait = 5 * time.Second
	result := listAsync(srv, structs.QueryOptions{MinQueryIndex: now.Index, MaxQueryTime: maxWait})
	waitForBlockedQueries(t, 1)
	select {
	case r := <-result:
		t.Fatalf("query returned before any write: index %d, err %v", r.resp.Index, r.err)
	default:
	}

	second := testNode("second")
	registered := make(chan *structs.NodeUpdateResponse, 1)
	go func() {
		var resp structs.NodeUpdateResponse
		if err := srv.RPC("Node.Register", &structs.NodeRegisterRequest{Node: second}, &resp); err != nil {
			t.Errorf("register: %v", err)
		}
		registered <- &resp
	}()

	var r listResult
	select {
	case r = <-result:
	case <-time.After(2 * maxWait):
		t.Fatal("blocking query never returned")
	}
	reg := <-registered
	must.NoError(t, r.err)
	must.Greater(t, now.Index, r.resp.Index)
	must.Eq(t, reg.Index, r.resp.Index)
	must.Len(t, 2, r.resp.Nodes)
	ids := []string{r.resp.Nodes[0].ID, r.resp.Nodes[1].ID}
	must.SliceContains(t, ids, second.ID)
	// Woken by the write, not by its own deadline.
	must.Less(t, maxWait, r.elapsed)
	must.True(t, r.resp.KnownLeader)
}

func TestBlocking_NodeListTimesOut(t *testing.T) {
	t.Parallel()
	srv := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, srv)
	const maxWait = 100 * time.Millisecond

	// Nothing written yet: the index is still never 0, which would turn a
	// client's blocking loop into a busy one.
	var empty structs.NodeListResponse
	must.NoError(t, srv.RPC("Node.List", &structs.NodeListRequest{}, &empty))
	must.Eq(t, uint64(1), empty.Index)
	must.SliceEmpty(t, empty.Nodes)

	r := <-listAsync(srv, structs.QueryOptions{MinQueryIndex: empty.Index, MaxQueryTime: maxWait})
	must.NoError(t, r.err)
	must.Eq(t, empty.Index, r.resp.Index)
	must.GreaterEq(t, maxWait, r.elapsed)

	// The same once something is written.
	registerNodeRetry(t, srv, testNode("only"))
	var now structs.NodeListResponse
	must.NoError(t, srv.RPC("Node.List", &structs.NodeListRequest{}, &now))
	must.Greater(t, uint64(1), now.Index)

	r = <-listAsync(srv, structs.QueryOptions{MinQueryIndex: now.Index, MaxQueryTime: maxWait})
	must.NoError(t, r.err)
	must.Eq(t, now.Index, r.resp.Index)
	must.Len(t, 1, r.resp.Nodes)
	must.GreaterEq(t, maxWait, r.elapsed)

	// A MinQueryIndex behind the current index answers at once.
	r = <-listAsync(srv, structs.QueryOptions{MinQueryIndex: now.Index - 1, MaxQueryTime: time.Minute})
	must.NoError(t, r.err)
	must.Eq(t, now.Index, r.resp.Index)
	must.Less(t, time.Minute, r.elapsed)
}

func TestBlocking_NodeListPrefix(t *testing.T) {
	srv := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, srv)
	a, b := testNode("a"), testNode("b")
	a.ID = "aaaaaaaa" + a.ID[8:]
	b.ID = "bbbbbbbb" + b.ID[8:]
	registerNodeRetry(t, srv, a)
	registerNodeRetry(t, srv, b)

	var resp structs.NodeListResponse
	must.NoError(t, srv.RPC("Node.List", &structs.NodeListRequest{QueryOptions: structs.QueryOptions{Prefix: "aaaa"}}, &resp))
	must.Len(t, 1, resp.Nodes)
	must.Eq(t, a.ID, resp.Nodes[0].ID)

	must.NoError(t, srv.RPC("Node.List", &structs.NodeListRequest{QueryOptions: structs.QueryOptions{Prefix: "cccc"}}, &resp))
	must.SliceEmpty(t, resp.Nodes)
	must.Positive(t, resp.Index)
}

func TestBlocking_GetNode(t *testing.T) {
	srv := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, srv)

	getNode := func(opts structs.QueryOptions, id string) (*structs.SingleNodeResponse, error) {
		var resp structs.SingleNodeResponse
		err := srv.RPC("Node.GetNode", &structs.NodeSpecificRequest{NodeID: id, QueryOptions: opts}, &resp)
		return &resp, err
	}

	// Before anything is written.
	resp, err := getNode(structs.QueryOptions{}, "no-such-node")
	must.NoError(t, err)
	must.Nil(t, resp.Node)
	must.GreaterEq(t, uint64(1), resp.Index)

	node := testNode("known")
	reg := registerNodeRetry(t, srv, node)

	resp, err = getNode(structs.QueryOptions{}, "no-such-node")
	must.NoError(t, err)
	must.Nil(t, resp.Node)
	must.GreaterEq(t, uint64(1), resp.Index)
	must.Eq(t, reg.Index, resp.Index)

	// Reads hide the secret from everyone but the node itself.
	resp, err = getNode(structs.QueryOptions{}, node.ID)
	must.NoError(t, err)
	must.NotNil(t, resp.Node)
	must.Eq(t, "", resp.Node.SecretID)
	must.Eq(t, reg.Index, resp.Index)
	resp, err = getNode(structs.QueryOptions{AuthToken: "wrong"}, node.ID)
	must.NoError(t, err)
	must.Eq(t, "", resp.Node.SecretID)
	resp, err = getNode(structs.QueryOptions{AuthToken: node.SecretID}, node.ID)
	must.NoError(t, err)
	must.Eq(t, node.SecretID, resp.Node.SecretID)

	// A blocking read of a node that does not exist yet wakes when it is
	// registered.
	later := testNode("later")
	type result struct {
		resp *structs.SingleNodeResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		r, err := getNode(structs.QueryOptions{MinQueryIndex: reg.Index, MaxQueryTime: 5 * time.Second}, later.ID)
		done <- result{r, err}
	}()
	waitForBlockedQueries(t, 1)
	laterReg := registerNodeRetry(t, srv, later)
	select {
	case r := <-done:
		must.NoError(t, r.err)
		must.NotNil(t, r.resp.Node)
		must.Eq(t, later.ID, r.resp.Node.ID)
		must.Eq(t, laterReg.Index, r.resp.Index)
	case <-time.After(10 * time.Second):
		t.Fatal("blocking GetNode never returned")
	}
}

func TestBlocking_StaleReadOnFollower(t *testing.T) {
	t.Parallel()
	servers := testMemClusterWith(t, 3, func(c *Config) {
		withLongHeartbeats(c)
		c.RPCHoldTimeout = 300 * time.Millisecond
	}).servers
	leader := waitForLeaderDuties(t, servers...)
	// Chosen by identity, not by IsLeader: under load leadership may
	// flicker, and a "follower" that is the leader gets shut down below.
	var follower, other *Server
	for _, s := range servers {
		switch {
		case s == leader:
		case follower == nil:
			follower = s
		default:
			other = s
		}
	}

	node := testNode("replicated")
	reg := registerNodeRetry(t, leader, node)

	stale := structs.QueryOptions{AllowStale: true}
	// The follower answers from its own state, which may trail the leader
	// for a moment.
	var resp structs.NodeListResponse
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			resp = structs.NodeListResponse{}
			if err := follower.RPC("Node.List", &structs.NodeListRequest{QueryOptions: stale}, &resp); err != nil {
				return err
			}
			if len(resp.Nodes) != 1 {
				return fmt.Errorf("follower lists %d nodes", len(resp.Nodes))
			}
			// A registration retried after a lost reply writes the node
			// twice: the follower may list it from the first write.
			if resp.Index < reg.Index {
				return fmt.Errorf("follower at index %d, registration at %d", resp.Index, reg.Index)
			}
			// Under load an election may be under way; the read is
			// still served, but says no leader is known.
			if !resp.KnownLeader {
				return errors.New("follower knows no leader")
			}
			return nil
		}),
		wait.Timeout(5*time.Second),
		wait.Gap(10*time.Millisecond),
	))
	must.True(t, resp.KnownLeader)
	must.Eq(t, node.ID, resp.Nodes[0].ID)
	must.Eq(t, reg.Index, resp.Index)

	var single structs.SingleNodeResponse
	must.NoError(t, follower.RPC("Node.GetNode", &structs.NodeSpecificRequest{NodeID: node.ID, QueryOptions: stale}, &single))
	must.NotNil(t, single.Node)
	must.True(t, single.KnownLeader)

	// Stale reads stay local: with the rest of the cluster gone, and so no
	// leader to forward to, the follower still answers them, while a
	// consistent read fails with the retryable ErrNoLeader. The other
	// follower goes first; the leader then hands leadership over on its
	// way out, which may make this follower leader for a moment, until it
	// finds it has no quorum and steps down. Alone, it can never win an
	// election again. (It may still name the old leader, unreachable, if
	// the transfer's TimeoutNow made it a candidate: forwarding there
	// fails and the read is held until the hold timeout.)
	must.NoError(t, other.Shutdown(context.Background()))
	must.NoError(t, leader.Shutdown(context.Background()))
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return !follower.IsLeader() }),
		wait.Timeout(10*time.Second),
		wait.Gap(10*time.Millisecond),
	), must.Sprint("the lone follower still leads"))
	resp = structs.NodeListResponse{}
	must.NoError(t, follower.RPC("Node.List", &structs.NodeListRequest{QueryOptions: stale}, &resp))
	must.Len(t, 1, resp.Nodes)
	must.Eq(t, reg.Index, resp.Index)

	err := follower.RPC("Node.List", &structs.NodeListRequest{}, &structs.NodeListResponse{})
	must.Error(t, err)
	must.True(t, errors.Is(err, structs.ErrNoLeader), must.Sprintf("got %v", err))
	must.True(t, structs.IsRetryable(err))
}

// TestBlocking_AnswerIsOnePointInTime: a write that lands while a query
// reads must be in both its rows and its index, or in neither. Here the
// write lands between the query's read of the nodes and of the nodes
// table's index, where a live store would answer an index that claims
// the node without the node: a caller blocking from that index would
// then miss it until the next change.
func TestBlocking_AnswerIsOnePointInTime(t *testing.T) {
	t.Parallel()
	s := testServer(t, nil)
	waitForLeader(t, s)
	var meta structs.QueryMeta
	var ids []string
	var written uint64
	err := s.blockingRPC(&structs.QueryOptions{}, &meta, func(ws memdb.WatchSet, store *state.StateStore) error {
		nodes, err := store.NodesByIDPrefix(ws, "")
		if err != nil {
			return err
		}
		for _, n := range nodes {
			ids = append(ids, n.ID)
		}
		if written == 0 {
			written = registerNode(t, s, testNode("lands-mid-query")).Index
		}
		meta.Index, err = store.Index(state.TableNodes)
		return err
	})
	must.NoError(t, err)
	must.Positive(t, written)
	must.Less(t, written, meta.Index, must.Sprintf("the answer's index %d covers the write at %d, but its rows (%v) miss the node", meta.Index, written, ids))
}
