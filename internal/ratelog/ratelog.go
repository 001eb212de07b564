// Package ratelog logs a repeated event once per window with a count of
// the repeats it held back, so that a port scan or a flood of bad
// connections cannot flood the log. The RPC listener and the HTTP server
// share it.
package ratelog

import (
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// DefaultWindow is how long the repeats of one event are held back.
const DefaultWindow = 10 * time.Second

// Logger logs each distinct message at most once per window. The first
// occurrence is logged at once; the repeats within the window are only
// counted, and when the window ends one line reports them, with the key
// and value pairs of the latest: "msg (N more in the last 10s)".
type Logger struct {
	logger hclog.Logger
	window time.Duration

	mu      sync.Mutex
	events  map[string]*event
	stopped bool
}

// event is one message's current window.
type event struct {
	level hclog.Level
	// held counts the repeats since the window began; args are the
	// latest repeat's key/value pairs.
	held  int
	args  []any
	timer *time.Timer
}

// New returns a Logger writing to logger; a window of zero or less means
// DefaultWindow.
func New(logger hclog.Logger, window time.Duration) *Logger {
	if window <= 0 {
		window = DefaultWindow
	}
	return &Logger{logger: logger, window: window, events: make(map[string]*event)}
}

// Warn logs msg at warn level, rate-limited.
func (l *Logger) Warn(msg string, args ...any) { l.Log(hclog.Warn, msg, args...) }

// Info logs msg at info level, rate-limited.
func (l *Logger) Info(msg string, args ...any) { l.Log(hclog.Info, msg, args...) }

// Log logs msg at level unless msg was logged within the window, in which
// case it is counted for the window's closing line. The message is the
// key: callers keep variable detail in args.
func (l *Logger) Log(level hclog.Level, msg string, args ...any) {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		l.logger.Log(level, msg, args...)
		return
	}
	if e, ok := l.events[msg]; ok {
		e.held++
		e.args = args
		e.level = level
		l.mu.Unlock()
		return
	}
	e := &event{level: level}
	e.timer = time.AfterFunc(l.window, func() { l.closeWindow(msg) })
	l.events[msg] = e
	l.mu.Unlock()
	l.logger.Log(level, msg, args...)
}

// closeWindow ends msg's window: it reports the repeats it held, which
// opens a new window, or forgets msg when there were none.
func (l *Logger) closeWindow(msg string) {
	l.mu.Lock()
	e, ok := l.events[msg]
	if !ok || l.stopped {
		l.mu.Unlock()
		return
	}
	if e.held == 0 {
		delete(l.events, msg)
		l.mu.Unlock()
		return
	}
	level, held, args := e.level, e.held, e.args
	e.held, e.args = 0, nil
	e.timer = time.AfterFunc(l.window, func() { l.closeWindow(msg) })
	l.mu.Unlock()
	l.logger.Log(level, l.summary(msg, held), args...)
}

func (l *Logger) summary(msg string, held int) string {
	return fmt.Sprintf("%s (%d more in the last %s)", msg, held, l.window)
}

// Stop reports every count still held and stops the windows' timers;
// later messages are logged as they come. Safe to call twice.
func (l *Logger) Stop() {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	l.stopped = true
	type line struct {
		level hclog.Level
		msg   string
		args  []any
	}
	var lines []line
	for msg, e := range l.events {
		e.timer.Stop()
		if e.held > 0 {
			lines = append(lines, line{e.level, l.summary(msg, e.held), e.args})
		}
	}
	l.events = nil
	l.mu.Unlock()
	for _, ln := range lines {
		l.logger.Log(ln.level, ln.msg, ln.args...)
	}
}
