package nomad

// BenchmarkACL_Claim puts a price on ACLs. It starts two benchmark
// clusters (newClaimBench: three servers with Raft on disk, a client
// running a hostpath monolith) in the same process, one with ACLs off and
// one with ACLs on, and reports for each, and as on/off ratios:
//
//   - claim-p50/p99: an uncontended claim cycle's claim (reserve through
//     Raft, controller publish over the client session, mark taken),
//     the clusters taking turns in batches so that both see the same
//     machine. Claims authenticate with the node's secret, so with ACLs
//     on each one passes the RPC check's table lookup;
//   - read-p50: CSIVolume.Get with a client token holding
//     csi-read-volume (ACLs on) or no token (ACLs off): the path a token
//     resolution takes, served from the cache.
//
//	go test -run '^$' -bench ACL_Claim -benchtime 1x ./nomad/

import (
	"testing"
	"time"

	"github.com/roamhq/roam/structs"
)

const (
	aclBenchBatch = 50
	aclBenchTurns = 6
	aclBenchReads = 500
)

func BenchmarkACL_Claim(b *testing.B) {
	off := newClaimBenchWith(b, 1, 0, nil, false)
	on := newClaimBenchWith(b, 1, 0, nil, true)
	reader := testACLToken(b, on.leader, on.aclToken, "reader", nsCaps("csi-read-volume"))

	offClaim, offCycle := &latencies{}, &latencies{}
	onClaim, onCycle := &latencies{}, &latencies{}
	offRead, onRead := &latencies{}, &latencies{}
	read := func(cb *claimBench, token string, lat *latencies) {
		for range aclBenchReads / aclBenchTurns {
			start := time.Now()
			var resp structs.CSIVolumeGetResponse
			if err := cb.leader.RPC("CSIVolume.Get", &structs.CSIVolumeGetRequest{
				ID: cb.volumes[0].ID, QueryOptions: structs.QueryOptions{AuthToken: token},
			}, &resp); err != nil {
				b.Fatal(err)
			}
			lat.add(time.Since(start))
		}
	}
	for b.Loop() {
		for range aclBenchTurns {
			if err := off.cycles(1, aclBenchBatch, offClaim, offCycle); err != nil {
				b.Fatal(err)
			}
			if err := on.cycles(1, aclBenchBatch, onClaim, onCycle); err != nil {
				b.Fatal(err)
			}
			read(off, "", offRead)
			read(on, reader, onRead)
		}
	}
	b.StopTimer()
	off.check(b)
	on.check(b)

	oc, nc := sortedCopy(offClaim), sortedCopy(onClaim)
	or, nr := sortedCopy(offRead), sortedCopy(onRead)
	ratio := func(on, off time.Duration) float64 { return float64(on) / float64(off) }
	b.ReportMetric(msOf(percentile(oc, 0.50)), "claim-p50-ms-off")
	b.ReportMetric(msOf(percentile(nc, 0.50)), "claim-p50-ms-on")
	b.ReportMetric(ratio(percentile(nc, 0.50), percentile(oc, 0.50)), "claim-p50-on/off")
	b.ReportMetric(ratio(percentile(nc, 0.99), percentile(oc, 0.99)), "claim-p99-on/off")
	b.ReportMetric(ratio(percentile(nr, 0.50), percentile(or, 0.50)), "read-p50-on/off")
	b.Logf("claims: %d off, %d on; p50 %.2f ms vs %.2f ms (x%.2f), p99 %.2f ms vs %.2f ms (x%.2f)",
		len(oc), len(nc), msOf(percentile(oc, 0.50)), msOf(percentile(nc, 0.50)), ratio(percentile(nc, 0.50), percentile(oc, 0.50)),
		msOf(percentile(oc, 0.99)), msOf(percentile(nc, 0.99)), ratio(percentile(nc, 0.99), percentile(oc, 0.99)))
	b.Logf("reads: %d each; p50 %.3f ms vs %.3f ms (x%.2f)",
		len(or), msOf(percentile(or, 0.50)), msOf(percentile(nr, 0.50)), ratio(percentile(nr, 0.50), percentile(or, 0.50)))
}
