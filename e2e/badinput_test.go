//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
)

// TestBadInput plays every row of issue 9's table against a real
// 1-server + 1-client cluster on disk whose client runs the built-in CSI
// plugin. Each row sends its bad input and then checks the same things:
// a clear 4xx naming the problem (or, on the raw ports, the connection
// closed); both agents still up, the server still naming its leader; the
// resident memory of each agent grown by less than the row's stated bound;
// the Raft log not one entry longer; nothing created or removed outside
// the data dirs. The last subtest restarts both agents on their data dirs
// and checks that the cluster comes back healthy.
//
// A row that crashes an agent fails, and the next row starts by
// restarting it, so one broken row does not hide the others. A memory
// guard kills any agent above memGuardCap: the bounds below are far lower,
// the guard only keeps a runaway agent from starving the machine.
func TestBadInput(t *testing.T) {
	e := startBadInputEnv(t)

	t.Run("NestedListsInParse", e.rowNestedParse)
	t.Run("EmptyGroupsRPCFrame", e.rowGroupsRPC)
	t.Run("EmptyGroupsHTTP", func(t *testing.T) { e.rowGroupsHTTP(t, 1) })
	t.Run("EmptyGroupsHTTPThreeAtOnce", func(t *testing.T) { e.rowGroupsHTTP(t, 3) })
	t.Run("VolumeIDEscape", e.rowVolumeIDEscape)
	t.Run("BlockingQueriesCallersHangUp", e.rowBlockingQueries)
	t.Run("HeldOpenConnections", e.rowHeldConnections)
	t.Run("ConnectionCaps", e.rowConnectionCaps)
	t.Run("BodyTimeoutSparesBlockingQueries", e.rowBlockingOutlivesBodyTimeout)
	t.Run("VolumeMountDestination", e.rowVolumeMountDestination)
	t.Run("BadFirstBytes", e.rowBadFirstBytes)
	t.Run("RawExecWithoutCommand", e.rowRawExecWithoutCommand)
	t.Run("VolumeCapacityOutOfRange", e.rowVolumeCapacity)
	// Last but one: an unfixed agent stores the job, and its evaluation
	// keeps growing the leader's memory, after a restart too.
	t.Run("HugeCountUnknownDatacenter", e.rowHugeCount)
	t.Run("RestartOnDataDir", e.rowRestart)
}

// TestBadInput_ForwardedBlockingQueries is the blocking-query row of
// TestBadInput on a follower of a 3-server cluster: the follower forwards
// each query to the leader, and when the callers hang up the queries must
// end on both. (The storm sends its blocking queries to every server, and
// saw them outlive their callers on the leader.)
func TestBadInput_ForwardedBlockingQueries(t *testing.T) {
	const queries = 1000
	c := StartCluster(t, Opts{Servers: 3, ServerConfigExtra: biLimits, LogLevel: "INFO"})
	leader := c.Leader()
	follower := (leader + 1) % len(c.Servers)
	guardMemory(t, memGuardCap, c.Servers...)
	hangUpBlockingQueries(t, c.Servers[follower], []*Agent{c.Servers[follower], c.Servers[leader]}, queries, 0)
	for _, s := range c.Servers {
		must.True(t, s.Running(), must.Sprintf("%s died: %s", s.Name, s.ExitState()))
	}
}

// Short limits for the rows that hold connections open, so that each
// deadline is seen to end them within seconds.
const (
	biHandshakeTimeout = 1 * time.Second
	biFrameTimeout     = 2 * time.Second
	biBodyTimeout      = 2 * time.Second
	// biMaxConnsPerClient is the connection cap per address (the default).
	biMaxConnsPerClient = 100
	// closeSlack is how much later than its deadline a held connection may
	// be seen closed: the agent's deadline fires on a busy 2-core machine
	// with a thousand other connections, and the test's reader must run.
	closeSlack = 3 * time.Second
)

// biLimits is the limits block both agents load.
var biLimits = fmt.Sprintf(`
limits {
  rpc_handshake_timeout     = %q
  rpc_frame_timeout         = %q
  http_body_read_timeout    = %q
  http_max_conns_per_client = %d
  rpc_max_conns_per_client  = %d
}
`, biHandshakeTimeout, biFrameTimeout, biBodyTimeout, biMaxConnsPerClient, biMaxConnsPerClient)

// Bounds on a row's resident memory growth: the peak RSS while the row ran
// (and rowObserve after it) less the RSS before it.
const (
	// nestedParseRSSBound: the input is 200 KB; refusing it by its depth
	// before the parser recurses needs a few copies of it. The unfixed
	// parser recursed until the stack overflowed, killing the agent.
	nestedParseRSSBound = 32 << 20
	// hugeCountRSSBound: a count refused before anything is built costs
	// nothing; the unfixed leader grew 70-110 MB/s, so within rowObserve
	// it would pass 200 MB.
	hugeCountRSSBound = 32 << 20
	// groupsRPCRSSBound: the frame is 4 MiB; refusing the group count
	// while decoding, or by the frame size, needs the frame and a few
	// copies of it, not one struct per group. The unfixed server took
	// 2.3 GB.
	groupsRPCRSSBound = 64 << 20
	// groupsHTTPRSSBound is per 4 MiB body: reading it (its buffer grows
	// by doubling) and one decoded copy, with the garbage collector's 2x
	// headroom, is 12x the body. The unfixed agent took 845 MB for one and
	// 1.5 GB for three at once.
	groupsHTTPRSSBound = 48 << 20
	// blockingRSSBound: 4,000 held HTTP connections each cost net/http's
	// 4 KB read and 4 KB write buffers, two goroutine stacks (8-32 KB)
	// and the request's state: 64 KB each at most.
	blockingRSSBound = 4000 * 64 << 10
	// heldConnsRSSBound: 2,100 connections held to their deadlines, at
	// most 64 KB each as above (a partial frame's buffered reader is 4 KB).
	heldConnsRSSBound = 2100 * 64 << 10
	// smallRowRSSBound is for rows of a few small requests or short-lived
	// connections: anything beyond normal jitter is a leak or a blow-up.
	smallRowRSSBound = 32 << 20
	// restartRSSBound bounds the restarted agents' RSS over their RSS when
	// first started: the state they reload is a few jobs and volumes. The
	// unfixed leader, replaying a huge count's evaluation, reached 1.9 GB.
	restartRSSBound = 64 << 20
)

// rowObserve is how long after its last request a row keeps watching
// memory and liveness: work a bad input started in the background (an
// evaluation, a placement) shows up within it.
const rowObserve = 3 * time.Second

// restartObserve is how long the restarted cluster is watched: a huge
// count's evaluation replayed from the log grew the leader by about
// 100 MB/s, past restartRSSBound within a second.
const restartObserve = 10 * time.Second

// maxErrorBody bounds the size of an error answer: the first problems and
// "and K more", not one line per bad group (the unfixed agent answered 35
// MB over HTTP and 104 MB over RPC).
const maxErrorBody = 64 << 10

// badInputEnv is the cluster the rows run against.
type badInputEnv struct {
	cc     *csiCluster
	server *Agent
	client *Agent
	guard  *memGuard
	// http talks to the agents from 127.0.0.1 without keeping idle
	// connections, so that none lingers in the goroutine counts.
	http *http.Client
	// goodVol is a registered volume, valid in every way, for jobs whose
	// only fault lies elsewhere.
	goodVol string
	// sentinel watches the places a ../ volume ID would land.
	sentinel *sentinel
	// freshRSS is each agent's RSS just after the cluster came up.
	freshRSS map[*Agent]int64
}

func startBadInputEnv(t *testing.T) *badInputEnv {
	cc := startCSICluster(t, csiOpts{
		Servers: 1, Clients: 1,
		ServerConfigExtra: biLimits,
		ClientConfigExtra: biLimits,
	})
	e := &badInputEnv{
		cc:       cc,
		server:   cc.Servers[0],
		client:   cc.Clients[0],
		http:     httpFrom("127.0.0.1", 2*time.Minute),
		freshRSS: make(map[*Agent]int64),
	}
	e.guard = guardMemory(t, memGuardCap, e.server, e.client)
	ext := cc.createVolumes(t, "client-0", "good")
	cc.registerVolumeHTTP(t, "good", ext[0])
	e.goodVol = "good"
	e.sentinel = plantSentinel(t, e.client.DataDir, e.server.DataDir, cc.StateDir, cc.Dir, os.TempDir())
	for _, a := range e.agents() {
		rss, err := a.RSS()
		must.NoError(t, err)
		e.freshRSS[a] = rss
	}
	t.Logf("cluster up: server %s pid %d RSS %s, client %s pid %d RSS %s", e.server.Name, e.server.PID(),
		mib(e.freshRSS[e.server]), e.client.Name, e.client.PID(), mib(e.freshRSS[e.client]))
	return e
}

func (e *badInputEnv) agents() []*Agent { return []*Agent{e.server, e.client} }

// healthy checks that both agents run, the server names a leader, the
// client's node is ready and the plugin is healthy on it.
func (e *badInputEnv) healthy() error {
	for _, a := range e.agents() {
		if !a.Running() {
			return fmt.Errorf("%s is not running (%s)", a.Name, a.ExitState())
		}
	}
	base := e.server.HTTPAddr()
	leader, err := StatusLeader(base)
	if err != nil {
		return err
	}
	if leader == "" {
		return errors.New("the server knows no leader")
	}
	nodes, err := Nodes(base, false)
	if err != nil {
		return err
	}
	if len(nodes) != 1 || nodes[0].Status != "ready" {
		return fmt.Errorf("want one ready node, have %+v", nodes)
	}
	var p api.CSIPlugin
	if err := GetJSON(base, "/v1/plugin/csi/"+csiPluginID, &p); err != nil {
		return err
	}
	if p.ControllersHealthy != 1 || p.NodesHealthy != 1 {
		return fmt.Errorf("plugin %s: %d controllers and %d nodes healthy, want 1 and 1", csiPluginID, p.ControllersHealthy, p.NodesHealthy)
	}
	return nil
}

// ensureUp restarts whichever agent an earlier row left dead, and waits
// until the cluster is healthy again.
func (e *badInputEnv) ensureUp(t *testing.T) {
	t.Helper()
	for _, a := range e.agents() {
		if rss, ok := e.guard.killedAt(a); ok {
			t.Logf("%s was killed by the memory guard at %s in an earlier row", a.Name, mib(rss))
			e.guard.forget(a)
		}
		if a.Running() {
			continue
		}
		t.Logf("%s is down (%s) after an earlier row: restarting it on its data dir", a.Name, a.ExitState())
		must.NoError(t, a.Start())
		must.NoError(t, a.WaitHTTP(startTimeout))
	}
	if err := poll(csiSettle, e.healthy); err != nil {
		t.Fatalf("cluster not healthy before the row: %v", err)
	}
}

// rowWatch records what a row must not change.
type rowWatch struct {
	e     *badInputEnv
	t     *testing.T
	raft  uint64
	rss   map[*Agent]int64
	start time.Time
}

// begin makes sure the cluster is healthy and records the Raft index and
// each agent's RSS.
func (e *badInputEnv) begin(t *testing.T) *rowWatch {
	t.Helper()
	e.ensureUp(t)
	w := &rowWatch{e: e, t: t, rss: make(map[*Agent]int64), start: time.Now()}
	// The Raft log is quiet in an idle cluster; wait for it to settle so
	// that the row's own writes (there must be none) stand out.
	var last uint64
	WaitFor(t, settle, func() error {
		rt, err := ReadRuntime(e.server.HTTPAddr())
		if err != nil {
			return err
		}
		if rt.RaftLastIndex != last || rt.RaftApplied != rt.RaftLastIndex {
			last = rt.RaftLastIndex
			return fmt.Errorf("raft log still moving (last %d, applied %d)", rt.RaftLastIndex, rt.RaftApplied)
		}
		return nil
	})
	w.raft = last
	for _, a := range e.agents() {
		rss, err := a.RSS()
		must.NoError(t, err)
		w.rss[a] = rss
	}
	e.guard.reset(e.agents()...)
	return w
}

// finish watches the agents for rowObserve, then checks that they are up,
// that neither grew by more than bound, and that the Raft log did not
// grow.
func (w *rowWatch) finish(bound int64) {
	t, e := w.t, w.e
	t.Helper()
	deadline := time.Now().Add(rowObserve)
	for time.Now().Before(deadline) {
		if !e.server.Running() || !e.client.Running() {
			break
		}
		time.Sleep(pollGap) // sampling liveness over the window, not waiting for an event
	}
	for _, a := range e.agents() {
		if rss, ok := e.guard.killedAt(a); ok {
			t.Errorf("%s: killed by the memory guard at %s", a.Name, mib(rss))
		}
		if !a.Running() {
			t.Errorf("%s died during the row: %s", a.Name, a.ExitState())
			continue
		}
		peak := e.guard.peakOf(a)
		if now, err := a.RSS(); err == nil && now > peak {
			peak = now
		}
		grew := peak - w.rss[a]
		t.Logf("%s RSS %s before, peak %s: %+.1f MiB (bound %s)", a.Name, mib(w.rss[a]), mib(peak),
			float64(grew)/(1<<20), mib(bound))
		if grew > bound {
			t.Errorf("%s grew by %s, more than the bound of %s", a.Name, mib(grew), mib(bound))
		}
	}
	if e.server.Running() {
		leader, err := StatusLeader(e.server.HTTPAddr())
		switch {
		case err != nil:
			t.Errorf("the server does not answer /v1/status/leader: %v", err)
		case leader == "":
			t.Errorf("the server knows no leader after the row")
		}
		if rt, err := ReadRuntime(e.server.HTTPAddr()); err != nil {
			t.Errorf("read raft index: %v", err)
		} else {
			t.Logf("raft last index %d before, %d after; server goroutines %d", w.raft, rt.RaftLastIndex, rt.Goroutines)
			if rt.RaftLastIndex != w.raft {
				t.Errorf("the row wrote %d entries to the raft log (last index %d -> %d)", rt.RaftLastIndex-w.raft, w.raft, rt.RaftLastIndex)
			}
		}
	}
	if err := e.sentinel.check(); err != nil {
		t.Errorf("outside the data dirs: %v", err)
	}
	t.Logf("row took %s", time.Since(w.start).Round(time.Millisecond))
}

// mustRefuse checks that an HTTP answer is a 4xx whose body matches
// names (the problem named) and is not oversized.
func mustRefuse(t *testing.T, what string, ans *httpAnswer, err error, names string) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: no answer: %v", what, err)
		return
	}
	checkRefusal(t, what, ans, names)
}

// mustRefuseOrClose is mustRefuse for a body too large to be read: an
// agent that answers before reading it all and closes the connection may
// reset it under the sender, who then never sees the answer. That close is
// a refusal too (finish checks the agent is still up).
func mustRefuseOrClose(t *testing.T, what string, ans *httpAnswer, err error, names string) {
	t.Helper()
	if err != nil {
		if !isClosedErr(err) {
			t.Errorf("%s: no answer: %v", what, err)
			return
		}
		t.Logf("%s: the agent closed the connection while the body was sent: %v", what, err)
		return
	}
	checkRefusal(t, what, ans, names)
}

func checkRefusal(t *testing.T, what string, ans *httpAnswer, names string) {
	t.Helper()
	t.Logf("%s: %s", what, ans)
	if ans.Status < 400 || ans.Status > 499 {
		t.Errorf("%s: answered %d, want a 4xx: %s", what, ans.Status, ans)
		return
	}
	if !regexp.MustCompile(names).MatchString(ans.Body) {
		t.Errorf("%s: the %d answer does not name the problem (want %s): %s", what, ans.Status, names, ans)
	}
	if ans.Size > maxErrorBody {
		t.Errorf("%s: the error answer is %d bytes, more than %d", what, ans.Size, maxErrorBody)
	}
}

// rowNestedParse: 100,000 nested `[` in a task config, parsed by the
// server's and by the client's HTTP API.
func (e *badInputEnv) rowNestedParse(t *testing.T) {
	w := e.begin(t)
	body := nestedParseBody(100_000)
	for _, a := range e.agents() {
		ans, err := sendHTTP(e.http, http.MethodPut, a.HTTPAddr()+"/v1/jobs/parse", body)
		mustRefuse(t, "parse on "+a.Name, ans, err, `(?i)nest|depth`)
	}
	w.finish(nestedParseRSSBound)
}

// rowGroupsRPC: one 4 MiB Job.Register frame holding 4.19 million empty
// task groups, straight to the server's RPC port.
func (e *badInputEnv) rowGroupsRPC(t *testing.T) {
	w := e.begin(t)
	frame := emptyGroupsRegisterFrame("groups-rpc", 4<<20-64)
	start := time.Now()
	ans, err := rawRPC("127.0.0.1", e.server.RPCAddr(), frame, time.Minute)
	switch {
	case err != nil:
		t.Errorf("Job.Register frame of %d bytes: %v", len(frame), err)
	case ans.Closed:
		t.Logf("Job.Register frame of %d bytes: connection closed after %s", len(frame), time.Since(start).Round(time.Millisecond))
	default:
		t.Logf("Job.Register frame of %d bytes: %d-byte reply after %s: %.300s", len(frame), ans.Size, time.Since(start).Round(time.Millisecond), ans.Error)
		if ans.Error == "" {
			t.Errorf("Job.Register of 4 million empty groups succeeded")
		} else if !regexp.MustCompile(`(?i)group|complex|too large|limit`).MatchString(ans.Error) {
			// The groups, or what makes the frame too much: its size or
			// its number of maps and arrays.
			t.Errorf("the error does not name the problem: %.300s", ans.Error)
		}
		if ans.Size > maxErrorBody {
			t.Errorf("the error reply is %d bytes, more than %d", ans.Size, maxErrorBody)
		}
	}
	w.finish(groupsRPCRSSBound)
}

// rowGroupsHTTP: n register bodies of 4 MiB, each 1.39 million empty
// task groups, at once.
func (e *badInputEnv) rowGroupsHTTP(t *testing.T, n int) {
	w := e.begin(t)
	body := emptyGroupsJobJSON("groups-http", 4<<20)
	var wg sync.WaitGroup
	answers := make([]*httpAnswer, n)
	errs := make([]error, n)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], errs[i] = sendHTTP(e.http, http.MethodPut, e.server.HTTPAddr()+"/v1/jobs", body)
		}()
	}
	wg.Wait()
	t.Logf("%d register bodies of %d bytes answered within %s", n, len(body), time.Since(start).Round(time.Millisecond))
	for i := range n {
		mustRefuseOrClose(t, fmt.Sprintf("register #%d", i), answers[i], errs[i], `(?i)group|large|bytes|size`)
	}
	w.finish(int64(n) * groupsHTTPRSSBound)
}

// rowVolumeIDEscape: volume IDs of ../ segments (ten, as in the issue,
// and forty, which reach / from any directory) and one with a NUL, on
// create and on register, and a job mounting the ../ one.
func (e *badInputEnv) rowVolumeIDEscape(t *testing.T) {
	w := e.begin(t)
	base := e.server.HTTPAddr()
	ext := e.cc.createVolumes(t, "client-0", "escape-ext")
	// The first lands on the sentinel directory (which must not be
	// touched), the second where nothing exists (and nothing may appear).
	ids := []string{
		strings.Repeat("../", 10) + e.sentinel.name,
		strings.Repeat("../", 40) + e.sentinel.fresh,
		"vol\x00nul",
	}
	caps := []map[string]string{{"AccessMode": api.CSIAccessModeSingleNodeWriter, "AttachmentMode": api.CSIAttachmentModeFilesystem}}
	var registered []string
	for _, id := range ids {
		path := "/v1/volume/csi/" + url.PathEscape(id)
		body, _ := json.Marshal(map[string]any{"Volumes": []map[string]any{{
			"ID": id, "Name": id, "PluginID": csiPluginID, "RequestedCapabilities": caps,
		}}})
		ans, err := sendHTTP(e.http, http.MethodPut, base+path+"/create", body)
		mustRefuse(t, fmt.Sprintf("create %q", id), ans, err, `(?i)\bid\b|identifier|name`)
		if err == nil && ans.Status/100 == 2 {
			// Out of the way of the register below, which must be
			// refused for its ID, not for clashing with this one.
			e.dropVolume(t, id)
		}
		body, _ = json.Marshal(map[string]any{"Volumes": []map[string]any{{
			"ID": id, "Name": id, "ExternalID": ext[0], "PluginID": csiPluginID, "RequestedCapabilities": caps,
		}}})
		ans, err = sendHTTP(e.http, http.MethodPut, base+path, body)
		mustRefuse(t, fmt.Sprintf("register %q", id), ans, err, `(?i)\bid\b|identifier|name`)
		if err == nil && ans.Status/100 == 2 {
			registered = append(registered, id)
		}
	}
	// Jobs mounting the ../ volumes: refused at submission. An unfixed
	// cluster that stored the volumes above runs them, and the sentinel
	// shows what that did outside the data dir.
	for i, id := range ids[:2] {
		jobID := fmt.Sprintf("escape-job-%d", i)
		job := jobJSON(jobOpts{ID: jobID, Type: "batch", Count: 1, Command: "/bin/sh",
			Args: []string{"-c", `echo escaped > "$ROAM_TASK_DIR/data/escaped"`}, VolumeSource: id, MountDest: "data"})
		ans, err := sendHTTP(e.http, http.MethodPut, base+"/v1/jobs", job)
		mustRefuse(t, "job mounting "+id, ans, err, `(?i)source|volume|\bid\b`)
		if err == nil && ans.Status/100 == 2 {
			e.waitJobSettled(t, jobID)
			e.purgeJob(t, jobID)
		}
	}
	for _, id := range registered {
		e.dropVolume(t, id)
	}
	w.finish(smallRowRSSBound)
}

// rowBlockingQueries: 4,000 blocking queries whose callers hang up after
// 2 s must not outlive their callers in the agent.
func (e *badInputEnv) rowBlockingQueries(t *testing.T) {
	w := e.begin(t)
	hangUpBlockingQueries(t, e.server, []*Agent{e.server}, 4000, 0)
	w.finish(blockingRSSBound)
}

// hangUpBlockingQueries sends n blocking queries for /v1/jobs to the HTTP
// API of target, from 50 attacker addresses starting at firstSrc (80 each
// for 4,000: under the per-address cap). Once all are waiting (target has
// a goroutine more for each) and 2 s have passed, their callers hang up;
// then every agent in watch must be back to its goroutine count from
// before within releaseBy.
func hangUpBlockingQueries(t *testing.T, target *Agent, watch []*Agent, n, firstSrc int) {
	t.Helper()
	const (
		sources   = 50
		hangUpAt  = 2 * time.Second
		arriveBy  = 30 * time.Second
		releaseBy = 10 * time.Second // the unfixed agent held them up to 10 minutes
		// goroutineSlack is what may remain above the baseline once the
		// callers are gone: timers, a GC worker, a log flush.
		goroutineSlack = 50
	)
	base := target.HTTPAddr()
	before := make([]int, len(watch))
	peak := make([]int, len(watch))
	for i, a := range watch {
		rt, err := ReadRuntime(a.HTTPAddr())
		must.NoError(t, err)
		before[i] = rt.Goroutines
	}
	targetBefore, err := ReadRuntime(base)
	must.NoError(t, err)
	var jobs []json.RawMessage
	m, err := GetJSONMeta(base, "/v1/jobs", &jobs)
	must.NoError(t, err)

	ctx, hangUp := context.WithCancel(context.Background())
	defer hangUp()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := blockingQueryUntil(ctx, attackerAddr(firstSrc+i%sources), base, m.Index); err != nil {
				errs <- err
			}
		}()
	}
	// Hang up once every query is waiting in the target (at least one
	// goroutine each) and 2 s have passed.
	err = poll(arriveBy, func() error {
		var targetNow int
		for i, a := range watch {
			rt, err := ReadRuntime(a.HTTPAddr())
			if err != nil {
				return err
			}
			peak[i] = max(peak[i], rt.Goroutines)
		}
		rt, err := ReadRuntime(base)
		if err != nil {
			return err
		}
		targetNow = rt.Goroutines
		if targetNow < targetBefore.Goroutines+n {
			return fmt.Errorf("%d goroutines in %s, want at least %d + %d waiting queries", targetNow, target.Name, targetBefore.Goroutines, n)
		}
		if time.Since(start) < hangUpAt {
			return errors.New("not 2 s yet")
		}
		return nil
	})
	hungUp := time.Now()
	hangUp()
	wg.Wait()
	close(errs)
	var failed []error
	for err := range errs {
		failed = append(failed, err)
	}
	t.Logf("%d blocking queries to %s from %d addresses; callers hung up after %s", n, target.Name, sources, hungUp.Sub(start).Round(time.Millisecond))
	if err != nil {
		t.Errorf("the queries did not all arrive within %s: %v", arriveBy, err)
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d queries failed before their caller hung up; first: %v", len(failed), n, failed[0])
	}
	after := make([]int, len(watch))
	err = poll(releaseBy, func() error {
		var errs []error
		for i, a := range watch {
			rt, err := ReadRuntime(a.HTTPAddr())
			if err != nil {
				return err
			}
			after[i] = rt.Goroutines
			if after[i] > before[i]+goroutineSlack {
				errs = append(errs, fmt.Errorf("%s: %d goroutines %s after the callers hung up (%d before)",
					a.Name, after[i], time.Since(hungUp).Round(time.Millisecond), before[i]))
			}
		}
		return errors.Join(errs...)
	})
	for i, a := range watch {
		t.Logf("%s goroutines: %d before, peak %d, %d %s after the callers hung up", a.Name, before[i], peak[i], after[i], time.Since(hungUp).Round(time.Millisecond))
	}
	if err != nil {
		t.Errorf("blocking queries outlive their callers: %v", err)
	}
}

// heldResult is how long each held connection stayed open, by kind.
type heldResult struct {
	mu    sync.Mutex
	took  map[string][]time.Duration
	fails map[string][]error
	notes map[string][]string
}

func newHeldResult() *heldResult {
	return &heldResult{took: map[string][]time.Duration{}, fails: map[string][]error{}, notes: map[string][]string{}}
}

func (r *heldResult) add(kind string, d time.Duration, note string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.fails[kind] = append(r.fails[kind], err)
		return
	}
	r.took[kind] = append(r.took[kind], d)
	if note != "" {
		r.notes[kind] = append(r.notes[kind], note)
	}
}

// summary describes the kind's durations: count, median, max.
func (r *heldResult) summary(kind string) string {
	ds := slices.Clone(r.took[kind])
	slices.Sort(ds)
	if len(ds) == 0 {
		return fmt.Sprintf("%s: none closed, %d failed", kind, len(r.fails[kind]))
	}
	return fmt.Sprintf("%s: %d closed (median %s, max %s), %d still open or failed",
		kind, len(ds), ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), len(r.fails[kind]))
}

// rowHeldConnections: 500 partial RPC frames, 500 partial Raft frames,
// 1,000 slow HTTP bodies and 100 connections that never send a byte, all
// at once; each must be closed within its deadline.
func (e *badInputEnv) rowHeldConnections(t *testing.T) {
	w := e.begin(t)
	type kind struct {
		name     string
		n        int
		srcFirst int // first attacker address
		srcs     int // addresses used, n/srcs per address, under the cap
		deadline time.Duration
		run      func(ctx context.Context, src string, limit time.Duration) (time.Duration, string, error)
	}
	rpcAddr, httpAddr := e.server.RPCAddr(), strings.TrimPrefix(e.server.HTTPAddr(), "http://")
	hold := func(prefix []byte) func(context.Context, string, time.Duration) (time.Duration, string, error) {
		return func(ctx context.Context, src string, limit time.Duration) (time.Duration, string, error) {
			d, err := holdOpen(ctx, src, rpcAddr, prefix, limit)
			return d, "", err
		}
	}
	kinds := []kind{
		{"partial RPC frame", 500, 0, 10, biFrameTimeout, hold(partialRPCFrame())},
		{"partial Raft frame", 500, 10, 10, biFrameTimeout, hold(partialRaftFrame())},
		{"no first byte", 100, 20, 2, biHandshakeTimeout, hold(nil)},
		{"slow HTTP body", 1000, 30, 20, biBodyTimeout, func(ctx context.Context, src string, limit time.Duration) (time.Duration, string, error) {
			return slowBody(ctx, src, httpAddr, limit)
		}},
	}
	res := newHeldResult()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for _, k := range kinds {
		for i := range k.n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, note, err := k.run(ctx, attackerAddr(k.srcFirst+i%k.srcs), k.deadline+closeSlack)
				res.add(k.name, d, note, err)
			}()
		}
	}
	wg.Wait()
	for _, k := range kinds {
		t.Logf("%s (deadline %s + slack %s)", res.summary(k.name), k.deadline, closeSlack)
		if f := res.fails[k.name]; len(f) > 0 {
			t.Errorf("%s: %d of %d connections not closed within %s; first: %v", k.name, len(f), k.n, k.deadline+closeSlack, f[0])
		}
		statuses := map[string]int{}
		for _, s := range res.notes[k.name] {
			statuses[s]++
		}
		if len(statuses) > 0 {
			t.Logf("%s answers: %v", k.name, statuses)
		}
	}
	w.finish(heldConnsRSSBound)
}

// rowConnectionCaps: 150 connections from one address to each port, each
// holding a partial frame or a slow body; beyond the per-address cap they
// are closed at once instead of waiting out their deadline.
func (e *badInputEnv) rowConnectionCaps(t *testing.T) {
	const n = biMaxConnsPerClient + 50
	w := e.begin(t)
	rpcAddr, httpAddr := e.server.RPCAddr(), strings.TrimPrefix(e.server.HTTPAddr(), "http://")
	// at once: well before the frame or body deadline, the mark of a
	// connection refused by the cap rather than ended by its deadline.
	const atOnce = time.Second
	check := func(kind string, run func(ctx context.Context) (time.Duration, error)) {
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			quick int
			took  []time.Duration
			fails []error
		)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, err := run(ctx)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					fails = append(fails, err)
					return
				}
				took = append(took, d)
				if d < atOnce {
					quick++
				}
			}()
		}
		wg.Wait()
		slices.Sort(took)
		var longest time.Duration
		if len(took) > 0 {
			longest = took[len(took)-1]
		}
		t.Logf("%s: %d connections from one address: %d closed within %s, %d in all (max %s), %d not closed",
			kind, n, quick, atOnce, len(took), longest.Round(time.Millisecond), len(fails))
		if quick < n-biMaxConnsPerClient {
			t.Errorf("%s: only %d of %d connections from one address were turned away at once; the cap is %d", kind, quick, n, biMaxConnsPerClient)
		}
		if len(fails) > 0 {
			t.Errorf("%s: %d connections not closed; first: %v", kind, len(fails), fails[0])
		}
	}
	src := attackerAddr(100)
	check("RPC", func(ctx context.Context) (time.Duration, error) {
		return holdOpen(ctx, src, rpcAddr, partialRPCFrame(), biFrameTimeout+closeSlack)
	})
	check("HTTP", func(ctx context.Context) (time.Duration, error) {
		d, _, err := slowBody(ctx, src, httpAddr, biBodyTimeout+closeSlack)
		return d, err
	})
	w.finish(smallRowRSSBound)
}

// rowBlockingOutlivesBodyTimeout: the body read timeout does not cut a
// blocking query that waits longer than it.
func (e *badInputEnv) rowBlockingOutlivesBodyTimeout(t *testing.T) {
	w := e.begin(t)
	base := e.server.HTTPAddr()
	var jobs []json.RawMessage
	meta, err := GetJSONMeta(base, "/v1/jobs", &jobs)
	must.NoError(t, err)
	wait := 2 * biBodyTimeout
	start := time.Now()
	ans, err := sendHTTP(e.http, http.MethodGet, fmt.Sprintf("%s/v1/jobs?index=%d&wait=%s", base, meta.Index, wait), nil)
	took := time.Since(start)
	must.NoError(t, err)
	t.Logf("blocking query with wait=%s (body timeout %s): %d after %s", wait, biBodyTimeout, ans.Status, took.Round(time.Millisecond))
	must.Eq(t, http.StatusOK, ans.Status, must.Sprintf("answer: %s", ans))
	must.GreaterEq(t, wait*7/8, took, must.Sprint("the blocking query ended before its wait"))
	w.finish(smallRowRSSBound)
}

// rowVolumeMountDestination: volume_mount destinations that are not a
// clean relative path below the task dir, or that are a reserved dir, are
// refused at submission, as HCL and as JSON.
func (e *badInputEnv) rowVolumeMountDestination(t *testing.T) {
	w := e.begin(t)
	base := e.server.HTTPAddr()
	for i, dest := range []string{"/", "local", "../outside"} {
		id := fmt.Sprintf("mount-dest-%d", i)
		o := jobOpts{ID: id, Type: "batch", Count: 1, Command: "/bin/true", VolumeSource: e.goodVol, MountDest: dest}
		ans, err := sendHTTP(e.http, http.MethodPut, base+"/v1/jobs/parse", parseBody(jobHCL(o)))
		mustRefuse(t, fmt.Sprintf("parse with destination %q", dest), ans, err, `(?i)destination`)
		ans, err = sendHTTP(e.http, http.MethodPut, base+"/v1/jobs", jobJSON(o))
		mustRefuse(t, fmt.Sprintf("register with destination %q", dest), ans, err, `(?i)destination`)
		if err == nil && ans.Status/100 == 2 {
			e.waitJobSettled(t, id)
			e.purgeJob(t, id)
		}
	}
	w.finish(smallRowRSSBound)
}

// rowBadFirstBytes: two connections for each first byte the RPC port has
// no protocol for, each followed by junk. Each is closed at once, and the
// log does not get a line per connection.
func (e *badInputEnv) rowBadFirstBytes(t *testing.T) {
	const (
		passes = 2
		// maxWarnLines: repeated connection errors are logged rate-limited
		// with a count, so a scan of 506 connections in a few seconds
		// leaves a handful of lines (the unfixed agent wrote one each).
		maxWarnLines = 10
		workers      = 8
	)
	w := e.begin(t)
	off := e.server.logOffset()
	bad := badFirstBytes()
	res := newHeldResult()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	work := make(chan []byte)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for prefix := range work {
				d, err := holdOpen(ctx, attackerAddr(200+i), e.server.RPCAddr(), prefix, biHandshakeTimeout+closeSlack)
				res.add("bad first byte", d, "", err)
			}
		}()
	}
	junk := make([]byte, 64)
	for range passes {
		for _, b := range bad {
			_, _ = rand.Read(junk)
			work <- append([]byte{b}, junk...)
		}
	}
	close(work)
	wg.Wait()
	t.Log(res.summary("bad first byte"))
	if f := res.fails["bad first byte"]; len(f) > 0 {
		t.Errorf("%d connections with a bad first byte not closed; first: %v", len(f), f[0])
	}
	w.finish(smallRowRSSBound)
	// Read after finish's observe window: a rate-limited log may write its
	// count a little later.
	lines := e.server.logLinesSince(off, "[WARN]")
	lines = append(lines, e.server.logLinesSince(off, "[ERROR]")...)
	t.Logf("%d connections with a bad first byte: %d WARN/ERROR lines in the server's log", passes*len(bad), len(lines))
	for i, l := range lines {
		if i == 5 {
			t.Logf("  ...")
			break
		}
		t.Logf("  %s", l)
	}
	if len(lines) > maxWarnLines {
		t.Errorf("%d WARN/ERROR lines for %d bad connections, want at most %d", len(lines), passes*len(bad), maxWarnLines)
	}
}

// rowRawExecWithoutCommand: a raw_exec task without a command is refused
// at submission, not accepted to fail on the client.
func (e *badInputEnv) rowRawExecWithoutCommand(t *testing.T) {
	w := e.begin(t)
	base := e.server.HTTPAddr()
	for i, cmd := range []string{"", "omitted"} {
		id := fmt.Sprintf("no-command-%d", i)
		o := jobOpts{ID: id, Type: "batch", Count: 1, Command: cmd, OmitCommand: cmd == "omitted"}
		ans, err := sendHTTP(e.http, http.MethodPut, base+"/v1/jobs/parse", parseBody(jobHCL(o)))
		mustRefuse(t, fmt.Sprintf("parse with command %q", cmd), ans, err, `(?i)command`)
		ans, err = sendHTTP(e.http, http.MethodPut, base+"/v1/jobs", jobJSON(o))
		mustRefuse(t, fmt.Sprintf("register with command %q", cmd), ans, err, `(?i)command`)
		if err == nil && ans.Status/100 == 2 {
			e.waitJobSettled(t, id)
			e.purgeJob(t, id)
		}
	}
	w.finish(smallRowRSSBound)
}

// rowVolumeCapacity: a volume create asking for 2^63-1 bytes is a 400
// naming the capacity, not a 500.
func (e *badInputEnv) rowVolumeCapacity(t *testing.T) {
	w := e.begin(t)
	base := e.server.HTTPAddr()
	caps := []map[string]string{{"AccessMode": api.CSIAccessModeSingleNodeWriter, "AttachmentMode": api.CSIAttachmentModeFilesystem}}
	// A maximum of 2^63-1 alone is no bound at all, which is fine; a
	// minimum of it asks for more than any provider has.
	for i, fields := range [][]string{{"RequestedCapacityMin"}, {"RequestedCapacityMin", "RequestedCapacityMax"}} {
		id := fmt.Sprintf("capacity-%d", i)
		vol := map[string]any{"ID": id, "Name": id, "PluginID": csiPluginID, "RequestedCapabilities": caps}
		for _, f := range fields {
			vol[f] = int64(math.MaxInt64)
		}
		body, _ := json.Marshal(map[string]any{"Volumes": []map[string]any{vol}})
		ans, err := sendHTTP(e.http, http.MethodPut, base+"/v1/volume/csi/"+id+"/create", body)
		mustRefuse(t, fmt.Sprintf("create with %v 2^63-1", fields), ans, err, `(?i)capacity`)
		if err == nil && ans.Status/100 == 2 {
			e.dropVolume(t, id)
		}
	}
	w.finish(smallRowRSSBound)
}

// rowHugeCount: a job whose group count is 2^62, 2^63-1 or 5,000,000, in a
// datacenter no node is in.
func (e *badInputEnv) rowHugeCount(t *testing.T) {
	w := e.begin(t)
	base := e.server.HTTPAddr()
	for i, count := range []uint64{1 << 62, math.MaxInt64, 5_000_000} {
		id := fmt.Sprintf("huge-count-%d", i)
		ans, err := sendHTTP(e.http, http.MethodPut, base+"/v1/jobs", hugeCountJob(id, count, "dc-nowhere"))
		// An accepted job stays, as it did for the user: the
		// restart below shows whether its evaluation hurts again.
		mustRefuse(t, fmt.Sprintf("register with count %d", count), ans, err, `(?i)count`)
	}
	w.finish(hugeCountRSSBound)
}

// rowRestart stops both agents and starts them again on their data dirs:
// the cluster comes back with its leader, its ready node and its healthy
// plugin, holds nothing a bad input left behind, and stays within
// restartRSSBound of the RSS it had when first started.
func (e *badInputEnv) rowRestart(t *testing.T) {
	e.ensureUp(t)
	before, err := ReadRuntime(e.server.HTTPAddr())
	must.NoError(t, err)
	for _, a := range []*Agent{e.client, e.server} {
		code, killed, err := a.Stop(stopTimeout)
		must.NoError(t, err)
		t.Logf("%s stopped: exit %d, killed %t", a.Name, code, killed)
	}
	start := time.Now()
	for _, a := range e.agents() {
		must.NoError(t, a.Start())
	}
	for _, a := range e.agents() {
		must.NoError(t, a.WaitHTTP(startTimeout))
	}
	e.guard.reset(e.agents()...)
	WaitFor(t, csiSettle, e.healthy)
	t.Logf("healthy %s after the restart", time.Since(start).Round(time.Millisecond))
	// Watch the restarted agents' memory for a while: a bad input that
	// reached the state would grow it again now (the issue saw 1.9 GB
	// within 18 s of a restart).
	deadline := time.Now().Add(restartObserve)
	for time.Now().Before(deadline) && e.server.Running() && e.client.Running() {
		time.Sleep(pollGap) // sampling liveness over the window, not waiting for an event
	}
	for _, a := range e.agents() {
		must.True(t, a.Running(), must.Sprintf("%s died after the restart: %s", a.Name, a.ExitState()))
		peak := e.guard.peakOf(a)
		t.Logf("%s RSS after the restart: peak %s over %s, when first started %s (bound +%s)",
			a.Name, mib(peak), restartObserve, mib(e.freshRSS[a]), mib(restartRSSBound))
		test.LessEq(t, e.freshRSS[a]+restartRSSBound, peak, test.Sprintf("%s after the restart", a.Name))
	}

	after, err := ReadRuntime(e.server.HTTPAddr())
	must.NoError(t, err)
	t.Logf("raft last index %d before the restart, %d after", before.RaftLastIndex, after.RaftLastIndex)
	test.GreaterEq(t, before.RaftLastIndex, after.RaftLastIndex, test.Sprint("the restarted server lost raft entries"))
	var jobs []struct{ ID string }
	must.NoError(t, GetJSON(e.server.HTTPAddr(), "/v1/jobs", &jobs))
	var ids []string
	for _, j := range jobs {
		ids = append(ids, j.ID)
	}
	sort.Strings(ids)
	test.Eq(t, []string{csiPluginJobID(csiPluginID)}, ids, test.Sprint("jobs after the restart: only the plugin's"))
	var vols []struct{ ID string }
	must.NoError(t, GetJSON(e.server.HTTPAddr(), "/v1/volumes?type=csi", &vols))
	t.Logf("volumes after the restart: %v", vols)
	test.Eq(t, []struct{ ID string }{{e.goodVol}}, vols, test.Sprint("volumes after the restart: only the good one"))
	must.NoError(t, e.sentinel.check())
}

// waitJobSettled waits (bounded) until a job that should never have been
// accepted has been evaluated and has no allocation still running, so
// that whatever it did is done before the row looks.
func (e *badInputEnv) waitJobSettled(t *testing.T, jobID string) {
	t.Helper()
	base := e.server.HTTPAddr()
	err := poll(30*time.Second, func() error {
		evals, err := JobEvals(base, jobID)
		if err != nil {
			return err
		}
		if len(evals) == 0 {
			return errors.New("no evaluation yet")
		}
		for _, ev := range evals {
			if !ev.Terminal() && ev.Status != "blocked" {
				return fmt.Errorf("evaluation %.8s is %s", ev.ID, ev.Status)
			}
		}
		list, err := JobAllocs(base, jobID)
		if err != nil {
			return err
		}
		for _, a := range list {
			if !a.ClientTerminal() {
				return fmt.Errorf("allocation %s still %s", a, a.ClientStatus)
			}
		}
		return nil
	})
	if err != nil {
		t.Logf("job %s: %v", jobID, err)
	}
	list, _ := JobAllocs(base, jobID)
	t.Logf("job %s was accepted; %d allocations", jobID, len(list))
	for _, a := range list {
		t.Logf("  %s: %s", a, taskEvents(a))
	}
}

// purgeJob removes a job a row should not have been able to register.
func (e *badInputEnv) purgeJob(t *testing.T, jobID string) {
	t.Helper()
	ans, err := sendHTTP(e.http, http.MethodDelete, e.server.HTTPAddr()+"/v1/job/"+url.PathEscape(jobID)+"?purge=true", nil)
	if err != nil || ans.Status/100 != 2 {
		t.Logf("purge %s: %v %v", jobID, ans, err)
	}
}

// dropVolume removes a volume a row should not have been able to store.
func (e *badInputEnv) dropVolume(t *testing.T, id string) {
	t.Helper()
	path := e.server.HTTPAddr() + "/v1/volume/csi/" + url.PathEscape(id)
	if ans, err := sendHTTP(e.http, http.MethodDelete, path+"?force=true", nil); err != nil || ans.Status/100 != 2 {
		t.Logf("deregister volume %q: %v %v", id, ans, err)
	}
}

// jobOpts shapes the one-group, one-task raw_exec jobs the rows submit.
type jobOpts struct {
	ID, Type string
	Count    uint64
	// Command is the task's command; with OmitCommand the config has none.
	Command     string
	OmitCommand bool
	Args        []string
	// VolumeSource, if set, is a CSI volume the group requests as "data"
	// and the task mounts at MountDest.
	VolumeSource, MountDest string
}

// jobJSON is a register body for o in the JSON shape of Nomad's API.
func jobJSON(o jobOpts) []byte {
	config := map[string]any{}
	if !o.OmitCommand {
		config["command"] = o.Command
	}
	if len(o.Args) > 0 {
		config["args"] = o.Args
	}
	task := map[string]any{"Name": "t", "Driver": "raw_exec", "Config": config,
		"Resources": map[string]any{"CPU": 20, "MemoryMB": 16}}
	group := map[string]any{"Name": "g", "Count": o.Count, "Tasks": []any{task}}
	if o.VolumeSource != "" {
		group["Volumes"] = map[string]any{"data": map[string]any{
			"Name": "data", "Type": "csi", "Source": o.VolumeSource,
			"AccessMode": api.CSIAccessModeSingleNodeWriter, "AttachmentMode": api.CSIAttachmentModeFilesystem,
		}}
		task["VolumeMounts"] = []any{map[string]any{"Volume": "data", "Destination": o.MountDest}}
	}
	b, _ := json.Marshal(map[string]any{"Job": map[string]any{
		"ID": o.ID, "Name": o.ID, "Type": o.Type, "Datacenters": []string{"dc1"}, "TaskGroups": []any{group},
	}})
	return b
}

// jobHCL is o as a job file.
func jobHCL(o jobOpts) string {
	var config strings.Builder
	if !o.OmitCommand {
		fmt.Fprintf(&config, "        command = %q\n", o.Command)
	}
	if len(o.Args) > 0 {
		fmt.Fprintf(&config, "        args    = %s\n", hclList(o.Args))
	}
	var volume, mount string
	if o.VolumeSource != "" {
		volume = fmt.Sprintf(`    volume "data" {
      type            = "csi"
      source          = %q
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }
`, o.VolumeSource)
		mount = fmt.Sprintf(`      volume_mount {
        volume      = "data"
        destination = %q
      }
`, o.MountDest)
	}
	return fmt.Sprintf(`job %q {
  type        = %q
  datacenters = ["dc1"]
  group "g" {
    count = %d
%s    task "t" {
      driver = "raw_exec"
      config {
%s      }
%s      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
`, o.ID, o.Type, o.Count, volume, config.String(), mount)
}

// parseBody is a /v1/jobs/parse body for an HCL job file.
func parseBody(hcl string) []byte {
	b, _ := json.Marshal(map[string]any{"JobHCL": hcl, "Canonicalize": true})
	return b
}

// sentinel is a directory outside every data dir, where a ../ volume ID
// would land, with a file in it; and the other places such an ID could
// land, which must stay empty.
type sentinel struct {
	// name is the last segment of an escaping volume ID that lands on the
	// sentinel directory; fresh that of one that lands where nothing is.
	name, fresh string
	// dir is the sentinel directory, marker the file in it.
	dir, marker string
	content     []byte
	// elsewhere are the other landing places, none of which may appear.
	elsewhere []string
	// watch sees a landing place appear and go again between two checks,
	// and any change inside the sentinel directory.
	watch *fsWatch
}

// plantSentinel picks two names, and for every ancestor of every base dir
// (where `../` segments climbing out of that base stop) a landing place
// for each: the highest writable landing of the first gets the sentinel
// directory, and none of the others may ever appear. With more ../
// segments than a path is deep the landing is the root, so that is where
// the sentinel goes when it can.
func plantSentinel(t *testing.T, bases ...string) *sentinel {
	t.Helper()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	s := &sentinel{
		name:  "roam-e2e-sentinel-" + hex.EncodeToString(rnd[:]),
		fresh: "roam-e2e-absent-" + hex.EncodeToString(rnd[:]),
	}
	seen := map[string]bool{}
	var landings []string
	for _, b := range bases {
		abs, err := filepath.Abs(b)
		must.NoError(t, err)
		for dir := abs; ; dir = filepath.Dir(dir) {
			if !seen[dir] {
				seen[dir] = true
				landings = append(landings, filepath.Join(dir, s.name))
				s.elsewhere = append(s.elsewhere, filepath.Join(dir, s.fresh))
			}
			if dir == filepath.Dir(dir) {
				break
			}
		}
	}
	// Shallowest first: the root, then /tmp, ...
	sort.SliceStable(landings, func(i, j int) bool {
		return strings.Count(landings[i], string(filepath.Separator)) < strings.Count(landings[j], string(filepath.Separator))
	})
	for i, l := range landings {
		if s.dir == "" && os.Mkdir(l, 0o755) == nil {
			s.dir = l
			s.elsewhere = append(s.elsewhere, landings[:i]...)
			s.elsewhere = append(s.elsewhere, landings[i+1:]...)
			break
		}
	}
	must.NotEq(t, "", s.dir, must.Sprintf("no writable place for the sentinel among %v", landings))
	t.Cleanup(func() { os.RemoveAll(s.dir) })
	s.marker = filepath.Join(s.dir, "keep")
	s.content = []byte("planted by " + t.Name() + "\n")
	must.NoError(t, os.WriteFile(s.marker, s.content, 0o644))
	var parents []string
	for _, l := range append([]string{s.dir}, s.elsewhere...) {
		if p := filepath.Dir(l); !slices.Contains(parents, p) {
			parents = append(parents, p)
		}
	}
	w, err := watchFS(parents, []string{s.name, s.fresh}, []string{s.dir})
	if err != nil {
		t.Logf("sentinel: no watch (%v); checked only after the fact", err)
	} else {
		s.watch = w
		t.Cleanup(w.close)
	}
	t.Logf("sentinel %s; %d other landing places must stay absent", s.dir, len(s.elsewhere))
	return s
}

// check reports anything a ../ volume ID changed: the sentinel directory
// gone, replaced by a link, or its contents changed; any other landing
// place created; or any of that seen happening since the sentinel was
// planted, even if undone since.
func (s *sentinel) check() error {
	var errs []error
	st, err := os.Lstat(s.dir)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("sentinel directory %s: %w", s.dir, err))
	case !st.IsDir():
		errs = append(errs, fmt.Errorf("sentinel %s is no longer a directory (%s)", s.dir, st.Mode()))
	default:
		entries, err := os.ReadDir(s.dir)
		if err != nil {
			errs = append(errs, err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, []string{"keep"}) {
			errs = append(errs, fmt.Errorf("sentinel %s now holds %v", s.dir, names))
		}
		if b, err := os.ReadFile(s.marker); err != nil || string(b) != string(s.content) {
			errs = append(errs, fmt.Errorf("sentinel file %s changed: %q, %v", s.marker, b, err))
		}
	}
	for _, l := range s.elsewhere {
		if st, err := os.Lstat(l); err == nil {
			errs = append(errs, fmt.Errorf("%s appeared (%s)", l, st.Mode()))
		}
	}
	if s.watch != nil {
		for _, ev := range s.watch.events() {
			errs = append(errs, fmt.Errorf("seen: %s", ev))
		}
	}
	return errors.Join(errs...)
}
