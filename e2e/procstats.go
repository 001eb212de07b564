//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process figures the bad-input and storm suites judge agents by: resident
// memory read from /proc, goroutines and Raft indexes read from the
// agent's own API, and a memory guard that keeps a runaway agent from
// taking the shared machine down with it.

// PID returns the pid of the running process, 0 if none runs.
func (a *Agent) PID() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.running || a.proc == nil {
		return 0
	}
	return a.proc.Pid
}

// procRSS returns a process's resident set size in bytes (VmRSS).
func procRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("pid %d: unexpected VmRSS line %q", pid, sc.Text())
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("pid %d: VmRSS %q: %w", pid, fields[0], err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("pid %d: no VmRSS (a zombie?)", pid)
}

// procMem is what /proc/<pid>/status says of a process's memory: its
// resident set, split into anonymous memory (heap, stacks) and file-backed
// pages (the binary's code and data, faulted in as paths first run), and
// its OS threads.
type procMem struct {
	RSS, Anon, File int64
	Threads         int
}

// readProcMem reads a process's procMem.
func readProcMem(pid int) (procMem, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procMem{}, err
	}
	var m procMem
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			m.RSS = n << 10
		case "RssAnon":
			m.Anon = n << 10
		case "RssFile":
			m.File = n << 10
		case "Threads":
			m.Threads = int(n)
		}
	}
	if m.RSS == 0 {
		return m, fmt.Errorf("pid %d: no VmRSS (a zombie?)", pid)
	}
	return m, nil
}

// RSS returns the agent's resident set size in bytes.
func (a *Agent) RSS() (int64, error) {
	pid := a.PID()
	if pid == 0 {
		return 0, fmt.Errorf("agent %s is not running", a.Name)
	}
	return procRSS(pid)
}

// mib renders a byte count in MiB for logs.
func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// selfStats is the part of /v1/agent/self the suites read.
type selfStats struct {
	Stats map[string]map[string]string
}

// AgentRuntime is what an agent reports about itself.
type AgentRuntime struct {
	// Goroutines is runtime.NumGoroutine() in the agent.
	Goroutines int
	// RaftLastIndex is the last index in the server's Raft log (0 on a
	// client-only agent).
	RaftLastIndex uint64
	// RaftApplied is the last index the server's FSM applied.
	RaftApplied uint64
}

// ReadRuntime reads /v1/agent/self of the agent at base.
func ReadRuntime(base string) (*AgentRuntime, error) {
	var s selfStats
	if err := GetJSON(base, "/v1/agent/self", &s); err != nil {
		return nil, err
	}
	out := &AgentRuntime{}
	g, err := strconv.Atoi(s.Stats["runtime"]["goroutines"])
	if err != nil {
		return nil, fmt.Errorf("%s: goroutines %q: %w", base, s.Stats["runtime"]["goroutines"], err)
	}
	out.Goroutines = g
	if raft := s.Stats["raft"]; raft != nil {
		if out.RaftLastIndex, err = strconv.ParseUint(raft["last_log_index"], 10, 64); err != nil {
			return nil, fmt.Errorf("%s: raft last_log_index %q: %w", base, raft["last_log_index"], err)
		}
		if out.RaftApplied, err = strconv.ParseUint(raft["applied_index"], 10, 64); err != nil {
			return nil, fmt.Errorf("%s: raft applied_index %q: %w", base, raft["applied_index"], err)
		}
	}
	return out, nil
}

// memGuardCap is the resident memory at which the guard kills an agent.
// It is not a bound any test asserts (theirs are far lower); it keeps an
// agent that a bad input sends into unbounded growth (the issue saw 2.3 GB
// and counting) from exhausting a machine that others share.
const memGuardCap = 1 << 30

// memGuard polls the resident memory of a set of agents, remembers each
// one's peak since the last reset, and SIGKILLs any agent above its cap.
type memGuard struct {
	cap  int64
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	agents []*Agent
	peak   map[*Agent]int64
	killed map[*Agent]int64 // RSS at which the guard killed the agent
}

// memGuardGap is how often the guard reads every agent's RSS. Growth of
// 100 MB/s overshoots the cap by at most a few MB.
const memGuardGap = 25 * time.Millisecond

// guardMemory starts a guard over agents (more can be added) until the
// test ends.
func guardMemory(t testing.TB, limit int64, agents ...*Agent) *memGuard {
	g := &memGuard{
		cap:    limit,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		agents: agents,
		peak:   make(map[*Agent]int64),
		killed: make(map[*Agent]int64),
	}
	go g.run()
	t.Cleanup(func() {
		close(g.stop)
		<-g.done
		g.mu.Lock()
		defer g.mu.Unlock()
		for a, rss := range g.killed {
			t.Logf("e2e: memory guard killed %s at %s (cap %s)", a.Name, mib(rss), mib(g.cap))
		}
	})
	return g
}

// add guards more agents.
func (g *memGuard) add(agents ...*Agent) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.agents = append(g.agents, agents...)
}

func (g *memGuard) run() {
	defer close(g.done)
	tick := time.NewTicker(memGuardGap)
	defer tick.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-tick.C:
		}
		g.mu.Lock()
		agents := append([]*Agent(nil), g.agents...)
		g.mu.Unlock()
		for _, a := range agents {
			rss, err := a.RSS()
			if err != nil {
				continue // not running
			}
			g.mu.Lock()
			if rss > g.peak[a] {
				g.peak[a] = rss
			}
			over := rss > g.cap
			if over {
				g.killed[a] = rss
			}
			g.mu.Unlock()
			if over {
				_ = a.Signal(syscall.SIGKILL)
			}
		}
	}
}

// reset starts a new peak for each agent at its current RSS.
func (g *memGuard) reset(agents ...*Agent) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, a := range agents {
		rss, _ := a.RSS()
		g.peak[a] = rss
	}
}

// peakOf is the highest RSS seen for a since the last reset.
func (g *memGuard) peakOf(a *Agent) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.peak[a]
}

// killedAt reports whether the guard killed a, and at what RSS.
func (g *memGuard) killedAt(a *Agent) (int64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	rss, ok := g.killed[a]
	return rss, ok
}

// forget clears a's kill record once it has been reported.
func (g *memGuard) forget(a *Agent) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.killed, a)
}

// logOffset is the current size of an agent's log, so lines written after
// it can be counted.
func (a *Agent) logOffset() int64 {
	st, err := os.Stat(a.LogPath)
	if err != nil {
		return 0
	}
	return st.Size()
}

// logLinesSince returns the log lines written after offset that contain
// every one of subs.
func (a *Agent) logLinesSince(offset int64, subs ...string) []string {
	b, err := os.ReadFile(a.LogPath)
	if err != nil || int64(len(b)) < offset {
		return nil
	}
	var out []string
	for _, line := range bytes.Split(b[offset:], []byte("\n")) {
		ok := len(line) > 0
		for _, s := range subs {
			if !bytes.Contains(line, []byte(s)) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, string(line))
		}
	}
	return out
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's CPU
// times (100 on every Linux this runs on).
const clockTicks = 100

// procCPU returns the CPU time (user + system) a process has used.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is field 3, utime 14 and stime 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("pid %d: bad stat %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("pid %d: short stat %q", pid, s)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("pid %d: stat times: %w", pid, err)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// selfCPU returns the CPU time this test process has used.
func selfCPU() time.Duration {
	d, _ := procCPU(os.Getpid())
	return d
}

// agentsCPU returns the CPU time the running agents have used between
// them.
func agentsCPU(agents []*Agent) time.Duration {
	var sum time.Duration
	for _, a := range agents {
		if pid := a.PID(); pid != 0 {
			d, _ := procCPU(pid)
			sum += d
		}
	}
	return sum
}
