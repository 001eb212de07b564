package nomad

// Benchmarks of the server's write and heartbeat paths on a three-server
// cluster whose Raft logs are on disk (TestConfig: raft-wal under
// b.TempDir, one fsync per append), with production Raft timers (see
// benchCluster). All three servers share the machine's cores, so the
// figures are a floor for a real deployment, and they move with whatever
// else the machine is running.
//
// How to read and run them:
//
//   - Each iteration of the benchmark loop (b.Loop) does a fixed batch of
//     operations, the const named next to each benchmark, sized so that one
//     batch takes a few seconds on a 2-core machine. `make bench` runs with
//     -benchtime 1x: one batch per benchmark. -benchtime Nx repeats the
//     batch N times on the same cluster; a duration (-benchtime 10s, or the
//     default 1s) keeps repeating batches until it has run that long.
//   - Cluster start and node registration happen before the loop, outside
//     the timer.
//   - Reported: ops/s (heartbeats/s for heartbeats) over the timed part,
//     p50-ms and p99-ms over every operation, and ns/op per operation (not
//     per batch).
//
// Each also measures the raw Raft apply rate on its own cluster before
// its timed part (raftBaseline) and reports raft-ops/s and its own rate
// divided by it (per-raft-op), so figures from runs on a busy machine
// compare by the ratio.
//
// These are figures to quote in notes, not pass/fail thresholds.
//
//	go test -run '^$' -bench . -benchtime 1x ./nomad/

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

const (
	// singleWriterBatch is the number of sequential writes per iteration.
	singleWriterBatch = 5000
	// concurrentWriters and concurrentWriterBatch shape the concurrent
	// write benchmark: Raft batches what arrives while an append is in
	// flight, so many writers commit far more per second than one.
	concurrentWriters     = 64
	concurrentWriterBatch = 20000
	// heartbeatNodes are registered before heartbeats are timed.
	heartbeatNodes = 200
	// sequentialHeartbeatBatch and concurrentHeartbeatBatch are heartbeats
	// per iteration; concurrentHeartbeatSenders send them at once.
	sequentialHeartbeatBatch   = 20000
	concurrentHeartbeatSenders = 64
	concurrentHeartbeatBatch   = 100000
)

// raftBaseline measures the raw Raft apply rate on the cluster led by
// leader: raftBaselineOps writes from claimBenchWorkers goroutines, each
// re-registering its own node (so the state does not grow with the
// baseline, and no evaluation is created). It runs before the benchmark's
// timed part, in the same run, and returns writes per second.
func raftBaseline(b *testing.B, leader *Server) float64 {
	b.Helper()
	nodes := make([]*structs.Node, claimBenchWorkers)
	for w := range nodes {
		nodes[w] = benchNode(fmt.Sprintf("raft-baseline-%d", w))
	}
	var mu sync.Mutex
	free := slices.Clone(nodes)
	start := time.Now()
	err := runConcurrent(claimBenchWorkers, raftBaselineOps, &latencies{}, func(int) error {
		mu.Lock()
		n := free[len(free)-1]
		free = free[:len(free)-1]
		mu.Unlock()
		defer func() {
			mu.Lock()
			free = append(free, n)
			mu.Unlock()
		}()
		var resp structs.NodeUpdateResponse
		return leader.RPC("Node.Register", &structs.NodeRegisterRequest{Node: n.Copy()}, &resp)
	})
	must.NoError(b, err)
	return float64(raftBaselineOps) / time.Since(start).Seconds()
}

// reportRaftRatio reports the Raft baseline and rate (in unit) as a ratio
// to it.
func reportRaftRatio(b *testing.B, rate, raftRate float64, unit string) {
	b.Helper()
	b.ReportMetric(raftRate, "raft-ops/s")
	b.ReportMetric(rate/raftRate, unit+"-per-raft-op")
}

// registerOp registers a new node through srv, as a client's first
// registration does: one Raft write.
func registerOp(srv *Server, name string) error {
	var resp structs.NodeUpdateResponse
	if err := srv.RPC("Node.Register", &structs.NodeRegisterRequest{Node: benchNode(name)}, &resp); err != nil {
		return err
	}
	if resp.Index == 0 {
		return fmt.Errorf("register %s: reply has no index", name)
	}
	return nil
}

// BenchmarkRaftApply_SingleWriter commits Node.Register writes one after
// another through the leader's in-process RPC: the latency of one write
// from request to applied, including the fsync on the leader and one
// follower.
func BenchmarkRaftApply_SingleWriter(b *testing.B) {
	_, leader := benchCluster(b, 3)
	raftRate := raftBaseline(b, leader)
	lat := &latencies{}
	batch := 0
	for b.Loop() {
		for i := range singleWriterBatch {
			start := time.Now()
			if err := registerOp(leader, fmt.Sprintf("single-%d-%d", batch, i)); err != nil {
				b.Fatalf("write %d of batch %d: %v", i, batch, err)
			}
			lat.d = append(lat.d, time.Since(start))
		}
		batch++
	}
	reportRaftRatio(b, lat.report(b, "ops/s"), raftRate, "ops")
}

// BenchmarkRaftApply_64Writers commits Node.Register writes from 64
// goroutines at once through the leader's in-process RPC.
func BenchmarkRaftApply_64Writers(b *testing.B) {
	_, leader := benchCluster(b, 3)
	raftRate := raftBaseline(b, leader)
	lat := &latencies{}
	batch := 0
	for b.Loop() {
		err := runConcurrent(concurrentWriters, concurrentWriterBatch, lat, func(i int) error {
			return registerOp(leader, fmt.Sprintf("concurrent-%d-%d", batch, i))
		})
		if err != nil {
			b.Fatalf("batch %d: %v", batch, err)
		}
		batch++
	}
	reportRaftRatio(b, lat.report(b, "ops/s"), raftRate, "ops")
}

// BenchmarkHeartbeat_ToFollower sends Node.UpdateStatus heartbeats (status
// unchanged, so no Raft write) for registered nodes to a follower, which
// forwards each to the leader: the cost of a client heartbeating through a
// server that does not lead.
func BenchmarkHeartbeat_ToFollower(b *testing.B) {
	servers, leader := benchCluster(b, 3)
	var follower *Server
	for _, s := range servers {
		if s != leader {
			follower = s
			break
		}
	}
	must.NotNil(b, follower)

	nodes := make([]*structs.Node, heartbeatNodes)
	registeredAt := make([]uint64, heartbeatNodes)
	for i := range nodes {
		nodes[i] = benchNode(fmt.Sprintf("hb-%d", i))
		var resp structs.NodeUpdateResponse
		must.NoError(b, leader.RPC("Node.Register", &structs.NodeRegisterRequest{Node: nodes[i]}, &resp))
		registeredAt[i] = resp.Index
	}
	// The follower answers from the leader, but wait for it to have applied
	// the registrations anyway so both sub-benchmarks start from the same
	// state.
	last := nodes[len(nodes)-1].ID
	must.Wait(b, benchNodeApplied(follower, last))
	raftRate := raftBaseline(b, leader)

	heartbeat := func(i int) error {
		n := nodes[i%len(nodes)]
		var resp structs.NodeUpdateResponse
		err := follower.RPC("Node.UpdateStatus", &structs.NodeUpdateStatusRequest{
			NodeID:       n.ID,
			Status:       structs.NodeStatusReady,
			WriteRequest: structs.WriteRequest{AuthToken: n.SecretID},
		}, &resp)
		if err != nil {
			return err
		}
		if resp.HeartbeatTTL <= 0 {
			return fmt.Errorf("heartbeat for %s: no TTL in reply", n.ID)
		}
		return nil
	}

	b.Run("sequential", func(b *testing.B) {
		lat := &latencies{}
		for b.Loop() {
			for i := range sequentialHeartbeatBatch {
				start := time.Now()
				if err := heartbeat(i); err != nil {
					b.Fatalf("heartbeat %d: %v", i, err)
				}
				lat.d = append(lat.d, time.Since(start))
			}
		}
		reportRaftRatio(b, lat.report(b, "heartbeats/s"), raftRate, "heartbeats")
	})
	b.Run(fmt.Sprintf("%dsenders", concurrentHeartbeatSenders), func(b *testing.B) {
		lat := &latencies{}
		for b.Loop() {
			if err := runConcurrent(concurrentHeartbeatSenders, concurrentHeartbeatBatch, lat, heartbeat); err != nil {
				b.Fatal(err)
			}
		}
		reportRaftRatio(b, lat.report(b, "heartbeats/s"), raftRate, "heartbeats")
	})

	// Heartbeats that change nothing must not have written anything: every
	// node is ready and unmodified since it registered.
	for i, n := range nodes {
		got, err := leader.State().NodeByID(nil, n.ID)
		must.NoError(b, err)
		must.NotNil(b, got)
		must.Eq(b, structs.NodeStatusReady, got.Status)
		must.Eq(b, registeredAt[i], got.ModifyIndex)
	}
}
