package nomad

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// heartbeatServer starts a lone server holding n registered nodes, with
// TTLs of an hour so none expires mid-run, and returns it and the nodes.
func heartbeatServer(b *testing.B, n int) (*Server, []*structs.Node) {
	b.Helper()
	s := testServer(b, func(c *Config) {
		c.MinHeartbeatTTL, c.FailoverHeartbeatTTL = time.Hour, time.Hour
		c.Logger = hclog.NewNullLogger()
	})
	benchWaitForLeader(b, []*Server{s})
	nodes := make([]*structs.Node, n)
	for i := range nodes {
		nodes[i] = benchNode(fmt.Sprintf("hb-%d", i))
		var resp structs.NodeUpdateResponse
		must.NoError(b, s.RPC("Node.Register", &structs.NodeRegisterRequest{Node: nodes[i]}, &resp))
	}
	return s, nodes
}

// BenchmarkNodeUpdateStatus_10000vs100 measures one heartbeat
// (Node.UpdateStatus, status unchanged: no Raft write) on a leader that
// holds 100 nodes and on one that holds 10,000, alternating one each per
// iteration so both see the same machine, and reports each cost and their
// ratio (issue 32: within 1.2×).
func BenchmarkNodeUpdateStatus_10000vs100(b *testing.B) {
	small, smallNodes := heartbeatServer(b, 100)
	large, largeNodes := heartbeatServer(b, 10_000)
	rng := rand.New(rand.NewPCG(1, 2))
	heartbeat := func(s *Server, nodes []*structs.Node) time.Duration {
		n := nodes[rng.IntN(len(nodes))]
		var resp structs.NodeUpdateResponse
		start := time.Now()
		err := s.RPC("Node.UpdateStatus", &structs.NodeUpdateStatusRequest{
			NodeID: n.ID, Status: structs.NodeStatusReady,
			WriteRequest: structs.WriteRequest{AuthToken: n.SecretID},
		}, &resp)
		d := time.Since(start)
		if err != nil {
			b.Fatalf("heartbeat of %s: %v", n.ID, err)
		}
		if resp.HeartbeatTTL <= 0 {
			b.Fatalf("heartbeat of %s: no TTL", n.ID)
		}
		return d
	}
	var tSmall, tLarge time.Duration
	ops := 0
	for b.Loop() {
		tSmall += heartbeat(small, smallNodes)
		tLarge += heartbeat(large, largeNodes)
		ops++
	}
	perSmall := float64(tSmall.Nanoseconds()) / float64(ops)
	perLarge := float64(tLarge.Nanoseconds()) / float64(ops)
	b.ReportMetric(perSmall, "ns/heartbeat@100")
	b.ReportMetric(perLarge, "ns/heartbeat@10000")
	b.ReportMetric(perLarge/perSmall, "ratio_10000/100")
}
