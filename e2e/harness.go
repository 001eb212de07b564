//go:build e2e

// Package e2e runs Roam end to end. The harness builds the roam binary once
// per test binary, starts real agent processes on 127.0.0.1 (one directory,
// config file, data dir and log file per agent), and drives them through the
// HTTP API and the CLI. Every process is stopped in t.Cleanup; when a test
// fails, the tail of every agent's log is printed with t.Log.
//
// Run with: go test -tags e2e -count=1 -v ./e2e/
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Bounds used throughout the harness. They are deadlines for polling, not
// expectations of how long things take.
const (
	// startTimeout bounds the wait for an agent's HTTP API to answer.
	startTimeout = 30 * time.Second
	// leaderTimeout bounds the wait for the servers to agree on a leader.
	leaderTimeout = 30 * time.Second
	// stopTimeout bounds the wait after SIGTERM before SIGKILL.
	stopTimeout = 15 * time.Second
	// killTimeout bounds the wait for a process to die after SIGKILL.
	killTimeout = 10 * time.Second
	// cliTimeout bounds one CLI invocation.
	cliTimeout = 30 * time.Second
	// pollGap is the pause between two checks of a condition.
	pollGap = 100 * time.Millisecond
	// logTailLines is how much of each agent's log a failed test prints.
	logTailLines = 200
)

// EnvBinary names an environment variable holding a prebuilt roam binary to
// use instead of building one.
const EnvBinary = "ROAM_E2E_BINARY"

var build struct {
	once     sync.Once
	dir      string // temp dir holding the binary, removed by cleanupBuild
	bin      string
	err      error
	commands map[string]bool // CLI subcommands, from the binary's usage
}

// roamBinary returns the path of the roam binary, building it on first use.
func roamBinary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		build.bin, build.err = buildRoam()
		if build.err == nil {
			build.commands = listCommands(build.bin)
		}
	})
	if build.err != nil {
		t.Fatalf("e2e: %v", build.err)
	}
	return build.bin
}

func buildRoam() (string, error) {
	if bin := os.Getenv(EnvBinary); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			return "", fmt.Errorf("%s=%q: %w", EnvBinary, bin, err)
		}
		if _, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("%s=%q: %w", EnvBinary, bin, err)
		}
		return abs, nil
	}
	// Tests run in the package directory; the module root is its parent.
	root, err := filepath.Abs("..")
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("cannot find the module root from %s: %w", root, err)
	}
	dir, err := os.MkdirTemp("", "roam-e2e-bin-")
	if err != nil {
		return "", err
	}
	build.dir = dir
	bin := filepath.Join(dir, "roam")
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	args := []string{"build", "-o", bin}
	if os.Getenv(nomadEnvDisableControllerFence) == "1" || os.Getenv(nomadEnvDisableRaftLogGuard) == "1" {
		// Only a roamfaults build reads the switches that turn the
		// controller fences or the raft log guard off (docs/faults.md).
		args = append(args, "-tags", "roamfaults")
	}
	cmd := exec.Command(gobin, append(args, ".")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build roam: %w\n%s", err, out)
	}
	return bin, nil
}

// cleanupBuild removes the built binary; TestMain calls it after the run.
func cleanupBuild() {
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
}

// listCommands reads the subcommand names from the binary's usage text, so
// RunCLI can put -address right after them. Usage lines look like
// "    node status      Synopsis": the name is the first column.
func listCommands(bin string) map[string]bool {
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	cmds := make(map[string]bool)
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "    ") {
			continue
		}
		line = strings.TrimSpace(line)
		name := line
		if i := strings.Index(line, "  "); i >= 0 {
			name = line[:i]
		}
		if name != "" {
			cmds[name] = true
		}
	}
	return cmds
}

// ports hands out free 127.0.0.1 ports, never the same one twice in one
// test binary, so tests running in parallel own their ports.
var ports struct {
	mu     sync.Mutex
	issued map[int]bool
}

// FreePorts returns n distinct ports that were free a moment ago.
//
// They come from below the kernel's ephemeral range (ip_local_port_range,
// 32768-60999 by default), which is where port 0 would land and where
// every outgoing connection takes its local port: a port picked there
// could be taken by some agent's dial in the moment between this check
// and the agent's own bind (seen once: "bind: address already in use").
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports.mu.Lock()
	defer ports.mu.Unlock()
	if ports.issued == nil {
		ports.issued = make(map[int]bool)
	}
	var (
		out []int
		lns []net.Listener
	)
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	lo, hi := testPortRange()
	for tries := 0; len(out) < n; tries++ {
		if tries > 100*n {
			t.Fatalf("e2e: could not find %d free ports in %d-%d", n, lo, hi)
		}
		p := lo + mrand.IntN(hi-lo)
		if ports.issued[p] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue // someone else's
		}
		// Hold every listener until all are picked.
		lns = append(lns, ln)
		ports.issued[p] = true
		out = append(out, p)
	}
	return out
}

// testPortRange is where FreePorts picks: from 20000 up to the start of
// the ephemeral range.
func testPortRange() (lo, hi int) {
	lo, hi = 20000, 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) == 2 {
		if start, err := strconv.Atoi(f[0]); err == nil && start > lo+1000 {
			hi = start
		}
	}
	return lo, hi
}

// WaitFor polls cond every pollGap until it returns nil, and fails the test
// with cond's last error if that does not happen within timeout.
func WaitFor(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	if err := poll(timeout, cond); err != nil {
		t.Fatalf("e2e: condition not met within %s: %v", timeout, err)
	}
}

// poll is WaitFor returning the error instead of failing.
func poll(timeout time.Duration, cond func() error) error {
	return pollEvery(timeout, pollGap, cond)
}

// pollEvery is poll with its own gap between checks.
func pollEvery(timeout, gap time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(gap) // the gap between two polls, not a wait for an event
	}
}

// watchAgents returns after d, or as soon as one of agents exits: an
// observation window that ends early on a death instead of sampling.
func watchAgents(d time.Duration, agents ...*Agent) {
	stop := make(chan struct{})
	defer close(stop)
	exited := make(chan struct{}, len(agents))
	for _, a := range agents {
		done := a.Done()
		go func() {
			select {
			case <-done:
				exited <- struct{}{}
			case <-stop:
			}
		}()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-exited:
	}
}

// Agent is one roam process: its directory, ports, log, and the running
// process if any. An agent can be stopped and started again with the same
// arguments, data dir and ports.
type Agent struct {
	Name string
	// Dir holds the agent's config files, data dir and log.
	Dir     string
	DataDir string
	LogPath string
	// Args are the arguments after the binary, e.g. agent -config FILE.
	Args     []string
	HTTPPort int
	RPCPort  int
	// IP is the loopback address the agent binds (and dials from);
	// 127.0.0.1 when empty. Agents with addresses of their own can be cut
	// apart with a netFaults.
	IP string
	// Bin is the roam binary the agent starts, the one under test when
	// empty (a rolling upgrade starts agents on an older one).
	Bin string

	t testing.TB

	mu      sync.Mutex
	running bool
	// paused is set while the process is stopped with SIGSTOP.
	paused bool
	proc   *os.Process
	done   chan struct{} // closed when the current process has exited
	state  *os.ProcessState
	starts int
}

// NewAgent prepares (but does not start) an agent named name whose files
// live in dir.
func NewAgent(t testing.TB, name, dir string, httpPort, rpcPort int, args ...string) *Agent {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("e2e: %v", err)
	}
	return &Agent{
		Name:     name,
		Dir:      dir,
		DataDir:  filepath.Join(dir, "data"),
		LogPath:  filepath.Join(dir, "agent.log"),
		Args:     args,
		HTTPPort: httpPort,
		RPCPort:  rpcPort,
		t:        t,
	}
}

// HTTPAddr is the agent's HTTP API base URL.
func (a *Agent) HTTPAddr() string { return "http://" + a.ip() + ":" + strconv.Itoa(a.HTTPPort) }

// RPCAddr is the agent's RPC address as servers advertise it.
func (a *Agent) RPCAddr() string { return a.ip() + ":" + strconv.Itoa(a.RPCPort) }

func (a *Agent) ip() string {
	if a.IP == "" {
		return "127.0.0.1"
	}
	return a.IP
}

// Pause freezes the process with SIGSTOP: it holds its sockets and state
// but runs nothing, as a machine stalled by the hypervisor or a long GC.
func (a *Agent) Pause() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.running {
		return fmt.Errorf("agent %s is not running", a.Name)
	}
	if err := a.proc.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pause %s: %w", a.Name, err)
	}
	a.paused = true
	return nil
}

// Paused reports whether the process is frozen by Pause.
func (a *Agent) Paused() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.running && a.paused
}

// Resume lets a paused process run again with SIGCONT.
func (a *Agent) Resume() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.running || !a.paused {
		return nil
	}
	if err := a.proc.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("resume %s: %w", a.Name, err)
	}
	a.paused = false
	return nil
}

// Start starts the process. Its stdout and stderr are appended to LogPath.
func (a *Agent) Start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	bin := a.Bin
	if bin == "" {
		bin = roamBinary(a.t)
	}
	if a.running {
		return fmt.Errorf("agent %s is already running (pid %d)", a.Name, a.proc.Pid)
	}
	logf, err := os.OpenFile(a.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	a.starts++
	fmt.Fprintf(logf, "==== e2e: start #%d of %s at %s: %s %s\n",
		a.starts, a.Name, time.Now().Format(time.RFC3339Nano), bin, strings.Join(a.Args, " "))

	// Anything the agent puts in the temp dir (a -dev data dir) stays under
	// the test's directory.
	tmp := filepath.Join(a.Dir, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		logf.Close()
		return err
	}
	cmd := exec.Command(bin, a.Args...)
	cmd.Dir = a.Dir
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()

	// Start and Wait on one locked OS thread: with a parent-death signal
	// (Linux), the child is killed if the thread that started it exits, so
	// that thread must live as long as the child does.
	started := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			logf.Close()
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
		fmt.Fprintf(logf, "==== e2e: %s exited at %s: %s\n", a.Name, time.Now().Format(time.RFC3339Nano), cmd.ProcessState)
		logf.Close()
		a.mu.Lock()
		a.running = false
		a.paused = false
		a.state = cmd.ProcessState
		a.mu.Unlock()
		close(done)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start %s: %w", a.Name, err)
	}
	a.running = true
	a.proc = cmd.Process
	a.done = done
	a.state = nil
	return nil
}

// Running reports whether the process is alive.
func (a *Agent) Running() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.running
}

// Done is closed when the current (or last) process has exited.
func (a *Agent) Done() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return a.done
}

// Signal sends sig to the running process.
func (a *Agent) Signal(sig syscall.Signal) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.running {
		return fmt.Errorf("agent %s is not running", a.Name)
	}
	// os.Process.Signal never signals a reaped (possibly reused) pid.
	return a.proc.Signal(sig)
}

// Wait waits up to timeout for the process to exit and returns its exit
// code (-1 if a signal killed it).
func (a *Agent) Wait(timeout time.Duration) (int, error) {
	done := a.Done()
	select {
	case <-done:
	default:
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		select {
		case <-done:
		case <-timer.C:
			return 0, fmt.Errorf("agent %s still running after %s", a.Name, timeout)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state == nil {
		return 0, fmt.Errorf("agent %s was never started", a.Name)
	}
	return a.state.ExitCode(), nil
}

// ExitState describes how the last process ended ("" while running).
func (a *Agent) ExitState() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state == nil {
		return ""
	}
	return a.state.String()
}

// Stop sends SIGTERM, waits up to timeout, then SIGKILLs. It returns the
// exit code and whether SIGKILL was needed.
func (a *Agent) Stop(timeout time.Duration) (code int, killed bool, err error) {
	if !a.Running() {
		code, err = a.Wait(0)
		return code, false, err
	}
	// A frozen process would hold SIGTERM until the deadline.
	_ = a.Resume()
	_ = a.Signal(syscall.SIGTERM)
	if code, err := a.Wait(timeout); err == nil {
		return code, false, nil
	}
	_ = a.Signal(syscall.SIGKILL)
	code, err = a.Wait(killTimeout)
	return code, true, err
}

// WaitHTTP waits until the agent's HTTP listener answers any HTTP request,
// failing early if the process exits.
func (a *Agent) WaitHTTP(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	done := a.Done()
	for {
		select {
		case <-done:
			return fmt.Errorf("agent %s exited during startup (%s)", a.Name, a.ExitState())
		default:
		}
		resp, err := httpClient.Get(a.HTTPAddr() + "/v1/status/leader")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent %s: HTTP API at %s not answering after %s: %w", a.Name, a.HTTPAddr(), timeout, err)
		}
		select {
		case <-done:
		case <-time.After(pollGap):
		}
	}
}

// LogTail returns the last n lines of the agent's log.
func (a *Agent) LogTail(n int) string {
	f, err := os.Open(a.LogPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 4<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 2*n {
			lines = append(lines[:0], lines[len(lines)-n:]...)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Log returns the whole log.
func (a *Agent) Log() string {
	b, err := os.ReadFile(a.LogPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(b)
}

// stopAndReport stops every agent in parallel and, if the test failed,
// prints the tail of each one's log. Registered with t.Cleanup.
func stopAndReport(t testing.TB, agents []*Agent) {
	var wg sync.WaitGroup
	notes := make([]string, len(agents))
	for i, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wasRunning := a.Running()
			code, killed, err := a.Stop(stopTimeout)
			switch {
			case err != nil && wasRunning:
				notes[i] = fmt.Sprintf("%s: stop: %v", a.Name, err)
			case killed:
				notes[i] = fmt.Sprintf("%s: did not exit within %s of SIGTERM; killed", a.Name, stopTimeout)
			case wasRunning && code != 0:
				notes[i] = fmt.Sprintf("%s: exited with code %d after SIGTERM", a.Name, code)
			}
		}()
	}
	wg.Wait()
	for _, n := range notes {
		if n != "" {
			t.Log("e2e: " + n)
		}
	}
	keepLogs(t, agents)
	if !t.Failed() {
		return
	}
	for _, a := range agents {
		t.Logf("==== e2e: %s (%s), last %d lines ====\n%s", a.Name, a.LogPath, logTailLines, a.LogTail(logTailLines))
	}
}

// StartAgent starts one agent with the given roam arguments (for example
// "agent", "-dev", ...) in its own directory and ports, waits for its HTTP
// API, and stops it when the test ends.
func StartAgent(t testing.TB, name string, httpPort, rpcPort int, args ...string) *Agent {
	t.Helper()
	a := NewAgent(t, name, filepath.Join(t.TempDir(), name), httpPort, rpcPort, args...)
	t.Cleanup(func() { stopAndReport(t, []*Agent{a}) })
	if err := a.Start(); err != nil {
		t.Fatalf("e2e: %v", err)
	}
	if err := a.WaitHTTP(startTimeout); err != nil {
		t.Fatalf("e2e: %v", err)
	}
	return a
}

// RunRoam runs the roam binary with args (not as a long-lived agent) and
// returns its stdout, stderr and exit code. A run that outlives timeout is
// killed and reported with code -1.
func RunRoam(t testing.TB, timeout time.Duration, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	bin := roamBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &errOut
	err := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return out.String(), errOut.String() + fmt.Sprintf("\n(e2e: killed after %s)", timeout), -1
	case errors.As(err, &exitErr):
		return out.String(), errOut.String(), exitErr.ExitCode()
	case err != nil:
		t.Fatalf("e2e: run roam %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errOut.String(), 0
}

// EnvKeepLogs names a directory into which a failed test's agent logs are
// copied whole (its temporary directory is removed when it ends; the
// tails printed on failure are often too short to find a cause). With
// EnvKeepLogsAlways set too, every test's logs are kept.
const (
	EnvKeepLogs       = "ROAM_E2E_KEEP_LOGS"
	EnvKeepLogsAlways = "ROAM_E2E_KEEP_LOGS_ALWAYS"
)

// exitMetricsFile is where an agent leaves its metrics as it stops
// (command/agent.ExitMetricsFile, in its data dir).
const exitMetricsFile = "metrics-at-exit.prom"

// keepLogs copies each agent's log and exit metrics under EnvKeepLogs.
func keepLogs(t testing.TB, agents []*Agent) {
	root := os.Getenv(EnvKeepLogs)
	if root == "" || (!t.Failed() && os.Getenv(EnvKeepLogsAlways) == "") {
		return
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	dir := filepath.Join(root, fmt.Sprintf("%s-%s", name, time.Now().UTC().Format("20060102T150405")))
	for _, a := range agents {
		for _, src := range []string{a.LogPath, filepath.Join(a.DataDir, exitMetricsFile)} {
			buf, err := os.ReadFile(src)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err == nil {
				err = os.MkdirAll(filepath.Join(dir, a.Name), 0o755)
			}
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, a.Name, filepath.Base(src)), buf, 0o644)
			}
			if err != nil {
				t.Logf("e2e: keep %s's %s: %v", a.Name, filepath.Base(src), err)
			}
		}
	}
	t.Logf("e2e: agent logs kept in %s", dir)
}
