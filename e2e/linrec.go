//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/rpc"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
	"github.com/roamhq/roam/internal/lincheck"
	"github.com/roamhq/roam/structs"
)

// The linearizability workload of the chaos run: beside the churn, a few
// workers claim, release, read, deregister and register volumes of their
// own through the public API, each operation recorded with its call and
// return and its outcome (ok, a definite refusal, or unknown), and at the
// end internal/lincheck checks the history against its model of a volume.
//
// The claims are made as the holders' nodes (CSIVolume.Claim with the
// node's secret, as a client makes it), for the running allocations of a
// job that mounts nothing ("lin-holders"): a claim is then the server's
// claim path alone, and every claim of the volumes is in the history.
// Holders whose allocation is over by the end (stopped by its client
// while cut off, lost with its node) are "doomed": the servers may
// release their claims at any time, rightly, and the model allows it.

const (
	// EnvChaosReportDir is where a failed check writes its HTML view
	// (make chaos sets it to the directory that holds chaos.log); a temp
	// dir of the test's when unset.
	EnvChaosReportDir = "ROAM_CHAOS_REPORT_DIR"
	// linHolders is how many holder allocations claim each volume.
	linHolders = 3
	// linCallBound bounds one call: one that passes it is recorded with
	// its outcome unknown.
	linCallBound = 20 * time.Second
	// linCheckTimeout bounds each check: past it the verdict is Unknown,
	// which fails the run as an Illegal one does. A chaos history checks
	// in tens of milliseconds; a minute is the CI budget's limit.
	linCheckTimeout = time.Minute
	linHoldersJob   = "lin-holders"
)

// linMode is one way a worker claims, with its weight.
type linMode struct {
	Mode, Access string
	Weight       int
}

// linVolume is one volume of the workload.
type linVolume struct {
	ID, ExtID string
	Caps      []lincheck.Capability
	Modes     []linMode
}

// linVolumeSpecs: a single-node-writer volume (one writer on one node at
// a time, readers on its node) and a multi-node one (many writers with
// multi-node-multi-writer, many readers with multi-node-reader-only, and
// now and then a write in the reader-only mode, which is refused).
var linVolumeSpecs = []linVolume{
	{ID: "lin0",
		Caps: []lincheck.Capability{{Access: structs.CSIAccessModeSingleNodeWriter, Attach: structs.CSIAttachmentModeFilesystem}},
		Modes: []linMode{
			{structs.CSIVolumeClaimWrite, structs.CSIAccessModeSingleNodeWriter, 8},
			{structs.CSIVolumeClaimRead, structs.CSIAccessModeSingleNodeWriter, 2},
		}},
	{ID: "lin1",
		Caps: []lincheck.Capability{
			{Access: structs.CSIAccessModeMultiNodeMultiWriter, Attach: structs.CSIAttachmentModeFilesystem},
			{Access: structs.CSIAccessModeMultiNodeReader, Attach: structs.CSIAttachmentModeFilesystem},
		},
		Modes: []linMode{
			{structs.CSIVolumeClaimWrite, structs.CSIAccessModeMultiNodeMultiWriter, 5},
			{structs.CSIVolumeClaimRead, structs.CSIAccessModeMultiNodeReader, 4},
			{structs.CSIVolumeClaimWrite, structs.CSIAccessModeMultiNodeReader, 1},
		}},
}

// linWorkload runs the workers and records the history.
type linWorkload struct {
	t    *testing.T
	cc   *csiCluster
	rec  *lincheck.Recorder
	vols []linVolume
	ids  map[string]*nodeIdentity // by node ID

	stop chan struct{}
	wg   sync.WaitGroup

	mu sync.Mutex
	// slots are the running holder for each allocation index, nil when
	// none is.
	slots []*Alloc
	// allocs are every holder allocation seen, by ID, as last seen.
	allocs map[string]*Alloc
	// downNodes are the nodes seen down.
	downNodes map[string]bool
	// clients numbers the workers' processes for porcupine: a worker
	// takes a new number after a call whose outcome is unknown, as that
	// call may still be running.
	clients int
	// noDial counts calls not made because no server took the connection.
	noDial int
}

// startLinWorkload registers the volumes, runs the holder job and starts
// the workers.
func startLinWorkload(t *testing.T, cc *csiCluster, seed int64) *linWorkload {
	t.Helper()
	w := &linWorkload{t: t, cc: cc, ids: make(map[string]*nodeIdentity), stop: make(chan struct{}),
		slots: make([]*Alloc, linHolders), allocs: make(map[string]*Alloc), downNodes: make(map[string]bool)}
	names := make([]string, len(linVolumeSpecs))
	for i, v := range linVolumeSpecs {
		names[i] = v.ID
	}
	exts := cc.createVolumes(t, "client-0", names...)
	for i, v := range linVolumeSpecs {
		v.ExtID = exts[i]
		w.vols = append(w.vols, v)
		code, body, err := w.register(cc.API(), v)
		must.NoError(t, err)
		must.Eq(t, http.StatusOK, code, must.Sprintf("register %s: %s", v.ID, body))
	}
	for _, c := range cc.Clients {
		id, err := readNodeIdentity(c.DataDir)
		must.NoError(t, err)
		w.ids[id.NodeID] = id
	}
	cc.RunJob(serviceJob(linHoldersJob, linHolders, "", sleepScript))
	cc.WaitJobAllocs(linHoldersJob, csiSettle, func(list []*Alloc) error {
		if r := running(list); len(r) != linHolders {
			return fmt.Errorf("%d of %d holders running", len(r), linHolders)
		}
		return nil
	})
	must.NoError(t, w.refresh())
	w.rec = lincheck.NewRecorder()
	w.wg.Add(1)
	go w.watch()
	n := 0
	for vi := range w.vols {
		for slot := 0; slot < linHolders; slot++ {
			n++
			w.wg.Add(1)
			go w.claimer(vi, slot, rand.New(rand.NewSource(seed*1000+int64(n))))
		}
		n++
		w.wg.Add(1)
		go w.reader(vi, rand.New(rand.NewSource(seed*1000+int64(n))))
	}
	t.Cleanup(w.halt)
	return w
}

func (w *linWorkload) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
}

// pause waits d, or less if the workload stops; false once stopped.
func (w *linWorkload) pause(d time.Duration) bool {
	select {
	case <-w.stop:
		return false
	case <-time.After(d):
		return true
	}
}

func (w *linWorkload) newClient() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.clients++
	return w.clients - 1
}

// liveServers are the servers that run and are not paused, from a
// rotating start.
func (w *linWorkload) liveServers(rot int) []*Agent {
	var out []*Agent
	for _, s := range w.cc.Servers {
		if s.Running() && !s.Paused() {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil
	}
	rot %= len(out)
	return append(out[rot:], out[:rot]...)
}

// refresh reads the holders and the nodes from any server.
func (w *linWorkload) refresh() error {
	var errs []string
	for _, s := range w.liveServers(rand.Int()) {
		list, err := JobAllocs(s.HTTPAddr(), linHoldersJob)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		nodes, err := Nodes(s.HTTPAddr(), false)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		slots := make([]*Alloc, linHolders)
		for _, a := range list {
			m := allocIndex.FindStringSubmatch(a.Name)
			if m == nil {
				continue
			}
			k, _ := strconv.Atoi(m[1])
			if k < linHolders && a.Live() && a.ClientStatus == "running" {
				slots[k] = a
			}
		}
		w.mu.Lock()
		w.slots = slots
		for _, a := range list {
			w.allocs[a.ID] = a
		}
		for _, n := range nodes {
			if n.Status == "down" {
				w.downNodes[n.ID] = true
			}
		}
		w.mu.Unlock()
		return nil
	}
	return fmt.Errorf("holders: %s", strings.Join(errs, "; "))
}

// watch refreshes the holders and nodes twice a second.
func (w *linWorkload) watch() {
	defer w.wg.Done()
	for w.pause(500 * time.Millisecond) {
		_ = w.refresh()
	}
}

func (w *linWorkload) holder(slot int) *Alloc {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.slots[slot]
}

func pickMode(rng *rand.Rand, modes []linMode) linMode {
	total := 0
	for _, m := range modes {
		total += m.Weight
	}
	n := rng.Intn(total)
	for _, m := range modes {
		if n < m.Weight {
			return m
		}
		n -= m.Weight
	}
	return modes[len(modes)-1]
}

// claimer claims and releases volume vi for the holder in slot, over and
// over.
func (w *linWorkload) claimer(vi, slot int, rng *rand.Rand) {
	defer w.wg.Done()
	v := w.vols[vi]
	client := w.newClient()
	var conn *rpc.Client
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	var holding bool
	var last string
	for w.pause(300*time.Millisecond + time.Duration(rng.Int63n(int64(700*time.Millisecond)))) {
		a := w.holder(slot)
		if a == nil {
			continue
		}
		if a.ID != last {
			last, holding = a.ID, false
		}
		id := w.ids[a.NodeID]
		if id == nil {
			continue
		}
		in := lincheck.Input{Volume: v.ID, Alloc: a.ID, Node: a.NodeID}
		release := rng.Intn(10) == 0
		if holding {
			release = rng.Intn(5) > 0
		}
		req := structs.CSIVolumeClaimRequest{VolumeID: v.ID, AllocationID: a.ID, NodeID: a.NodeID,
			AttachmentMode: structs.CSIAttachmentModeFilesystem}
		req.AuthToken = id.SecretID
		if release {
			in.Kind = lincheck.KindRelease
			req.State = structs.CSIVolumeClaimStateUnpublishing
			// The release names the claim's modes as a client's does; the
			// server goes by the stored claim.
			req.Mode, req.AccessMode = structs.CSIVolumeClaimWrite, v.Modes[0].Access
		} else {
			m := pickMode(rng, v.Modes)
			in.Kind, in.Mode, in.Access, in.Attach = lincheck.KindClaim, m.Mode, m.Access, structs.CSIAttachmentModeFilesystem
			req.State, req.Mode, req.AccessMode = structs.CSIVolumeClaimStateTaken, m.Mode, m.Access
		}
		if conn == nil {
			for _, s := range w.liveServers(rng.Int()) {
				if c, err := dialRPC(s.RPCAddr()); err == nil {
					conn = c
					break
				}
			}
			if conn == nil {
				w.mu.Lock()
				w.noDial++
				w.mu.Unlock()
				continue
			}
		}
		call := w.rec.Begin(client, in)
		res, detail, broken := w.claimCall(conn, &req)
		call.End(lincheck.Output{Result: res, Detail: detail})
		if broken {
			conn.Close()
			conn = nil
		}
		switch {
		case res == lincheck.OK:
			holding = !release
		case res == lincheck.Unknown:
			holding = rng.Intn(2) == 0
			client = w.newClient()
		}
	}
}

// claimCall makes one Claim call; broken reports a connection that is no
// good any more.
func (w *linWorkload) claimCall(conn *rpc.Client, req *structs.CSIVolumeClaimRequest) (_ lincheck.Result, detail string, broken bool) {
	var reply structs.CSIVolumeClaimResponse
	c := conn.Go("CSIVolume.Claim", req, &reply, make(chan *rpc.Call, 1))
	select {
	case <-c.Done:
	case <-time.After(linCallBound):
		return lincheck.Unknown, fmt.Sprintf("no answer within %s", linCallBound), true
	case <-w.stop:
		return lincheck.Unknown, "stopped with the call in flight", true
	}
	if c.Error == nil {
		return lincheck.OK, "", false
	}
	var se rpc.ServerError
	if !errors.As(c.Error, &se) {
		return lincheck.Unknown, c.Error.Error(), true
	}
	err := structs.FromRPCError(c.Error)
	return classifyClaimError(err), err.Error(), false
}

// classifyClaimError maps a Claim call's error to what it says of the
// change: only refusals that change nothing are definite; everything
// else, a leader lost with the write in flight above all, is unknown.
func classifyClaimError(err error) lincheck.Result {
	switch {
	case errors.Is(err, structs.ErrOutcomeUnknown), errors.Is(err, structs.ErrRaftLogWrite),
		errors.Is(err, structs.ErrStaleLeaderTerm), errors.Is(err, structs.ErrPartlyDone):
		// A call carried out in part changed the claim, whatever stopped
		// it: "in progress" beside it is not a refusal.
		return lincheck.Unknown
	case errors.Is(err, structs.ErrClaimInProgress):
		return lincheck.InProgress
	case errors.Is(err, structs.ErrCSIMaxClaims):
		return lincheck.Busy
	case errors.Is(err, structs.ErrInvalidRequest):
		return lincheck.Invalid
	case errors.Is(err, structs.ErrNotFound) && strings.Contains(err.Error(), "volume"):
		return lincheck.NotFound
	}
	return lincheck.Unknown
}

// reader reads volume vi (now and then a stale read), and now and then
// deregisters it, registering it again once it is gone.
func (w *linWorkload) reader(vi int, rng *rand.Rand) {
	defer w.wg.Done()
	v := w.vols[vi]
	client := w.newClient()
	gone := false
	for w.pause(200*time.Millisecond + time.Duration(rng.Int63n(int64(600*time.Millisecond)))) {
		servers := w.liveServers(rng.Int())
		if len(servers) == 0 {
			continue
		}
		base := servers[0].HTTPAddr()
		var res lincheck.Result
		switch n := rng.Intn(100); {
		case gone || n < 3:
			call := w.rec.Begin(client, lincheck.Input{Volume: v.ID, Kind: lincheck.KindRegister})
			code, body, err := w.register(base, v)
			res = httpResult(code, err)
			call.End(lincheck.Output{Result: res, Detail: detailOf(code, body, err)})
			if res == lincheck.OK {
				gone = false
			}
		case n < 8:
			call := w.rec.Begin(client, lincheck.Input{Volume: v.ID, Kind: lincheck.KindDeregister})
			code, body, err := httpDo("DELETE", base, "/v1/volume/csi/"+url.PathEscape(v.ID), nil)
			res = httpResult(code, err)
			call.End(lincheck.Output{Result: res, Detail: detailOf(code, body, err)})
			if res == lincheck.OK {
				gone = true
			}
		default:
			stale := n >= 90
			call := w.rec.Begin(client, lincheck.Input{Volume: v.ID, Kind: lincheck.KindRead, Stale: stale})
			call.End(w.read(base, v.ID, stale))
			continue
		}
		if res == lincheck.Unknown {
			client = w.newClient()
		}
	}
}

// read is one GET of the volume; a failed one says so with Unknown (and
// is left out of the history).
func (w *linWorkload) read(base, id string, stale bool) lincheck.Output {
	path := "/v1/volume/csi/" + url.PathEscape(id)
	if stale {
		path += "?stale=true"
	}
	code, body, err := httpDo("GET", base, path, nil)
	switch {
	case err != nil:
		return lincheck.Output{Result: lincheck.Unknown, Detail: err.Error()}
	case code == http.StatusNotFound:
		return lincheck.Output{Result: lincheck.OK, Registered: false}
	case code != http.StatusOK:
		return lincheck.Output{Result: lincheck.Unknown, Detail: detailOf(code, body, nil)}
	}
	var vol api.CSIVolume
	if err := json.Unmarshal(body, &vol); err != nil {
		return lincheck.Output{Result: lincheck.Unknown, Detail: err.Error()}
	}
	out := lincheck.Output{Result: lincheck.OK, Registered: true, Claims: make(map[string]lincheck.Phase)}
	for _, c := range vol.Claims {
		p, err := lincheck.PhaseOf(structs.CSIClaimState(c.State))
		if err != nil {
			return lincheck.Output{Result: lincheck.Unknown, Detail: err.Error()}
		}
		out.Claims[c.AllocationID] = p
	}
	return out
}

// register registers v with its capabilities.
func (w *linWorkload) register(base string, v linVolume) (int, []byte, error) {
	var caps []map[string]string
	for _, c := range v.Caps {
		caps = append(caps, map[string]string{"AccessMode": c.Access, "AttachmentMode": c.Attach})
	}
	body := map[string]any{"Volumes": []map[string]any{{
		"ID": v.ID, "Name": v.ID, "ExternalID": v.ExtID, "PluginID": csiPluginID, "RequestedCapabilities": caps,
	}}}
	return httpDo("PUT", base, "/v1/volume/csi/"+url.PathEscape(v.ID), body)
}

// httpResult maps a register's or deregister's answer: 200 done; 400 a
// refusal that changed nothing (invalid, or a claimed volume); 404 not
// registered; anything else unknown.
func httpResult(code int, err error) lincheck.Result {
	switch {
	case err != nil:
		return lincheck.Unknown
	case code == http.StatusOK:
		return lincheck.OK
	case code == http.StatusBadRequest:
		return lincheck.Invalid
	case code == http.StatusNotFound:
		return lincheck.NotFound
	case code == http.StatusConflict:
		return lincheck.InProgress
	}
	return lincheck.Unknown
}

func detailOf(code int, body []byte, err error) string {
	if err != nil {
		return err.Error()
	}
	if code == http.StatusOK {
		return ""
	}
	return fmt.Sprintf("%d %s", code, bytes.TrimSpace(body))
}

// httpDo sends one request and returns the status and body.
func httpDo(method, base, path string, in any) (int, []byte, error) {
	var rd io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := linHTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, body, nil
}

// linHTTP bounds a request as linCallBound bounds a call.
var linHTTP = &http.Client{Timeout: linCallBound, Transport: tokenTransport{http.DefaultTransport}}

// finish stops the workers, works out which holders were doomed, checks
// the history, and shows that the check has teeth on this very history
// (lincheck.SelfChecks): a model with a bug in it and a cut of the
// history with a stale write injected must both fail. A failed check writes porcupine's HTML view to the report
// dir and fails the test.
func (w *linWorkload) finish(t *testing.T, name string) lincheck.Verdict {
	t.Helper()
	w.halt()
	// The last word on the holders: every allocation that is over by now
	// may have had its claims released by the servers.
	must.NoError(t, poll(leaderTimeout, w.refresh))
	spec := lincheck.Spec{Capabilities: make(map[string][]lincheck.Capability), Doomed: make(map[string]bool)}
	for _, v := range w.vols {
		spec.Capabilities[v.ID] = v.Caps
	}
	w.mu.Lock()
	for id, a := range w.allocs {
		if !(a.DesiredStatus == "run" && a.ClientStatus == "running") || w.downNodes[a.NodeID] {
			spec.Doomed[id] = true
		}
	}
	noDial := w.noDial
	w.mu.Unlock()
	history := w.rec.History()
	v := lincheck.Check(spec, history, linCheckTimeout)
	t.Logf("%s %s; holders=%d (doomed %d); calls not made for want of a server: %d", name, v, len(w.allocs), len(spec.Doomed), noDial)
	if v.Result != porcupine.Ok {
		path := w.visualize(t, name, v)
		t.Errorf("%s: the history of the volume API is not linearizable (%s): see %s", name, v.Result, path)
	}
	must.Positive(t, v.Ops, must.Sprint("no operations recorded"))

	checks, err := lincheck.SelfChecks(spec, history, linCheckTimeout)
	for _, c := range checks {
		t.Logf("%s %s", name, c)
		if !c.Passed() {
			t.Errorf("%s: the check has no teeth: %s", name, c)
		}
	}
	must.NoError(t, err)
	return v
}

// visualize writes v's HTML view into the report dir and returns its path.
func (w *linWorkload) visualize(t *testing.T, name string, v lincheck.Verdict) string {
	dir := os.Getenv(EnvChaosReportDir)
	if dir == "" {
		dir = t.TempDir()
	}
	slug := strings.NewReplacer(" ", "-", "/", "-").Replace(name)
	path := filepath.Join(dir, "lincheck-"+slug+".html")
	if err := v.Visualize(path); err != nil {
		t.Errorf("%s: writing the view of the failed check: %v", name, err)
	}
	return path
}
