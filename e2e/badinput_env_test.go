//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
)

// The cluster TestBadInput plays its rows against, and what every row
// checks before and after.

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
	watchAgents(rowObserve, e.server, e.client)
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
