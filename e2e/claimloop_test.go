//go:build e2e && storm

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/rpc"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/roamhq/roam/structs"
)

// A claim loop for measuring how a cluster's claim path holds up: each
// worker claims a volume of its own for a running allocation of its own
// and releases it again, over and over, with CSIVolume.Claim, the RPC a
// client makes when it mounts a volume and when it lets go of it. Each
// claim is a controller publish through the leader's plugin lane and a
// few Raft writes; each release a controller unpublish and a few more.
//
// The loop calls the RPC itself, as the allocation's node, rather than
// running jobs, so that a cycle is the claim path alone (a job's cycle
// adds scheduling and the client's polling, whose own spread drowns the
// storm's effect), and so that the cluster's state does not grow with
// every cycle (allocations and evaluations are never collected), which
// would move the RSS the storm is judged by.

// claimCallBound bounds one Claim call. A call that passes it counts as a
// sample of this length, and an error, so that a stalled cluster shows up
// in the p99 instead of vanishing from it.
const claimCallBound = 30 * time.Second

// claimGap is each worker's pause between cycles: it keeps the loop's own
// Raft writes to a steady trickle (about 20 a second per worker).
const claimGap = 200 * time.Millisecond

// claimWorker is what one worker claims, and for whom.
type claimWorker struct {
	VolumeID, AllocID string
	Node              *nodeIdentity
	// Server is the RPC address the worker calls.
	Server string
}

// claimSample is one claim call.
type claimSample struct {
	worker       int
	start, taken time.Time
	failed       bool
}

func (s claimSample) latency() time.Duration { return s.taken.Sub(s.start) }

// claimLoop runs the workers until stopped.
type claimLoop struct {
	workers []claimWorker
	ctx     context.Context
	halt    context.CancelFunc
	wg      sync.WaitGroup
	// gate is held (shared) by each worker through a cycle, so that
	// whilePaused can hold the loop between cycles.
	gate sync.RWMutex

	mu      sync.Mutex
	samples []claimSample
	cycles  []int
	errs    []string
	conns   []*rpc.Client
}

func startClaimLoop(t *testing.T, workers []claimWorker) *claimLoop {
	ctx, cancel := context.WithCancel(context.Background())
	l := &claimLoop{
		workers: workers,
		ctx:     ctx,
		halt:    cancel,
		cycles:  make([]int, len(workers)),
		conns:   make([]*rpc.Client, len(workers)),
	}
	for i := range workers {
		l.wg.Add(1)
		go l.run(i)
	}
	t.Cleanup(l.stop)
	return l
}

// whilePaused runs f once every worker is between cycles and none can
// start another, with the workers' connections closed.
func (l *claimLoop) whilePaused(f func()) {
	l.gate.Lock()
	defer l.gate.Unlock()
	l.closeConns()
	f()
}

// stop ends the workers (each finishes its cycle) and closes their
// connections, which would otherwise count in the servers' goroutines.
func (l *claimLoop) stop() {
	l.halt()
	l.wg.Wait()
	l.closeConns()
}

func (l *claimLoop) closeConns() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, c := range l.conns {
		if c != nil {
			c.Close()
			l.conns[i] = nil
		}
	}
}

func (l *claimLoop) fail(i int, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, fmt.Sprintf("worker %d: ", i)+fmt.Sprintf(format, args...))
}

func (l *claimLoop) run(i int) {
	defer l.wg.Done()
	for l.ctx.Err() == nil {
		l.gate.RLock()
		l.cycle(i)
		l.gate.RUnlock()
		select {
		case <-l.ctx.Done():
		case <-time.After(claimGap):
		}
	}
}

// cycle claims worker i's volume (the sample) and releases it. A claim
// that fails is still a sample; the release is retried, since the next
// claim of a single-writer volume needs it free.
func (l *claimLoop) cycle(i int) {
	w := l.workers[i]
	req := structs.CSIVolumeClaimRequest{
		VolumeID: w.VolumeID, AllocationID: w.AllocID, NodeID: w.Node.NodeID,
		Mode: structs.CSIVolumeClaimWrite, AccessMode: structs.CSIAccessModeSingleNodeWriter,
		AttachmentMode: structs.CSIAttachmentModeFilesystem, State: structs.CSIVolumeClaimStateTaken,
	}
	req.AuthToken = w.Node.SecretID
	start := time.Now()
	err := l.call(i, &req)
	taken := time.Now()
	if l.ctx.Err() != nil && err != nil {
		return // stopped mid-call: no sample
	}
	l.mu.Lock()
	l.samples = append(l.samples, claimSample{worker: i, start: start, taken: taken, failed: err != nil})
	if err == nil {
		l.cycles[i]++
	}
	l.mu.Unlock()
	if err != nil {
		l.fail(i, "claim: %v", err)
	}
	req.State = structs.CSIVolumeClaimStateUnpublishing
	for try := 0; ; try++ {
		err := l.call(i, &req)
		if err == nil || try == 10 {
			if err != nil {
				l.fail(i, "release: %v", err)
			}
			return
		}
		l.fail(i, "release (try %d): %v", try+1, err)
		select {
		case <-l.ctx.Done():
			// Let go anyway: the claim must not outlive the test's
			// interest in it, but the loop is stopping.
		case <-time.After(time.Second):
		}
	}
}

// call makes one Claim call on worker i's connection, dialing it first if
// need be; a call that fails at the connection drops it.
func (l *claimLoop) call(i int, req *structs.CSIVolumeClaimRequest) error {
	l.mu.Lock()
	c := l.conns[i]
	l.mu.Unlock()
	if c == nil {
		var err error
		if c, err = dialRPC(l.workers[i].Server); err != nil {
			return err
		}
		l.mu.Lock()
		l.conns[i] = c
		l.mu.Unlock()
	}
	var reply structs.CSIVolumeClaimResponse
	call := c.Go("CSIVolume.Claim", req, &reply, make(chan *rpc.Call, 1))
	var err error
	select {
	case <-call.Done:
		err = call.Error
	case <-time.After(claimCallBound):
		err = fmt.Errorf("no answer within %s", claimCallBound)
	}
	var se rpc.ServerError
	if err != nil && !errors.As(err, &se) {
		// The connection, not the server's answer: start afresh.
		c.Close()
		l.mu.Lock()
		if l.conns[i] == c {
			l.conns[i] = nil
		}
		l.mu.Unlock()
	}
	return err
}

// minCycles is the fewest successful cycles any worker has done.
func (l *claimLoop) minCycles() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Min(l.cycles)
}

func (l *claimLoop) errorCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.errs)
}

// errorSummary is the first few errors.
func (l *claimLoop) errorSummary() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) > 5 {
		return append(slices.Clone(l.errs[:5]), fmt.Sprintf("and %d more", len(l.errs)-5))
	}
	return slices.Clone(l.errs)
}

// window is one quiet or stormy stretch of the run.
type window struct {
	stormy     bool
	start, end time.Time
}

func (w window) kind() string {
	if w.stormy {
		return "stormy"
	}
	return "quiet"
}

// split sorts the latencies of the samples that lie wholly inside one
// window into quiet and stormy, and counts those that cross a boundary
// and the failed calls in each kind.
func (l *claimLoop) split(windows []window) (quiet, stormy []time.Duration, straddled, failedQuiet, failedStormy int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.samples {
		placed := false
		for _, w := range windows {
			if s.start.Before(w.start) || s.taken.After(w.end) {
				continue
			}
			placed = true
			if w.stormy {
				stormy = append(stormy, s.latency())
				if s.failed {
					failedStormy++
				}
			} else {
				quiet = append(quiet, s.latency())
				if s.failed {
					failedQuiet++
				}
			}
			break
		}
		if !placed && !s.start.Before(windows[0].start) && !s.taken.After(windows[len(windows)-1].end) {
			straddled++
		}
	}
	return quiet, stormy, straddled, failedQuiet, failedStormy
}

// sortedCopy returns ds sorted, for percentile.
func sortedCopy(ds []time.Duration) []time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s
}

func latencySummary(ds []time.Duration) string {
	s := sortedCopy(ds)
	return fmt.Sprintf("n=%d p50=%s p90=%s p99=%s max=%s", len(s),
		fmtMS(percentile(s, 50)), fmtMS(percentile(s, 90)), fmtMS(percentile(s, 99)), fmtMS(percentile(s, 100)))
}
