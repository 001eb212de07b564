//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/roamhq/roam/api"
	"github.com/shoenig/test/must"
)

// uiWait bounds each wait for the UI to show something.
const uiWait = 30 * time.Second

// startDevUI starts a `roam agent -dev` and waits until it leads and its
// built-in hostpath plugin is healthy, so volumes can be created.
func startDevUI(t *testing.T) *Agent {
	t.Helper()
	p := FreePorts(t, 2)
	a := StartAgent(t, "dev", p[0], p[1],
		"agent", "-dev", "-http-port", strconv.Itoa(p[0]), "-rpc-port", strconv.Itoa(p[1]))
	WaitFor(t, settle, func() error {
		var plug api.CSIPlugin
		if err := GetJSON(a.HTTPAddr(), "/v1/plugin/csi/"+csiPluginID, &plug); err != nil {
			return err
		}
		if plug.NodesHealthy < 1 || plug.ControllersHealthy < 1 {
			return fmt.Errorf("plugin %s: controllers %d, nodes %d healthy", csiPluginID, plug.ControllersHealthy, plug.NodesHealthy)
		}
		return nil
	})
	return a
}

// writeTemp writes content to a file in the test's temp dir.
func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	must.NoError(t, os.WriteFile(path, []byte(content), 0o644))
	return path
}

// TestUI_VolumeClaimLive: the volumes page lists a created volume; once a
// job claims it the volume page shows the claim reach taken, and once the
// job stops, freed — both without a reload, from the event stream.
func TestUI_VolumeClaimLive(t *testing.T) {
	a := startDevUI(t)
	b := newBrowser(t)
	base := a.HTTPAddr()

	mustCLIAt(t, base, "volume", "create", writeTemp(t, "vol.hcl", createVolumeSpec("ui-vol", "1MiB", "")))

	b.navigate(base + "/")
	must.NoError(t, b.waitJS(uiWait, `location.pathname === "/ui/cluster" && document.querySelector("tr[data-node]") !== null`))
	b.checkLayout("cluster")
	b.checkA11y("cluster")
	b.screenshot("ui-cluster")

	b.navigate(base + "/ui/volumes")
	must.NoError(t, b.waitJS(uiWait, `document.querySelector('tr[data-volume="ui-vol"]') !== null`))
	b.checkLayout("volumes")
	b.checkA11y("volumes")
	b.screenshot("ui-volumes")

	b.navigate(base + "/ui/volume/ui-vol")
	must.NoError(t, b.waitJS(uiWait, `document.getElementById("no-claims") !== null`))
	// A marker that a reload would wipe out.
	must.NoError(t, b.waitJS(uiWait, `(window.__noReload = true)`))

	mustCLIAt(t, base, "job", "run", "-detach", writeTemp(t, "job.hcl",
		csiJob("ui-job", "service", 1, "ui-vol", false, "", "sleep 3600")))
	must.NoError(t, b.waitJS(uiWait, `document.querySelector('tr[data-claim][data-claim-state="taken"]') !== null`))
	must.NoError(t, b.waitJS(time.Second, `window.__noReload === true`), must.Sprint("the page reloaded"))
	b.checkLayout("volume (taken)")
	b.screenshot("ui-volume-taken")

	mustCLIAt(t, base, "job", "stop", "-detach", "ui-job")
	must.NoError(t, b.waitJS(uiWait, `document.getElementById("no-claims") !== null &&
		document.querySelector('#claim-timeline li[data-state="freed"]') !== null`))
	must.NoError(t, b.waitJS(time.Second, `window.__noReload === true`), must.Sprint("the page reloaded"))
	// From the event stream the timeline saw every checkpointed state, in
	// order: publishing, taken, node-detached (after unpublishing when the
	// volume watcher, not the client, began the release), freed.
	must.NoError(t, b.waitJS(time.Second, `(function () {
  var s = Array.prototype.map.call(document.querySelectorAll("#claim-timeline li"), function (li) { return li.getAttribute("data-state"); });
  var want = ["publishing", "taken", "node-detached", "freed"], at = -1;
  for (var i = 0; i < want.length; i++) { var j = s.indexOf(want[i]); if (j <= at) return false; at = j; }
  return true;
})()`))
	states, err := evalJS[string](b, `Array.prototype.map.call(document.querySelectorAll("#claim-timeline li"), function (li) { return li.textContent; }).join("\n")`)
	must.NoError(t, err)
	t.Logf("claim timeline:\n%s", states)
	b.checkLayout("volume (freed)")
	b.checkA11y("volume (freed)")
	b.screenshot("ui-volume-freed")

	b.navigate(base + "/ui/plugins")
	must.NoError(t, b.waitJS(uiWait, `document.querySelector('tr[data-plugin="`+csiPluginID+`"]') !== null`))
	b.checkLayout("plugins")
	b.checkA11y("plugins")
	b.screenshot("ui-plugins")

	// The node page's drain button drains the node and stops the drain,
	// and the page shows each without a reload. A bad deadline is refused
	// in the page and changes nothing.
	nodes, err := Nodes(base, false)
	must.NoError(t, err)
	must.Len(t, 1, nodes)
	b.navigate(base + "/ui/node/" + nodes[0].ID)
	must.NoError(t, b.waitJS(uiWait, `document.getElementById("drain-button") !== null`))
	must.NoError(t, b.waitJS(time.Second, `(window.__noReload = true)`))
	must.NoError(t, b.waitJS(time.Second, `(function () {
  document.getElementById("drain-deadline").value = "soon";
  document.getElementById("drain-button").click();
  return true;
})()`))
	must.NoError(t, b.waitJS(uiWait, `document.getElementById("drain-result").textContent.indexOf("Invalid deadline") >= 0`))
	must.NoError(t, b.waitJS(time.Second, `(function () {
  document.getElementById("drain-deadline").value = "10m";
  document.getElementById("drain-ignore-system").checked = true;
  document.getElementById("drain-button").click();
  return true;
})()`))
	// With nothing to migrate the drain may end at once: what stays is
	// the node marked ineligible, and the page offers to undo it.
	must.NoError(t, b.waitJS(uiWait, `document.getElementById("node-eligibility").textContent === "ineligible" &&
		document.getElementById("drain-result").textContent === "Drain started."`))
	node, err := NodeInfo(base, nodes[0].ID)
	must.NoError(t, err)
	must.EqOp(t, "ineligible", node.SchedulingEligibility)
	b.checkLayout("node (drained)")
	b.screenshot("ui-node-drained")
	must.NoError(t, b.waitJS(uiWait, `(function () {
  var b = document.getElementById("drain-button");
  if (b && b.getAttribute("data-action") === "stop") { b.click(); return false; }
  var e = document.getElementById("eligible-button");
  if (e) { e.click(); return true; }
  return false;
})()`))
	must.NoError(t, b.waitJS(uiWait, `document.getElementById("node-eligibility").textContent === "eligible"`))
	must.NoError(t, b.waitJS(time.Second, `window.__noReload === true`), must.Sprint("the page reloaded"))
	b.checkLayout("node")
	b.checkA11y("node")
	b.screenshot("ui-node")

	// Jobs, the job with its allocation and volume, the allocation with
	// its task events and log tail.
	b.navigate(base + "/ui/jobs")
	must.NoError(t, b.waitJS(uiWait, `document.querySelector('tr[data-job="ui-job"] a') !== null`))
	b.checkLayout("jobs")
	b.checkA11y("jobs")
	b.screenshot("ui-jobs")
	b.navigate(base + "/ui/job/ui-job")
	must.NoError(t, b.waitJS(uiWait, `document.querySelector('a[href="/ui/volume/ui-vol"]') !== null &&
		document.querySelector("tr[data-alloc] a") !== null`))
	b.checkLayout("job")
	b.checkA11y("job")
	b.screenshot("ui-job")
	must.NoError(t, b.waitJS(time.Second, `(document.querySelector("tr[data-alloc] a").click(), true)`))
	must.NoError(t, b.waitJS(uiWait, `location.pathname.indexOf("/ui/alloc/") === 0 &&
		document.querySelector('tr[data-task-event="Started"]') !== null &&
		Array.prototype.every.call(document.querySelectorAll("pre[data-log]"), function (p) { return p.textContent !== ""; })`))
	b.checkLayout("alloc")
	b.checkA11y("alloc")
	b.screenshot("ui-alloc")
}

// TestUI_VolumesFirstPaint measures, in the browser, the first contentful
// paint of the volumes page with 1,000 volumes on a dev agent (its first
// page of 250, the summary counting all 1,000), and of the page with none,
// best of 5 each in the same run. The target is 300 ms; on a
// shared machine an absolute bound is noise, so the test holds the ratio
// to the empty page (at most 4x) and reports the figure against the
// target.
func TestUI_VolumesFirstPaint(t *testing.T) {
	a := startDevUI(t)
	b := newBrowser(t)
	base := a.HTTPAddr()

	paint := func() (float64, int) {
		b.navigate(base + "/ui/volumes")
		must.NoError(t, b.waitJS(uiWait, `performance.getEntriesByName("first-contentful-paint").length > 0`))
		fcp, err := evalJS[float64](b, `performance.getEntriesByName("first-contentful-paint")[0].startTime`)
		must.NoError(t, err)
		rows, err := evalJS[int](b, `document.querySelectorAll("tr[data-volume]").length`)
		must.NoError(t, err)
		nav, err := evalJS[string](b, `(function () { var n = performance.getEntriesByType("navigation")[0];
  return "request " + n.requestStart.toFixed(0) + ", response " + n.responseStart.toFixed(0) + "–" + n.responseEnd.toFixed(0) +
    " ms, DOM interactive " + n.domInteractive.toFixed(0) + " ms, " + n.transferSize + " bytes"; })()`)
		must.NoError(t, err)
		t.Logf("%d rows: first contentful paint %.0f ms; %s", rows, fcp, nav)
		return fcp, rows
	}
	// Warm the browser and the agent once.
	paint()
	empty := -1.0
	for range 5 {
		fcp, rows := paint()
		must.EqOp(t, 0, rows)
		if empty < 0 || fcp < empty {
			empty = fcp
		}
	}

	const n = 1000
	const batch = 100
	for i := 0; i < n; i += batch {
		vols := make([]map[string]any, 0, batch)
		for j := i; j < i+batch; j++ {
			id := fmt.Sprintf("fp-%04d", j)
			vols = append(vols, map[string]any{
				"ID": id, "Name": id, "ExternalID": "ext-" + id, "PluginID": csiPluginID,
				"RequestedCapabilities": []map[string]string{{
					"AccessMode": api.CSIAccessModeSingleNodeWriter, "AttachmentMode": api.CSIAttachmentModeFilesystem,
				}},
			})
		}
		must.NoError(t, SendJSON("PUT", base, "/v1/volume/csi/"+url.PathEscape(vols[0]["ID"].(string)),
			map[string]any{"Volumes": vols}, nil))
	}
	best := -1.0
	for range 5 {
		full, rows := paint()
		// The first page of 250; the summary counts them all.
		must.EqOp(t, 250, rows)
		if best < 0 || full < best {
			best = full
		}
	}
	must.NoError(t, b.waitJS(time.Second, `document.querySelector("p.summary").textContent.indexOf("1000 volumes") === 0`))
	b.checkLayout("volumes (1000)")
	b.screenshot("ui-volumes-1000")
	// Every volume is reachable: the last page holds the last one.
	for page := 1; page < 4; page++ {
		must.NoError(t, b.waitJS(time.Second, `(document.getElementById("next-page").click(), true)`))
		must.NoError(t, b.waitJS(uiWait, `location.search === "?page=`+strconv.Itoa(page+1)+`" && document.readyState === "complete"`))
	}
	must.NoError(t, b.waitJS(uiWait, `document.querySelector('tr[data-volume="fp-0999"]') !== null &&
		document.getElementById("next-page") === null`))
	ratio := best / max(empty, 1)
	met := "met"
	if best >= 300 {
		met = "NOT met"
	}
	t.Logf("first contentful paint of /ui/volumes: %.0f ms with %d volumes, %.0f ms with none (best of 5 each); ratio %.2f; target < 300 ms %s",
		best, n, empty, ratio, met)
	if ratio > 4 {
		t.Fatalf("first paint with %d volumes is %.2fx that of the empty page (%.0f ms vs %.0f ms), want at most 4x", n, ratio, best, empty)
	}
}

// TestUI_PluginLaneDepth: the plugins page shows a plugin's lane depth
// rise above 0 while 10 claims queue on a plugin with publish latency,
// and fall back to 0 once they have run.
func TestUI_PluginLaneDepth(t *testing.T) {
	a := startDevUI(t)
	b := newBrowser(t)
	base := a.HTTPAddr()
	const slow = "slow"

	// A second hostpath plugin whose controller publish takes 300 ms.
	mustCLIAt(t, base, "job", "run", "-detach", writeTemp(t, "plugin.hcl",
		csiPluginJob(roamBinary(t), slow, t.TempDir(), csiOpts{PublishLatency: 300 * time.Millisecond})))
	WaitFor(t, settle, func() error {
		var plug api.CSIPlugin
		if err := GetJSON(base, "/v1/plugin/csi/"+slow, &plug); err != nil {
			return err
		}
		if plug.NodesHealthy < 1 || plug.ControllersHealthy < 1 {
			return fmt.Errorf("plugin %s not healthy yet", slow)
		}
		return nil
	})
	const n = 10
	for i := range n {
		id := fmt.Sprintf("slow-vol[%d]", i)
		mustCLIAt(t, base, "volume", "create", writeTemp(t, fmt.Sprintf("v%d.hcl", i), fmt.Sprintf(`id        = %q
type      = "csi"
plugin_id = %q
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
`, id, slow)))
	}

	b.navigate(base + "/ui/plugins")
	must.NoError(t, b.waitJS(uiWait, `document.querySelector('tr[data-plugin="slow"]') !== null`))
	must.NoError(t, b.waitJS(time.Second, `(window.__noReload = true)`))

	mustCLIAt(t, base, "job", "run", "-detach", writeTemp(t, "job.hcl",
		csiJob("lane-job", "service", n, "slow-vol", true, "", "sleep 3600")))
	must.NoError(t, b.waitJS(uiWait, `(function () {
  var r = document.querySelector('tr[data-lane="slow"]');
  return r !== null && Number(r.getAttribute("data-depth")) > 0;
})()`))
	depth, err := evalJS[string](b, `document.querySelector('tr[data-lane="slow"]').getAttribute("data-depth")`)
	must.NoError(t, err)
	t.Logf("lane depth seen on the page: %s", depth)
	b.checkLayout("plugins (queued)")
	b.checkA11y("plugins (queued)")
	b.screenshot("ui-plugins-lane-queued")

	must.NoError(t, b.waitJS(uiWait, `(function () {
  var r = document.querySelector('tr[data-lane="slow"]');
  return r !== null && r.getAttribute("data-depth") === "0" && r.getAttribute("data-inflight") === "0" &&
    Number(r.cells[3].textContent) >= `+strconv.Itoa(n)+`;
})()`))
	must.NoError(t, b.waitJS(time.Second, `window.__noReload === true`), must.Sprint("the page reloaded"))
	b.checkLayout("plugins (drained)")
	b.screenshot("ui-plugins-lane-drained")
}

// memberTags returns the members' name → id and the leader's name as
// server at base sees them.
func memberIDs(base string) (map[string]string, string, error) {
	m, err := Members(base)
	if err != nil {
		return nil, "", err
	}
	ids := make(map[string]string, len(m.Members))
	leader := ""
	for _, x := range m.Members {
		ids[x.Name] = x.Tags["id"]
		if x.Tags["leader"] == "true" {
			leader = x.Name
		}
	}
	return ids, leader, nil
}

// TestUI_ClusterLeaderHandoff: on a 3-server cluster the cluster page,
// served by a follower, marks the new leader within 2 s of a SIGTERM to
// the old one, and lists the handoff with its leaderless gap.
func TestUI_ClusterLeaderHandoff(t *testing.T) {
	c := StartCluster(t, Opts{Servers: 3})
	b := newBrowser(t)
	// On a loaded machine a leader's lease can run out before the SIGTERM
	// and another server take over; the page then rightly marks that one.
	// Start again from the new leader, with the page served by a follower.
	var (
		old     int
		ids     map[string]string
		oldName string
		err     error
	)
	for range 3 {
		old = c.Leader()
		base := c.ServerHTTP((old + 1) % len(c.Servers))
		ids, oldName, err = memberIDs(base)
		if err == nil && oldName == "" {
			err = errors.New("the members API names no leader")
		}
		if err == nil {
			b.navigate(base + "/ui/cluster")
			err = b.waitJS(uiWait, `(function () {
  var l = document.querySelectorAll("tr[data-leader]");
  return l.length === 1 && l[0].getAttribute("data-server") === `+strconv.Quote(oldName)+`;
})()`)
		}
		if err == nil || c.Leader() == old {
			break
		}
		t.Logf("the leader changed before the SIGTERM (%v); starting again from the new one", err)
	}
	must.NoError(t, err)
	must.NoError(t, b.waitJS(time.Second, `(window.__noReload = true)`))

	start := time.Now()
	must.NoError(t, c.Servers[old].Signal(syscall.SIGTERM))
	// Poll the page, not the API: what counts is what the operator sees.
	must.NoError(t, b.waitJS(uiWait, `(function () {
  var l = document.querySelectorAll("tr[data-leader]");
  return l.length === 1 && l[0].getAttribute("data-server") !== `+strconv.Quote(oldName)+`;
})()`))
	marked := time.Since(start)
	newName, err := evalJS[string](b, `document.querySelector("tr[data-leader]").getAttribute("data-server")`)
	must.NoError(t, err)
	t.Logf("the page marked %s as leader %s after the SIGTERM to %s", newName, marked.Round(time.Millisecond), oldName)

	// The handoff is listed: the new leader, after the old one, with a gap.
	newID := ids[newName]
	must.NotEq(t, "", newID)
	must.NoError(t, b.waitJS(uiWait, `(function () {
  var r = document.querySelector('tr[data-change=`+strconv.Quote(newID)+`]');
  return r !== null && r.getAttribute("data-gap-ms") !== "" && r.textContent.indexOf(`+strconv.Quote(oldName)+`) >= 0;
})()`))
	gap, err := evalJS[string](b, `document.querySelector('tr[data-change=`+strconv.Quote(newID)+`]').getAttribute("data-gap-ms")`)
	must.NoError(t, err)
	t.Logf("handoff listed with a leaderless gap of %s ms", gap)
	must.NoError(t, b.waitJS(time.Second, `window.__noReload === true`), must.Sprint("the page reloaded"))
	b.checkLayout("cluster (after handoff)")
	b.screenshot("ui-cluster-handoff")

	code, err := c.Servers[old].Wait(stopTimeout)
	must.NoError(t, err)
	must.EqOp(t, 0, code)
	if marked >= 2*time.Second {
		t.Fatalf("the cluster page marked the new leader %s after the SIGTERM, want < 2s", marked)
	}
}
