package ratelog

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// syncBuffer is a bytes.Buffer safe for the timer goroutines to write.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Split(strings.TrimSpace(b.buf.String()), "\n")
}

func testLogger(out *syncBuffer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Output: out, Level: hclog.Info})
}

func TestLogger_RepeatsAreCounted(t *testing.T) {
	out := &syncBuffer{}
	// A window far longer than the test: only Stop reports the count.
	l := New(testLogger(out), time.Hour)
	for i := range 1000 {
		l.Warn("bad first byte", "remote", fmt.Sprintf("10.0.0.%d", i%250))
	}
	l.Info("something else")
	lines := out.lines()
	must.Len(t, 2, lines, must.Sprint(lines))
	must.StrContains(t, lines[0], "bad first byte: remote=10.0.0.0")
	must.StrContains(t, lines[1], "something else")

	l.Stop()
	lines = out.lines()
	must.Len(t, 3, lines, must.Sprint(lines))
	// The summary carries the latest repeat's pairs.
	must.StrContains(t, lines[2], "bad first byte (999 more in the last 1h0m0s): remote=10.0.0.249")

	l.Stop() // twice is fine
	l.Warn("after stop")
	must.Len(t, 4, out.lines())
}

func TestLogger_WindowEnds(t *testing.T) {
	out := &syncBuffer{}
	l := New(testLogger(out), 20*time.Millisecond)
	t.Cleanup(l.Stop)

	for range 5 {
		l.Warn("frame timeout")
	}
	// The window's end reports the four repeats.
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return len(out.lines()) == 2 }),
		wait.Timeout(5*time.Second), wait.Gap(5*time.Millisecond)))
	must.StrContains(t, out.lines()[1], "frame timeout (4 more in the last 20ms)")

	// A window with no repeats ends quietly and forgets the message, so
	// the next occurrence is logged at once.
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool {
			l.mu.Lock()
			defer l.mu.Unlock()
			return len(l.events) == 0
		}),
		wait.Timeout(5*time.Second), wait.Gap(5*time.Millisecond)))
	l.Warn("frame timeout")
	must.Len(t, 3, out.lines())
	must.StrContains(t, out.lines()[2], "frame timeout")
	must.StrNotContains(t, out.lines()[2], "more in the last")
}
