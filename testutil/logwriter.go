package testutil

import (
	"strings"
	"sync"
	"testing"
)

// LogWriter is an io.Writer for an agent's log that sends each line to
// t.Log until the test's cleanup starts, and drops lines after that, when
// t.Log would panic (an agent still logs while it shuts down).
type LogWriter struct {
	t testing.TB
	// mu guards done.
	mu   sync.Mutex
	done bool
}

// NewLogWriter returns a LogWriter for t.
func NewLogWriter(t testing.TB) *LogWriter {
	w := &LogWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return w
}

func (w *LogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}
