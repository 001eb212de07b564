package nomad

import (
	"testing"
	"time"
)

// BenchmarkClusterElect measures how long a 3-server unit cluster takes
// from NewServer to an agreed leader, over TCP with the network transport
// and over the in-memory network with raft.InmemTransport, in the same
// run so the two can be compared as a ratio on whatever machine runs it.
// Shutdown is not timed.
func BenchmarkClusterElect(b *testing.B) {
	run := func(b *testing.B, start func(b *testing.B) []*Server) {
		var total time.Duration
		for range b.N {
			begin := time.Now()
			servers := start(b)
			waitForLeader(b, servers...)
			total += time.Since(begin)
			b.StopTimer()
			for _, s := range servers {
				_ = s.Shutdown(b.Context())
			}
			b.StartTimer()
		}
		b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/leader")
	}
	b.Run("tcp", func(b *testing.B) {
		run(b, func(b *testing.B) []*Server { return startTCPCluster(b, 3, nil) })
	})
	b.Run("mem", func(b *testing.B) {
		run(b, func(b *testing.B) []*Server { return startMemCluster(b, 3, nil).servers })
	})
}
