package nomad

// BenchmarkTLS_ClaimAndHandoff puts a price on mutual TLS. It starts two
// benchmark clusters (three servers with Raft on disk, a client running a
// hostpath monolith, see newClaimBench) in the same process, one on plain
// TCP and one with mutual TLS and verify_server_hostname on every RPC
// port: Raft, forwarding, and the client's session, over which the leader
// makes its controller calls. It reports, for each and as TLS/plain
// ratios:
//
//   - claim-p50/p99: an uncontended claim (reserve through Raft,
//     controller publish over the client session, mark taken through
//     Raft), cycles run one at a time, the two clusters taking turns in
//     batches so that both see the same machine;
//   - handoff-p50: a leader handoff (Server.handoff, as on SIGTERM but the
//     old leader stays), from its start until the next leader's duties
//     run, again alternating between the clusters.
//
//	go test -run '^$' -bench TLS_ClaimAndHandoff -benchtime 1x ./nomad/

import (
	"context"
	"testing"
	"time"

	"github.com/roamhq/roam/internal/tlsutil/tlstest"
	"github.com/roamhq/roam/structs"
)

const (
	// tlsBenchBatch is the cycles one cluster runs before the other's turn.
	tlsBenchBatch = 50
	// tlsBenchTurns is the turns each cluster gets per iteration.
	tlsBenchTurns = 6
	// tlsBenchHandoffs is the handoffs measured on each cluster.
	tlsBenchHandoffs = 20
)

func BenchmarkTLS_ClaimAndHandoff(b *testing.B) {
	certs := tlstest.Write(b, structs.DefaultRegion)
	plain := newClaimBenchTLS(b, 1, 0, nil)
	secure := newClaimBenchTLS(b, 1, 0, certs)

	plainClaim, plainCycle := &latencies{}, &latencies{}
	tlsClaim, tlsCycle := &latencies{}, &latencies{}
	for b.Loop() {
		for range tlsBenchTurns {
			if err := plain.cycles(1, tlsBenchBatch, plainClaim, plainCycle); err != nil {
				b.Fatal(err)
			}
			if err := secure.cycles(1, tlsBenchBatch, tlsClaim, tlsCycle); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	plain.check(b)
	secure.check(b)

	var plainGap, tlsGap latencies
	for range tlsBenchHandoffs {
		plainGap.add(handoffGap(b, plain.servers))
		tlsGap.add(handoffGap(b, secure.servers))
	}

	pc, tc := sortedCopy(plainClaim), sortedCopy(tlsClaim)
	pg, tg := sortedCopy(&plainGap), sortedCopy(&tlsGap)
	ratio := func(tls, plain time.Duration) float64 { return float64(tls) / float64(plain) }
	b.ReportMetric(msOf(percentile(pc, 0.50)), "claim-p50-ms-plain")
	b.ReportMetric(msOf(percentile(tc, 0.50)), "claim-p50-ms-tls")
	b.ReportMetric(ratio(percentile(tc, 0.50), percentile(pc, 0.50)), "claim-p50-tls/plain")
	b.ReportMetric(ratio(percentile(tc, 0.99), percentile(pc, 0.99)), "claim-p99-tls/plain")
	b.ReportMetric(msOf(percentile(pg, 0.50)), "handoff-p50-ms-plain")
	b.ReportMetric(msOf(percentile(tg, 0.50)), "handoff-p50-ms-tls")
	b.ReportMetric(ratio(percentile(tg, 0.50), percentile(pg, 0.50)), "handoff-p50-tls/plain")
	b.Logf("claims: %d plain, %d tls; p50 %.2f ms vs %.2f ms (x%.2f), p99 %.2f ms vs %.2f ms (x%.2f)",
		len(pc), len(tc), msOf(percentile(pc, 0.50)), msOf(percentile(tc, 0.50)), ratio(percentile(tc, 0.50), percentile(pc, 0.50)),
		msOf(percentile(pc, 0.99)), msOf(percentile(tc, 0.99)), ratio(percentile(tc, 0.99), percentile(pc, 0.99)))
	b.Logf("handoffs: %d each; p50 %.1f ms vs %.1f ms (x%.2f), max %.1f ms vs %.1f ms",
		len(pg), msOf(percentile(pg, 0.50)), msOf(percentile(tg, 0.50)), ratio(percentile(tg, 0.50), percentile(pg, 0.50)),
		msOf(pg[len(pg)-1]), msOf(tg[len(tg)-1]))
}

// handoffGap hands leadership from the current leader of servers to
// another, and returns the time from the start of the handoff until the
// next leader's duties run.
func handoffGap(tb testing.TB, servers []*Server) time.Duration {
	tb.Helper()
	old := benchWaitForLeader(tb, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := old.handoff(ctx, "", "", true); err != nil {
		tb.Fatalf("handoff: %v", err)
	}
	for {
		for _, s := range servers {
			if s != old && s.IsLeader() && s.heartbeats.running() {
				return time.Since(start)
			}
		}
		if ctx.Err() != nil {
			tb.Fatalf("no new leader took office within 30s of the handoff")
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Millisecond):
		}
	}
}
