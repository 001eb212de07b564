//go:build e2e

package e2e

import (
	"fmt"
	"math/rand"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
)

// Claim churn for the fault scenarios and the chaos run: a few workers,
// each with a single-node-writer volume and a service job of its own
// whose task appends "<alloc ID> <n> <ns>" to the volume (seqWriterScript).
// A worker runs its job, waits until the servers acknowledge the claim (a
// running allocation holds it, taken), lets it write a moment, stops the
// job, waits until the claim is gone, and starts over. Faults make steps
// fail or stall; a worker then moves on, since availability under a fault
// is not what the checker judges.
//
// The checker (claimChurn.check) then asks, after a heal:
//   - 0 overlapping destructive calls at the provider, and in each plugin
//     process;
//   - 0 acknowledged claims lost: a claim seen taken by a running
//     allocation is not gone while that allocation still runs. A monitor
//     polls every second; a claim gone while the servers list its
//     allocation as running on a node that is not down is a suspect, and
//     it is a loss if the allocation's task wrote to the volume after the
//     monitor saw the claim gone. (A client that stopped an allocation
//     itself, or found it dead after a restart, releases the claim before
//     its batched status update tells the servers: the claim is then gone
//     while the servers still say running, rightly.) A loss shorter than
//     the monitor's 1 s poll can be missed; the data check below still
//     sees any second writer it let in.
//   - never two live writers on a volume, from the data on it
//     (checkWriters: each allocation's lines one unbroken run);
//   - every allocation's claims match its status, and every attach at the
//     provider has its claim (claimsSettled), within csiSettle of the heal.

// churnStepTimeout bounds one step of a churn cycle (claim acknowledged,
// claim released). A step that passes it is counted as stalled, not failed.
const churnStepTimeout = 60 * time.Second

// ackedClaim is a claim the servers acknowledged to a running allocation.
type ackedClaim struct {
	Vol, Alloc string
	At         time.Time
	// Released is when the monitor saw the claim gone, zero while held.
	Released time.Time
}

// claimChurn runs the churn workers and the acknowledged-claims monitor.
type claimChurn struct {
	cc   *csiCluster
	t    *testing.T
	vols []volRef
	jobs []string
	// extra is the churn's plugin set when it is not the default plugin.
	extra *csiPluginSet

	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	cycles   int
	stalled  int
	acked    map[string]*ackedClaim // by alloc ID
	suspects []suspectClaim
	errs     map[string]int // first words of step errors, counted
}

// newClaimChurn creates n churn volumes of the default plugin and
// registers them; start begins the cycles.
func newClaimChurn(t *testing.T, cc *csiCluster, n int) *claimChurn {
	t.Helper()
	return newClaimChurnOn(t, cc, n, csiPluginID)
}

// churnPluginID is the second plugin (csiOpts.ExtraPluginIDs) that the
// churn of scenarios 1–4 uses, so that the scenario's own volume has its
// plugin's lane to itself: a node cut off with a controller call in flight
// holds its plugin's calls until the call is known finished (the fence),
// up to the 2-minute call deadline, which would otherwise delay the
// scenario's own replacement past its bounds.
const churnPluginID = "churnpath"

// newClaimChurnOn is newClaimChurn with the volumes on pluginID, the
// default plugin or one of csiOpts.ExtraPluginIDs.
func newClaimChurnOn(t *testing.T, cc *csiCluster, n int, pluginID string) *claimChurn {
	t.Helper()
	ch := &claimChurn{cc: cc, t: t, stop: make(chan struct{}), acked: make(map[string]*ackedClaim), errs: make(map[string]int)}
	var names []string
	for i := 0; i < n; i++ {
		names = append(names, fmt.Sprintf("churn%d", i))
	}
	stateDir, sock := cc.StateDir, cc.Sockets["client-0"]
	if pluginID != csiPluginID {
		set := cc.Extra[pluginID]
		must.NotNil(t, set, must.Sprintf("plugin %q is not one of the cluster's extra plugins", pluginID))
		stateDir, sock = set.StateDir, set.Sockets["client-0"]
		ch.extra = set
	}
	exts := createVolumesAt(t, sock, names...)
	for i, name := range names {
		cc.registerVolumeFor(t, pluginID, name, exts[i])
		ch.vols = append(ch.vols, volRef{ID: name, ExtID: exts[i], StateDir: stateDir})
		ch.jobs = append(ch.jobs, "job-"+name)
	}
	return ch
}

// waitCycled waits until the churn has cycled n more claims (claimed and
// released), so that counts of 0 after a fault say something of claims
// that ran through it.
func (ch *claimChurn) waitCycled(what string, n int) {
	ch.t.Helper()
	ch.mu.Lock()
	from := ch.cycles
	ch.mu.Unlock()
	WaitFor(ch.t, 2*time.Minute, func() error {
		ch.mu.Lock()
		defer ch.mu.Unlock()
		if ch.cycles < from+n {
			return fmt.Errorf("%s: %d of %d claims cycled", what, ch.cycles-from, n)
		}
		return nil
	})
}

// start runs one worker per volume, each with its own random source
// derived from seed, and the monitor.
func (ch *claimChurn) start(seed int64) {
	for i := range ch.vols {
		ch.wg.Add(1)
		go ch.worker(i, rand.New(rand.NewSource(seed+int64(i)+1)))
	}
	ch.wg.Add(1)
	go ch.monitor()
}

// halt stops the workers and the monitor and waits for them; the jobs are
// left as they are (running or stopped) for the checker.
func (ch *claimChurn) halt() {
	select {
	case <-ch.stop:
	default:
		close(ch.stop)
	}
	ch.wg.Wait()
}

func (ch *claimChurn) stopped() bool {
	select {
	case <-ch.stop:
		return true
	default:
		return false
	}
}

// servers returns the HTTP addresses of the running, not paused servers,
// starting at a rotating offset so that a cut-off one is not always first.
func (ch *claimChurn) servers(rot int) []string {
	var out []string
	for _, s := range ch.cc.Servers {
		if s.Running() && !s.Paused() {
			out = append(out, s.HTTPAddr())
		}
	}
	if len(out) == 0 {
		return nil
	}
	rot %= len(out)
	return append(out[rot:], out[:rot]...)
}

// onAnyServer runs f against each live server in turn until one succeeds.
func (ch *claimChurn) onAnyServer(rot int, f func(base string) error) error {
	var errs []string
	for _, base := range ch.servers(rot) {
		err := f(base)
		if err == nil {
			return nil
		}
		errs = append(errs, err.Error())
	}
	if len(errs) == 0 {
		return fmt.Errorf("no server running")
	}
	return fmt.Errorf("every server failed: %s", strings.Join(errs, "; "))
}

func (ch *claimChurn) noteErr(step string, err error) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.errs[step]++
	_ = err
}

// waitStep polls cond every pollGap until it holds, the step times out, or
// the churn stops.
func (ch *claimChurn) waitStep(cond func() error) error {
	deadline := time.Now().Add(churnStepTimeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if ch.stopped() {
			return fmt.Errorf("churn stopped: %w", err)
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ch.stop:
		case <-time.After(pollGap):
		}
	}
}

// worker cycles volume i's claim until halted.
func (ch *claimChurn) worker(i int, rng *rand.Rand) {
	defer ch.wg.Done()
	vol, job := ch.vols[i], ch.jobs[i]
	path := filepath.Join(ch.t.TempDir(), job+".hcl")
	if err := os.WriteFile(path, []byte(seqWriterJob(job, vol.ID)), 0o644); err != nil {
		ch.noteErr("write job", err)
		return
	}
	for rot := i; !ch.stopped(); rot++ {
		if err := ch.onAnyServer(rot, func(base string) error {
			_, errOut, code := RunCLIAt(ch.t, base, "job", "run", "-detach", path)
			if code != 0 {
				return fmt.Errorf("job run: exit %d: %s", code, strings.TrimSpace(errOut))
			}
			return nil
		}); err != nil {
			ch.noteErr("run", err)
			ch.pause(rng, time.Second)
			continue
		}
		var holder string
		err := ch.waitStep(func() error {
			return ch.onAnyServer(rot, func(base string) error {
				id, err := ch.takenByRunning(base, vol.ID, job)
				holder = id
				return err
			})
		})
		if err != nil {
			if !ch.stopped() {
				ch.mu.Lock()
				ch.stalled++
				ch.mu.Unlock()
			}
		} else {
			ch.mu.Lock()
			if ch.acked[holder] == nil {
				ch.acked[holder] = &ackedClaim{Vol: vol.ID, Alloc: holder, At: time.Now()}
			}
			ch.mu.Unlock()
		}
		ch.pause(rng, time.Second+time.Duration(rng.Int63n(int64(2*time.Second))))
		if ch.stopped() {
			return
		}
		if err := ch.onAnyServer(rot, func(base string) error {
			_, errOut, code := RunCLIAt(ch.t, base, "job", "stop", "-detach", job)
			if code != 0 {
				return fmt.Errorf("job stop: exit %d: %s", code, strings.TrimSpace(errOut))
			}
			return nil
		}); err != nil {
			ch.noteErr("stop", err)
			continue
		}
		if holder == "" {
			continue
		}
		err = ch.waitStep(func() error {
			return ch.onAnyServer(rot, func(base string) error {
				var v api.CSIVolume
				if err := GetJSON(base, "/v1/volume/csi/"+url.PathEscape(vol.ID), &v); err != nil {
					return err
				}
				for _, c := range v.Claims {
					if c.AllocationID == holder {
						return fmt.Errorf("%s still claimed by %.8s (%s)", vol.ID, holder, c.State)
					}
				}
				return nil
			})
		})
		ch.mu.Lock()
		if err == nil {
			ch.cycles++
		} else if !ch.stopped() {
			ch.stalled++
		}
		ch.mu.Unlock()
	}
}

// pause waits d or until the churn stops.
func (ch *claimChurn) pause(_ *rand.Rand, d time.Duration) {
	select {
	case <-ch.stop:
	case <-time.After(d):
	}
}

// takenByRunning returns the allocation of job that holds a taken claim on
// vol and is running (desired run), if any.
func (ch *claimChurn) takenByRunning(base, vol, job string) (string, error) {
	var v api.CSIVolume
	if err := GetJSON(base, "/v1/volume/csi/"+url.PathEscape(vol), &v); err != nil {
		return "", err
	}
	list, err := JobAllocs(base, job)
	if err != nil {
		return "", err
	}
	for _, c := range v.Claims {
		if c.State != "taken" {
			continue
		}
		for _, a := range list {
			if a.ID == c.AllocationID && a.DesiredStatus == "run" && a.ClientStatus == "running" {
				return a.ID, nil
			}
		}
	}
	return "", fmt.Errorf("%s: no taken claim by a running allocation of %s: %s", vol, job, claimsString(&v))
}

// monitor checks every acknowledged claim each second until halted, and
// once more after.
func (ch *claimChurn) monitor() {
	defer ch.wg.Done()
	for rot := 0; ; rot++ {
		select {
		case <-ch.stop:
			ch.checkAcked(rot)
			return
		case <-time.After(time.Second):
		}
		ch.checkAcked(rot)
	}
}

// checkAcked looks at every acknowledged claim still held: gone from its
// volume while the servers list its allocation as running on a node that
// is not down is a lost claim. Reads come from one server, volume first,
// so the allocation read is no older than the volume read.
func (ch *claimChurn) checkAcked(rot int) {
	ch.mu.Lock()
	var held []*ackedClaim
	for _, a := range ch.acked {
		if a.Released.IsZero() {
			held = append(held, a)
		}
	}
	ch.mu.Unlock()
	for _, a := range held {
		_ = ch.onAnyServer(rot, func(base string) error {
			var v api.CSIVolume
			if err := GetJSON(base, "/v1/volume/csi/"+url.PathEscape(a.Vol), &v); err != nil {
				return err
			}
			for _, c := range v.Claims {
				if c.AllocationID == a.Alloc {
					return nil
				}
			}
			var al Alloc
			if err := GetJSON(base, "/v1/allocation/"+a.Alloc, &al); err != nil {
				return err
			}
			now := time.Now()
			if al.ClientStatus == "running" {
				n, err := NodeInfo(base, al.NodeID)
				if err != nil {
					return err
				}
				if n.Status != "down" {
					ch.mu.Lock()
					ch.suspects = append(ch.suspects, suspectClaim{Vol: a.Vol, Alloc: a.Alloc, SeenGone: now,
						Detail: fmt.Sprintf("%s: claim by %s (acknowledged %s) seen gone at %s while the servers list it running on %s (%s)",
							a.Vol, &al, a.At.Format("15:04:05.000"), now.Format("15:04:05.000"), n.Name, n.Status)})
					ch.mu.Unlock()
				}
			}
			ch.mu.Lock()
			a.Released = now
			ch.mu.Unlock()
			return nil
		})
	}
}

// suspectClaim is an acknowledged claim seen gone while the servers still
// listed its allocation as running.
type suspectClaim struct {
	Vol, Alloc, Detail string
	SeenGone           time.Time
}

// churnReport is what the checker counted.
type churnReport struct {
	Cycles, Stalled, Acked int
	Lost                   []string
	// ReleasedFirst counts suspects whose task had stopped writing before
	// the claim was seen gone: released by their client ahead of its
	// status update.
	ReleasedFirst           int
	ProviderOverlaps        int64
	ProcessOverlaps         string
	WriterViolations        int
	WriterLines, WriterRuns int
	Settle                  time.Duration
	Errors                  string
	writerDetail            []string
}

func (r churnReport) String() string {
	return fmt.Sprintf("provider overlaps=%d per-process overlaps=%s acknowledged claims lost=%d (of %d acknowledged; %d released by their client before the servers heard the allocation stopped) "+
		"two-writer violations=%d (%d lines, %d writer runs) claims/status mismatches=0 (settled %s after the heal); "+
		"claims cycled=%d stalled steps=%d step errors=%s",
		r.ProviderOverlaps, r.ProcessOverlaps, len(r.Lost), r.Acked, r.ReleasedFirst, r.WriterViolations, r.WriterLines, r.WriterRuns,
		r.Settle.Round(time.Millisecond), r.Cycles, r.Stalled, r.Errors)
}

// check halts the churn and runs the checker once every fault is healed
// (healAt): it waits up to csiSettle for claims, allocations and
// attachments to agree, then counts and asserts every invariant. extraVols
// and extraJobs are more volumes and jobs of the scenario to settle.
func (ch *claimChurn) check(t *testing.T, scenario string, healAt time.Time, extraVols []volRef, extraJobs []string, volFor func(*Alloc) string) churnReport {
	t.Helper()
	ch.halt()
	cc := ch.cc
	vols := append(append([]volRef(nil), ch.vols...), extraVols...)
	jobs := append(append([]string(nil), ch.jobs...), extraJobs...)
	churnVolFor := func(a *Alloc) string {
		if strings.HasPrefix(a.JobID, "job-churn") {
			return strings.TrimPrefix(a.JobID, "job-")
		}
		return volFor(a)
	}
	var rep churnReport
	err := poll(csiSettle, func() error {
		return cc.claimsSettled(vols, jobs, churnVolFor)
	})
	must.NoError(t, err, must.Sprintf("%s: claims unsettled %s after the heal", scenario, csiSettle))
	rep.Settle = time.Since(healAt)
	// The monitor's last look ran before the settle; look once more.
	ch.checkAcked(0)

	ch.mu.Lock()
	rep.Cycles, rep.Stalled, rep.Acked = ch.cycles, ch.stalled, len(ch.acked)
	suspects := append([]suspectClaim(nil), ch.suspects...)
	var errs []string
	for k, n := range ch.errs {
		errs = append(errs, fmt.Sprintf("%s×%d", k, n))
	}
	ch.mu.Unlock()
	sort.Strings(errs)
	rep.Errors = "[" + strings.Join(errs, " ") + "]"

	rep.ProviderOverlaps, err = providerOverlaps(cc.StateDir)
	must.NoError(t, err)
	rep.ProcessOverlaps = overlapCounts(cc)
	lastWrite := make(map[string]time.Time) // volume/alloc → its last line's time
	for _, v := range vols {
		w, err := checkWriters(filepath.Join(v.StateDir, "volumes", v.ExtID, "log"))
		if os.IsNotExist(err) {
			continue
		}
		must.NoError(t, err)
		for _, run := range w.Runs {
			if k := v.ID + "/" + run.Alloc; run.End.After(lastWrite[k]) {
				lastWrite[k] = run.End
			}
		}
		rep.WriterViolations += len(w.Violations)
		rep.WriterLines += w.Lines
		rep.WriterRuns += len(w.Runs)
		if len(w.Violations) > 0 {
			rep.writerDetail = append(rep.writerDetail, v.ID+": "+w.String())
		}
	}
	for _, sc := range suspects {
		last := lastWrite[sc.Vol+"/"+sc.Alloc]
		if last.After(sc.SeenGone) {
			rep.Lost = append(rep.Lost, fmt.Sprintf("%s; its task wrote until %s", sc.Detail, last.Format("15:04:05.000")))
			continue
		}
		rep.ReleasedFirst++
		t.Logf("%s: released by its client first (last write %s)", sc.Detail, last.Format("15:04:05.000"))
	}
	t.Logf("%s invariants: %s", scenario, rep)
	must.SliceEmpty(t, rep.Lost, must.Sprintf("%s: acknowledged claims lost:\n%s", scenario, strings.Join(rep.Lost, "\n")))
	must.Eq(t, 0, rep.WriterViolations, must.Sprintf("%s: two live writers on a single-writer volume:\n%s",
		scenario, strings.Join(rep.writerDetail, "\n")))
	cc.mustNoOverlaps(t)
	if ch.extra != nil {
		n, err := providerOverlaps(ch.extra.StateDir)
		must.NoError(t, err)
		must.Eq(t, 0, n, must.Sprintf("%s: plugin %s's provider saw overlapping destructive calls", scenario, ch.extra.ID))
		cc.mustNoOverlapsIn(t, ch.extra)
	}
	return rep
}
