//go:build e2e && storm

package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The storm's generator runs in a process of its own: this test binary,
// started again with stormGenEnv set, which init below turns into the
// generator before any test runs. In the test's own process the
// generator's CPU (a few hundred connections a second, 4 MiB bodies)
// would share the Go runtime, its scheduler and its garbage collector
// with the claim loop whose latency is being measured, and some of the
// "storm's cost" would be the loop waiting behind the generator rather
// than behind the agents. As a process of its own it still shares the
// machine's cores with everything else, as an attacker on the same host
// would (in a scheduling group of its own: see stormGenProcAttr), and its
// CPU is counted on its own.
//
// The parent speaks to it over the child's stdin and stdout, one line
// each way per command:
//
//	warm            -> ok          one of each kind of traffic, then one
//	                               round of all at once (storm.warm)
//	storm <millis> [kinds]  -> ok  the storm for that long (storm.run),
//	                               only the kinds named (comma-separated)
//	                               if any are
//	summary         -> {json}      counts and first errors so far
//
// and closes stdin to end it. ROAM_STORM_ONLY is read by the child, which
// inherits it.

// stormGenEnv holds the generator's targets, as JSON, in the child.
const stormGenEnv = "ROAM_STORM_GENERATOR"

// stormTargets are the addresses the storm is aimed at.
type stormTargets struct {
	RPCAddrs  []string // servers' RPC host:port
	HTTPAddrs []string // servers' HTTP host:port
	HTTPBases []string // every agent's HTTP base URL
}

// stormReport is the generator's answer to "summary".
type stormReport struct {
	Counts map[string]int
	Errors []string
}

func init() {
	spec := os.Getenv(stormGenEnv)
	if spec == "" {
		return
	}
	if err := serveStormGenerator(spec, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "storm generator: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// serveStormGenerator is the generator process: it answers the parent's
// commands from in on out until in ends.
func serveStormGenerator(spec string, in io.Reader, out io.Writer) error {
	var tg stormTargets
	if err := json.Unmarshal([]byte(spec), &tg); err != nil {
		return fmt.Errorf("targets: %w", err)
	}
	st := newStorm(tg)
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		switch cmd {
		case "warm":
			st.warm()
			fmt.Fprintln(out, "ok")
		case "storm":
			arg, kinds, _ := strings.Cut(arg, " ")
			ms, err := strconv.Atoi(arg)
			if err != nil || ms <= 0 {
				return fmt.Errorf("storm: bad duration %q", arg)
			}
			only := os.Getenv("ROAM_STORM_ONLY")
			if kinds != "" {
				only = kinds
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(ms)*time.Millisecond)
			st.run(ctx, only)
			cancel()
			fmt.Fprintln(out, "ok")
		case "summary":
			st.mu.Lock()
			rep := stormReport{Counts: maps.Clone(st.counts)}
			st.mu.Unlock()
			rep.Errors = st.errors()
			b, err := json.Marshal(rep)
			if err != nil {
				return err
			}
			fmt.Fprintln(out, string(b))
		default:
			return fmt.Errorf("unknown command %q", sc.Text())
		}
	}
	return sc.Err()
}

// stormProc is the parent's handle on the generator process.
type stormProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// startStormProc starts the generator aimed at tg; it ends with the test.
func startStormProc(t *testing.T, tg stormTargets) *stormProc {
	t.Helper()
	spec, err := json.Marshal(tg)
	if err != nil {
		t.Fatalf("storm targets: %v", err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("storm generator: %v", err)
	}
	// -test.run matches nothing: were init not to take over, the child
	// would run no test rather than this one again.
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), stormGenEnv+"="+string(spec))
	cmd.SysProcAttr = stormGenProcAttr()
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatalf("storm generator: %v", err)
	}
	outR, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("storm generator: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("storm generator: %v", err)
	}
	p := &stormProc{cmd: cmd, in: in, out: bufio.NewScanner(outR)}
	p.out.Buffer(make([]byte, 64<<10), 4<<20)
	t.Cleanup(func() {
		_ = p.in.Close() // the generator ends at the end of its input
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Logf("storm generator exited: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Logf("storm generator did not end with its input; killed")
		}
	})
	return p
}

// ask sends one command and returns the generator's one-line answer.
func (p *stormProc) ask(cmd string) (string, error) {
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		return "", fmt.Errorf("storm generator: %s: %w", cmd, err)
	}
	if !p.out.Scan() {
		err := p.out.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return "", fmt.Errorf("storm generator: %s: no answer: %w", cmd, err)
	}
	return p.out.Text(), nil
}

// warm sends one of each kind of traffic (see storm.warm).
func (p *stormProc) warm() error {
	_, err := p.ask("warm")
	return err
}

// run runs the storm for d and returns once its connections are closed.
// kinds, if any, are the only generators that run.
func (p *stormProc) run(d time.Duration, kinds ...string) error {
	cmd := "storm " + strconv.FormatInt(d.Milliseconds(), 10)
	if len(kinds) > 0 {
		cmd += " " + strings.Join(kinds, ",")
	}
	_, err := p.ask(cmd)
	return err
}

// report is what the generator has sent so far.
func (p *stormProc) report() (stormReport, error) {
	var rep stormReport
	line, err := p.ask("summary")
	if err != nil {
		return rep, err
	}
	if err := json.Unmarshal([]byte(line), &rep); err != nil {
		return rep, fmt.Errorf("storm generator: summary %q: %w", line, err)
	}
	return rep, nil
}

// autogroupOf names the scheduling group of process pid ("?" where
// there is none to read).
func autogroupOf(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/autogroup", pid))
	if err != nil {
		return "?"
	}
	g, _, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	return strings.TrimPrefix(g, "/")
}

// cpu is the CPU time the generator has used.
func (p *stormProc) cpu() time.Duration {
	d, _ := procCPU(p.cmd.Process.Pid)
	return d
}

// summary formats counts as kind=n, sorted by kind.
func (r stormReport) summary() string {
	keys := make([]string, 0, len(r.Counts))
	for k := range r.Counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r.Counts[k]))
	}
	return strings.Join(parts, " ")
}

// storm sends bad traffic at a cluster. Every generator is a fixed number
// of workers with a pause or a deadline between their sends, so the storm
// is bounded in connections at any moment and in rate.
type storm struct {
	rpcAddrs   []string // servers' RPC ports
	httpAddrs  []string // servers' HTTP host:port
	httpBases  []string // every agent's HTTP base URL
	groupsJSON []byte
	groupsRPC  []byte
	nested     []byte
	seq        atomic.Int64
	nextByte   atomic.Int64

	mu     sync.Mutex
	counts map[string]int
	// firstErr is the first error of each outcome that is not a refusal.
	firstErr map[string]string
}

// countErr counts an outcome and keeps its first error.
func (s *storm) countErr(what string, err error) {
	s.count(what)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.firstErr[what]; !ok && err != nil {
		s.firstErr[what] = err.Error()
	}
}

// errors returns the first error of each outcome that had one.
func (s *storm) errors() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, v := range s.firstErr {
		out = append(out, k+": "+v)
	}
	sort.Strings(out)
	return out
}

func newStorm(tg stormTargets) *storm {
	return &storm{
		rpcAddrs:   tg.RPCAddrs,
		httpAddrs:  tg.HTTPAddrs,
		httpBases:  tg.HTTPBases,
		groupsJSON: emptyGroupsJobJSON("storm-groups", 4<<20),
		groupsRPC:  emptyGroupsRegisterFrame("storm-groups", 4<<20-64),
		nested:     nestedParseBody(100_000),
		counts:     map[string]int{},
		firstErr:   map[string]string{},
	}
}

func (s *storm) count(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[what]++
}

// Generator sizes: workers each, every one from its own source address
// (under the per-address connection caps).
const (
	stormJunkWorkers     = 4   // random bytes under each first byte
	stormPartialWorkers  = 20  // partial RPC frames; as many partial Raft frames
	stormSlowWorkers     = 20  // slow HTTP bodies
	stormBlockingWorkers = 100 // blocking queries hanging up after 2 s
	// stormJunkGap paces each junk worker: 4 workers, at most 200
	// connections a second.
	stormJunkGap = 20 * time.Millisecond
	// stormBigGap paces the nested-HCL and oversized-job workers.
	stormBigGap = 500 * time.Millisecond
	// stormRefusedGap is a worker's pause after its agent refused the
	// connection or failed the request.
	stormRefusedGap = 100 * time.Millisecond
)

// stormGen is one kind of bad traffic: send sends one of it (and paces
// itself) from src until ctx ends.
type stormGen struct {
	name    string
	workers int
	send    func(ctx context.Context, src string)
}

// gens are the storm's kinds of traffic.
func (s *storm) gens() []stormGen {
	pick := func(list []string) string { return list[mrand.IntN(len(list))] }
	sleep := func(ctx context.Context, d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	held := biFrameTimeout + closeSlack
	// outcome counts a held connection's end: closed by the agent, still
	// open at the test's limit ("held"), or not even opened ("refused",
	// after which the worker backs off: a dead agent is not to be spun on).
	outcome := func(ctx context.Context, kind string, err error) {
		var oe *net.OpError
		switch {
		case ctx.Err() != nil || windowOver(ctx):
			s.count(kind + "-cut")
		case err == nil:
			s.count(kind)
		case errors.As(err, &oe) && oe.Op == "dial":
			s.countErr(kind+"-refused", err)
			sleep(ctx, stormRefusedGap)
		default:
			s.countErr(kind+"-held", err)
		}
	}
	// refused counts an answer to a big bad input: a 4xx is a refusal,
	// and so is the connection closed under a body too large to read;
	// anything else is not.
	refused := func(ctx context.Context, kind string, ans *httpAnswer, err error) {
		var oe *net.OpError
		switch {
		case ctx.Err() != nil:
			s.count(kind + "-cut")
		case err != nil && isClosedErr(err) && !(errors.As(err, &oe) && oe.Op == "dial"):
			s.count(kind + "-closed")
		case err != nil:
			s.countErr(kind+"-failed", err)
			sleep(ctx, stormRefusedGap)
		case ans.Status/100 == 4:
			s.count(kind)
		default:
			s.count(fmt.Sprintf("%s-answered-%d", kind, ans.Status))
		}
	}
	return []stormGen{
		{"junk", stormJunkWorkers, func(ctx context.Context, src string) {
			junk := make([]byte, 1+mrand.IntN(512))
			_, _ = rand.Read(junk)
			junk[0] = byte(s.nextByte.Add(1))
			_, err := holdOpen(ctx, src, pick(s.rpcAddrs), junk, held)
			outcome(ctx, "junk", err)
			sleep(ctx, stormJunkGap)
		}},
		{"partial-rpc", stormPartialWorkers, func(ctx context.Context, src string) {
			_, err := holdOpen(ctx, src, pick(s.rpcAddrs), partialRPCFrame(), held)
			outcome(ctx, "partial-rpc", err)
		}},
		{"partial-raft", stormPartialWorkers, func(ctx context.Context, src string) {
			_, err := holdOpen(ctx, src, pick(s.rpcAddrs), partialRaftFrame(), held)
			outcome(ctx, "partial-raft", err)
		}},
		{"slow-body", stormSlowWorkers, func(ctx context.Context, src string) {
			_, _, err := slowBody(ctx, src, pick(s.httpAddrs), biBodyTimeout+closeSlack)
			outcome(ctx, "slow-body", err)
		}},
		{"blocking", stormBlockingWorkers, func(ctx context.Context, src string) {
			qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			// An index far ahead: the query waits its full time.
			if err := blockingQueryUntil(qctx, src, "http://"+pick(s.httpAddrs), 1<<40); err != nil && ctx.Err() == nil {
				s.countErr("blocking-error", err)
				sleep(ctx, stormRefusedGap)
				return
			}
			s.count("blocking")
		}},
		{"nested-hcl", 1, func(ctx context.Context, src string) {
			ans, err := sendHTTPCtx(ctx, httpFrom(src, time.Minute), http.MethodPut, pick(s.httpBases)+"/v1/jobs/parse", s.nested)
			refused(ctx, "nested-hcl", ans, err)
			sleep(ctx, stormBigGap)
		}},
		{"groups-json", 1, func(ctx context.Context, src string) {
			ans, err := sendHTTPCtx(ctx, httpFrom(src, time.Minute), http.MethodPut, "http://"+pick(s.httpAddrs)+"/v1/jobs", s.groupsJSON)
			refused(ctx, "groups-json", ans, err)
			sleep(ctx, 3*stormBigGap)
		}},
		{"groups-rpc", 1, func(ctx context.Context, src string) {
			ans, err := rawRPCCtx(ctx, src, pick(s.rpcAddrs), s.groupsRPC, time.Minute)
			switch {
			case ctx.Err() != nil:
				s.count("groups-rpc-cut")
			case err != nil:
				s.countErr("groups-rpc-failed", err)
				sleep(ctx, stormRefusedGap)
			case ans.Closed || ans.Error != "":
				s.count("groups-rpc")
			default:
				s.count("groups-rpc-accepted")
			}
			sleep(ctx, 3*stormBigGap)
		}},
		{"huge-count", 1, func(ctx context.Context, src string) {
			id := fmt.Sprintf("storm-count-%d", s.seq.Add(1))
			ans, err := sendHTTPCtx(ctx, httpFrom(src, time.Minute), http.MethodPut, "http://"+pick(s.httpAddrs)+"/v1/jobs", hugeCountJob(id, 1<<62, "dc-nowhere"))
			refused(ctx, "huge-count", ans, err)
			sleep(ctx, 3*stormBigGap)
		}},
	}
}

// windowOver reports whether ctx's deadline has passed: a read cut by it
// may return a moment before ctx itself reports the end.
func windowOver(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// run sends the storm until ctx ends, and returns once every generator
// has closed its connections. Each worker sends from its own address.
//
// only, a comma-separated list of generator names, limits the storm to
// those kinds of traffic (for finding which one costs the claim loop
// most; ROAM_STORM_ONLY sets it for TestStorm); the acceptance run leaves
// it empty.
func (s *storm) run(ctx context.Context, only string) {
	var wg sync.WaitGroup
	src := 0
	for _, g := range s.gens() {
		if only != "" && !slices.Contains(strings.Split(only, ","), g.name) {
			src += g.workers
			continue
		}
		for range g.workers {
			a := attackerAddr(src)
			src++
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil && !windowOver(ctx) {
					g.send(ctx, a)
				}
			}()
		}
	}
	wg.Wait()
}

// warm sends one of each kind of traffic, one after another, then one
// round of the storm: every worker of every kind sends once, all at once.
// So every path the storm takes through the agents has run, alone and at
// the storm's concurrency, before the baseline is read: the first use of
// a path faults in its code and fills caches and pools, and the first
// hundred connections at once grow the runtime's stack and span pools
// and its heap to the size it then keeps (the Go runtime holds freed
// memory up to about its heap goal). That growth is not the storm's to
// answer for; what the twelve stormy windows leave beyond it is.
//
// Before job bodies were refused by their declared length, the one
// oversized body of the serial warm-up cost each agent a megabyte read,
// which grew the runtime as far by itself; without it, a baseline read
// after the serial warm-up alone is the runtime not yet at its working
// size, and 10 % above it is not "back".
func (s *storm) warm() {
	for i, g := range s.gens() {
		ctx, cancel := context.WithTimeout(context.Background(), biFrameTimeout+closeSlack)
		g.send(ctx, attackerAddr(240+i))
		cancel()
	}
	ctx, cancel := context.WithTimeout(context.Background(), biFrameTimeout+closeSlack)
	defer cancel()
	var wg sync.WaitGroup
	src := 0
	for _, g := range s.gens() {
		for range g.workers {
			a := attackerAddr(src)
			src++
			wg.Add(1)
			go func() {
				defer wg.Done()
				g.send(ctx, a)
			}()
		}
	}
	wg.Wait()
}
