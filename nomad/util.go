package nomad

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/roamhq/roam/internal/ratelog"
)

type atomicBool = atomic.Bool

// advertiseAddr is a net.Addr for an advertised host:port string.
type advertiseAddr string

func (a advertiseAddr) Network() string { return "tcp" }
func (a advertiseAddr) String() string  { return string(a) }

var _ net.Addr = advertiseAddr("")

// jitter returns d plus a random fraction of d up to 1/frac.
func jitter(d time.Duration, frac int64) time.Duration {
	if d <= 0 || frac <= 0 {
		return d
	}
	return d + time.Duration(rand.Int64N(int64(d)/frac+1))
}

// hclogYamux adapts hclog to yamux's logger interface.
type hclogYamux struct{ l hclog.Logger }

func (y hclogYamux) Print(v ...any) { y.l.Debug(strings.TrimSpace(fmt.Sprint(v...))) }
func (y hclogYamux) Printf(format string, v ...any) {
	y.l.Debug(strings.TrimSpace(fmt.Sprintf(format, v...)))
}
func (y hclogYamux) Println(v ...any) { y.l.Debug(strings.TrimSpace(fmt.Sprint(v...))) }

// inFlight counts work in progress so that a departing leader can wait for
// it to finish. The zero value is ready to use.
type inFlight struct {
	mu sync.Mutex
	n  int
	// idle, when set, is closed once n drops to zero.
	idle chan struct{}
}

func (f *inFlight) add() {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
}

func (f *inFlight) done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.n == 0 && f.idle != nil {
		close(f.idle)
		f.idle = nil
	}
}

// waitIdle waits until nothing is in flight, or ctx ends, and returns how
// much was in flight when it was called.
func (f *inFlight) waitIdle(ctx context.Context) (int, error) {
	f.mu.Lock()
	n := f.n
	if n == 0 {
		f.mu.Unlock()
		return 0, nil
	}
	if f.idle == nil {
		f.idle = make(chan struct{})
	}
	idle := f.idle
	f.mu.Unlock()
	select {
	case <-idle:
		return n, nil
	case <-ctx.Done():
		return n, ctx.Err()
	}
}

// raftNetLogger rate-limits the errors Raft's transport logs once per bad
// connection (a garbage or timed-out frame), so that a flood of them
// cannot flood the log; every other line passes through.
type raftNetLogger struct {
	hclog.Logger
	limited *ratelog.Logger
}

// raftConnErrors are the transport's per-connection error messages.
var raftConnErrors = map[string]bool{
	"failed to decode incoming command": true,
	"failed to flush response":          true,
}

func (l *raftNetLogger) Error(msg string, args ...any) {
	if raftConnErrors[msg] {
		l.limited.Log(hclog.Error, msg, args...)
		return
	}
	l.Logger.Error(msg, args...)
}

func (l *raftNetLogger) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Error && raftConnErrors[msg] {
		l.limited.Log(level, msg, args...)
		return
	}
	l.Logger.Log(level, msg, args...)
}
