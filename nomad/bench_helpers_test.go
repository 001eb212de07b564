package nomad

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
	"github.com/roamhq/roam/testutil"
)

// benchCluster starts n servers on their own on-disk data dirs (TestConfig:
// raft-wal under tb.TempDir) over loopback TCP, as startTCPCluster does,
// and returns them and their leader once the leader has taken office.
//
// Heartbeat TTLs are an hour so no node registered by a benchmark expires
// mid-run: an expiry is a Raft write the benchmark did not ask for. Raft
// runs with the production timers.
func benchCluster(tb testing.TB, n int) ([]*Server, *Server) {
	tb.Helper()
	return benchClusterWith(tb, n, nil)
}

// benchClusterWith is benchCluster with fn applied to every server's
// config last.
func benchClusterWith(tb testing.TB, n int, fn func(*Config)) ([]*Server, *Server) {
	tb.Helper()
	servers := startTCPCluster(tb, n, func(c *Config) {
		c.MinHeartbeatTTL = time.Hour
		c.FailoverHeartbeatTTL = time.Hour
		// Production Raft timers (RaftMultiplier 1), not TestConfig's
		// 100 ms ones: with those, 64 writers saturating two cores starve
		// follower heartbeats and the leader steps down mid-run, which
		// measures the test timers rather than the server.
		c.RaftConfig = nil
		// Election chatter at start and transport errors at teardown are
		// expected and would land between a benchmark's name and its
		// figures; failures surface through tb anyway. -v shows errors.
		c.Logger = hclog.NewNullLogger()
		if testing.Verbose() {
			c.Logger = hclog.New(&hclog.LoggerOptions{
				Name:   c.NodeName,
				Level:  hclog.Error,
				Output: hclog.DefaultOutput,
			})
		}
		if fn != nil {
			fn(c)
		}
	})
	return servers, benchWaitForLeader(tb, servers)
}

// benchWaitForLeader waits until exactly one server leads, every server
// agrees on it, and the leader's duties (heartbeat timers) are running.
func benchWaitForLeader(tb testing.TB, servers []*Server) *Server {
	tb.Helper()
	var leader *Server
	must.Wait(tb, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			var err error
			if leader, err = testutil.AgreedLeader(servers); err != nil {
				return err
			}
			// Peers must all be voters, or a write commits on a quorum
			// smaller than the one being measured.
			future := leader.Raft().GetConfiguration()
			if err := future.Error(); err != nil {
				return err
			}
			if got := len(future.Configuration().Servers); got != len(servers) {
				return fmt.Errorf("raft configuration has %d servers, want %d", got, len(servers))
			}
			return nil
		}),
		wait.Timeout(15*time.Second),
		wait.Gap(10*time.Millisecond),
	))
	// Register one throwaway node: it succeeds only once the leader's
	// heartbeat timers are armed, which is the last step of taking office.
	warmup := benchNode("warmup")
	must.Wait(tb, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			var resp structs.NodeUpdateResponse
			return leader.RPC("Node.Register", &structs.NodeRegisterRequest{Node: warmup}, &resp)
		}),
		wait.Timeout(10*time.Second),
		wait.Gap(10*time.Millisecond),
	))
	return leader
}

// benchNode is a node as a client registers it.
func benchNode(name string) *structs.Node {
	return &structs.Node{
		ID:         uuid.NewString(),
		SecretID:   uuid.NewString(),
		Name:       name,
		Datacenter: "dc1",
		Status:     structs.NodeStatusReady,
		Attributes: map[string]string{
			"os.name":           "linux",
			"cpu.arch":          "amd64",
			"cpu.numcores":      "2",
			"memory.totalbytes": "4294967296",
			"roam.version":      "0.1.0",
		},
		Meta: map[string]string{"rack": "r1"},
	}
}

// latencies collects per-operation durations from any number of
// goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d ...time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d...)
	l.mu.Unlock()
}

// percentile returns the nearest-rank q-quantile (0 < q <= 1) of sorted.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

// report publishes throughput and latency for every operation recorded
// during the timed part of the benchmark. ns/op is per operation, not per
// batch, so it is comparable across batch sizes.
// It returns the rate.
func (l *latencies) report(b *testing.B, rateUnit string) float64 {
	b.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		b.Fatal("no operations recorded")
	}
	sorted := slices.Clone(l.d)
	slices.Sort(sorted)
	elapsed := b.Elapsed()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(float64(len(sorted))/elapsed.Seconds(), rateUnit)
	b.ReportMetric(ms(percentile(sorted, 0.50)), "p50-ms")
	b.ReportMetric(ms(percentile(sorted, 0.99)), "p99-ms")
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(len(sorted)), "ns/op")
	return float64(len(sorted)) / elapsed.Seconds()
}

// runConcurrent runs ops operations spread over workers goroutines, each
// taking the next operation number until none is left, and records each
// operation's duration. It returns the first error.
func runConcurrent(workers, ops int, lat *latencies, op func(i int) error) error {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		next     int
		firstErr error
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if next >= ops || firstErr != nil {
			return 0, false
		}
		next++
		return next - 1, true
	}
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, ops/workers+1)
			defer func() { lat.add(local...) }()
			for {
				i, ok := take()
				if !ok {
					return
				}
				start := time.Now()
				if err := op(i); err != nil {
					fail(fmt.Errorf("op %d: %w", i, err))
					return
				}
				local = append(local, time.Since(start))
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// benchNodeApplied is satisfied once s has applied the registration of the
// node with id.
func benchNodeApplied(s *Server, id string) *wait.Constraint {
	return wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			n, err := s.State().NodeByID(nil, id)
			if err != nil {
				return err
			}
			if n == nil {
				return fmt.Errorf("server %s has not applied node %s", s.ID(), id)
			}
			return nil
		}),
		wait.Timeout(10*time.Second),
		wait.Gap(5*time.Millisecond),
	)
}
