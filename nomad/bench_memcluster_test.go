package nomad

import (
	"context"
	"testing"
	"time"
)

// BenchmarkClusterElect measures how long a 3-server unit cluster takes
// from NewServer to an agreed leader, over TCP with the network transport
// and over the in-memory network with raft.InmemTransport, in the same
// run so the two can be compared as a ratio on whatever machine runs it.
// Shutting the cluster down is reported on its own.
func BenchmarkClusterElect(b *testing.B) {
	run := func(b *testing.B, start func(b *testing.B) ([]*Server, func(*Server))) {
		var elect, stop time.Duration
		for range b.N {
			begin := time.Now()
			servers, shutdown := start(b)
			leader := waitForLeader(b, servers...)
			elect += time.Since(begin)
			b.StopTimer()
			// The leader last, as a test's cleanup would find it:
			// its handoff has no one left to hand over to.
			begin = time.Now()
			for _, s := range followers(servers) {
				shutdown(s)
			}
			shutdown(leader)
			stop += time.Since(begin)
			b.StartTimer()
		}
		b.ReportMetric(float64(elect.Milliseconds())/float64(b.N), "ms/leader")
		b.ReportMetric(float64(stop.Milliseconds())/float64(b.N), "ms/shutdown")
	}
	b.Run("tcp", func(b *testing.B) {
		run(b, func(b *testing.B) ([]*Server, func(*Server)) {
			return startTCPCluster(b, 3, nil), func(s *Server) { _ = s.Shutdown(context.Background()) }
		})
	})
	b.Run("mem", func(b *testing.B) {
		run(b, func(b *testing.B) ([]*Server, func(*Server)) {
			c := startMemCluster(b, 3, nil)
			return c.servers, c.shutdown
		})
	})
}
