//go:build e2e

package e2e

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test"
	"github.com/shoenig/test/must"
)

// faultHangNodeUnpublish is the hostpath plugin's fault file: while it is
// in a plugin's state dir, every NodeUnpublishVolume of that plugin hangs
// until its caller gives up (see plugins/csi/hostpath/doc.go).
const faultHangNodeUnpublish = "fault-hang-node-unpublish"

// Timeouts of the hung-plugin test: short, so a hung call fails within
// seconds, the server's longer than the client's.
const (
	hangNodeCallTimeout   = 3 * time.Second
	hangNodeDetachTimeout = 5 * time.Second
)

// hangJob is csiJob's job with a service task running script and the
// given kill timeout.
func hangJob(t *testing.T, id, source, script string, killTimeout time.Duration) string {
	t.Helper()
	const driver = `      driver = "raw_exec"`
	job := csiJob(id, "service", 1, source, false, "", script)
	must.StrContains(t, job, driver)
	return strings.Replace(job, driver,
		fmt.Sprintf("      driver       = \"raw_exec\"\n      kill_timeout = %q", killTimeout.String()), 1)
}

// TestCSI_HungNodePluginDelaysOnlyItsVolumes runs two plugins, hanga (A)
// and hostpath (B), on one client, and measures in the same run how long a
// B volume's claim takes to be released after its job is stopped: with
// nothing hung, and while A's NodeUnpublishVolume hangs and an A volume's
// release is stuck in the servers' volume watcher, retrying
// ClientCSI.NodeDetachVolume at each deadline. The hung release may take
// at most 1.5 times its baseline. Then the hang is switched off, and A's
// claim is released by a retry.
//
// The watcher's own isolation (releases of different plugins run
// concurrently) is tested in nomad/volumewatcher; a B release here is its
// client's, since the watcher leaves a live client's claims to it.
func TestCSI_HungNodePluginDelaysOnlyItsVolumes(t *testing.T) {
	const hung = "hanga"
	cc := startCSICluster(t, csiOpts{
		Servers: 1, Clients: 1,
		PublishLatency:    500 * time.Millisecond,
		ExtraPluginIDs:    []string{hung},
		ServerConfigExtra: fmt.Sprintf("server {\n  csi_node_detach_timeout = %q\n}\n", hangNodeDetachTimeout),
		ClientConfigExtra: fmt.Sprintf("client {\n  csi_node_call_timeout = %q\n}\n", hangNodeCallTimeout),
	})
	hungSet := cc.Extra[hung]
	hungPlugin := hungSet.Plugins["client-0"]
	server, client := cc.Servers[0], cc.Clients[0]

	// "a-vol" sorts before the B volumes, so the servers' volume watcher,
	// which goes through volumes in ID order, meets A's first.
	ext := createVolumesAt(t, hungSet.Sockets["client-0"], "a-vol")
	cc.registerVolumeFor(t, hung, "a-vol", ext[0])
	bVols := []string{"b-client-base", "b-client-hung"}
	for i, e := range cc.createVolumes(t, "client-0", bVols...) {
		cc.registerVolumeFor(t, csiPluginID, bVols[i], e)
	}
	jobs := map[string]string{
		"a-vol":         hangJob(t, "a", "a-vol", sleepScript, 5*time.Second),
		"b-client-base": hangJob(t, "b-client-base", "b-client-base", sleepScript, 5*time.Second),
		"b-client-hung": hangJob(t, "b-client-hung", "b-client-hung", sleepScript, 5*time.Second),
	}
	jobOf := func(vol string) string {
		if vol == "a-vol" {
			return "a"
		}
		return vol
	}
	for _, vol := range sortedKeys(jobs) {
		cc.RunJob(jobs[vol])
	}
	for _, vol := range sortedKeys(jobs) {
		a := cc.waitCSIAllocs(t, jobOf(vol), csiSettle, oneAlloc("running"))[0]
		WaitFor(t, csiSettle, func() error {
			v, err := cc.volume(vol)
			if err != nil {
				return err
			}
			if len(v.Claims) != 1 || v.Claims[0].AllocationID != a.ID || v.Claims[0].State != "taken" {
				return fmt.Errorf("volume %s: want one taken claim by %s: %s", vol, a, claimsString(v))
			}
			return nil
		})
	}

	// release stops vol's job and returns how long its claim took to go,
	// the client status of its allocation then, and who released it.
	release := func(vol string) (took time.Duration, status, by string) {
		t.Helper()
		job := jobOf(vol)
		start := time.Now()
		must.NoError(t, SendJSON("DELETE", cc.API(), "/v1/job/"+url.PathEscape(job), nil, nil))
		err := pollEvery(csiSettle, 20*time.Millisecond, func() error {
			v, err := cc.volume(vol)
			if err != nil {
				return err
			}
			if len(v.Claims) != 0 {
				return fmt.Errorf("volume %s still claimed %s after its job was stopped: %s",
					vol, time.Since(start).Round(time.Millisecond), claimsString(v))
			}
			return nil
		})
		took = time.Since(start)
		must.NoError(t, err)
		list, err := JobAllocs(cc.API(), job)
		must.NoError(t, err)
		must.Len(t, 1, list)
		// The watcher logs each claim it released, just after the release:
		// give the line a moment to reach the log.
		by = "its client"
		if pollEvery(2*time.Second, 50*time.Millisecond, func() error {
			for _, line := range strings.Split(server.Log(), "\n") {
				if strings.Contains(line, "volume_watcher: claim released") && strings.Contains(line, "volume_id="+vol+" ") {
					return nil
				}
			}
			return fmt.Errorf("no watcher release of %s", vol)
		}) == nil {
			by = "the servers' volume watcher"
		}
		return took, list[0].ClientStatus, by
	}
	hangs := func() int { return strings.Count(hungPlugin.Log(), "fault injected: call hangs") }
	// nextHang waits until a NodeUnpublishVolume of A starts hanging after
	// the n seen so far, and returns the new count.
	nextHang := func(n int) int {
		t.Helper()
		var got int
		err := pollEvery(2*time.Minute, 20*time.Millisecond, func() error {
			if got = hangs(); got <= n {
				return fmt.Errorf("no NodeUnpublishVolume of %s hung after the first %d", hung, n)
			}
			return nil
		})
		must.NoError(t, err)
		return got
	}
	aClaim := func() string {
		v, err := cc.volume("a-vol")
		must.NoError(t, err)
		return claimsString(v)
	}

	// Baselines, with nothing hung.
	clientBase, clientBaseStatus, clientBaseBy := release("b-client-base")

	// A hangs; its release starts and gets stuck.
	faultPath := filepath.Join(hungSet.StateDir, faultHangNodeUnpublish)
	must.NoError(t, os.WriteFile(faultPath, []byte("until-cancel\n"), 0o644))
	t.Cleanup(func() { os.Remove(faultPath) })
	must.NoError(t, SendJSON("DELETE", cc.API(), "/v1/job/a", nil, nil))
	// The client's own unmount of A fails at its deadline and leaves the
	// claim to the servers; from then on every hung call is the volume
	// watcher's retry of NodeDetachVolume.
	WaitFor(t, csiSettle, func() error {
		if !strings.Contains(client.Log(), "failed to unmount volumes") {
			return fmt.Errorf("the client's own unmount of a-vol has not failed yet (%d hung calls; claim %s)", hangs(), aClaim())
		}
		return nil
	})
	n := hangs()
	must.Positive(t, n)

	// The watcher is now inside a hung NodeDetachVolume of A: stop a B
	// job each time a new one starts.
	n = nextHang(n)
	stateA := aClaim()
	clientHung, clientHungStatus, clientHungBy := release("b-client-hung")
	va, err := cc.volume("a-vol")
	must.NoError(t, err)
	must.Len(t, 1, va.Claims, must.Sprintf("A's release must still be stuck once B's was measured: %s", claimsString(va)))

	clientRatio := float64(clientHung) / float64(clientBase)
	t.Logf("node call timeout %s, node detach timeout %s, publish latency 500ms",
		hangNodeCallTimeout, hangNodeDetachTimeout)
	t.Logf("A's claim while B was measured: %s; %d hung NodeUnpublishVolume calls of A so far", stateA, n)
	t.Logf("B release, task exits at once:  baseline %s (alloc %s, released by %s), A hung %s (alloc %s, released by %s): ratio %.2f",
		clientBase.Round(time.Millisecond), clientBaseStatus, clientBaseBy,
		clientHung.Round(time.Millisecond), clientHungStatus, clientHungBy, clientRatio)
	test.LessEq(t, 1.5, clientRatio, test.Sprintf("a B release whose task exits at once waited for hung plugin %s", hung))

	// Well again: a retry releases A's claim.
	must.NoError(t, os.Remove(faultPath))
	healed := time.Now()
	WaitFor(t, 2*time.Minute, func() error {
		v, err := cc.volume("a-vol")
		if err != nil {
			return err
		}
		if len(v.Claims) != 0 {
			return fmt.Errorf("a-vol still claimed %s after the hang was switched off: %s",
				time.Since(healed).Round(time.Millisecond), claimsString(v))
		}
		return nil
	})
	t.Logf("A's claim released %s after the hang was switched off", time.Since(healed).Round(time.Millisecond))
}
