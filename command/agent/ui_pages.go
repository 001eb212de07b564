package agent

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"time"

	"github.com/roamhq/roam/structs"
)

// uiTemplates are the page contents, each named after its page.
var uiTemplates = template.Must(template.New("ui").Funcs(template.FuncMap{
	"yesno": func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	},
	"bytes":      humanBytes,
	"pathesc":    url.PathEscape,
	"lanechart":  laneChart,
	"lanekey":    laneKey,
	"ms":         func(d time.Duration) int64 { return d.Milliseconds() },
	"servername": servername,
	"unixnano":   func(n int64) string { return time.Unix(0, n).UTC().Format("15:04:05.000") },
}).Parse(`
{{define "volumes"}}
<p class="summary">{{.Total}} volume{{if ne .Total 1}}s{{end}}{{if gt .Pages 1}}; showing {{.First}}–{{.Last}}{{end}}</p>
{{if gt .Pages 1}}<nav class="pager" aria-label="Volume pages">{{if gt .Page 1}}<a href="?page={{.Prev}}" rel="prev">← previous</a>{{end}}
<span>page {{.Page}} of {{.Pages}}</span>{{if lt .Page .Pages}}<a href="?page={{.Next}}" rel="next" id="next-page">next →</a>{{end}}</nav>{{end}}
{{with .Volumes}}
<table class="list long" aria-label="Volumes">
<colgroup><col class="w-id"><col class="w-name"><col class="w-plugin"><col class="w-sched"><col class="w-mode"><col class="w-attach"><col class="w-claims"></colgroup>
<thead><tr><th scope="col">ID</th><th scope="col">Name</th><th scope="col">Plugin</th><th scope="col">Schedulable</th><th scope="col">Access mode</th><th scope="col">Attachment</th><th scope="col">Claims (read / write)</th></tr></thead>
<tbody>
{{range .}}<tr data-volume="{{.ID}}"><td><a href="/ui/volume/{{pathesc .ID}}">{{.ID}}</a></td><td>{{.Name}}</td><td>{{.PluginID}}</td><td>{{if .Schedulable}}<span class="st ok">✓ yes</span>{{else}}<span class="st bad">✗ no</span>{{end}}</td><td>{{.AccessMode}}</td><td>{{.AttachmentMode}}</td><td>{{.CurrentReaders}} / {{.CurrentWriters}}</td></tr>
{{end}}</tbody>
</table>
{{else}}<p class="empty">{{if .Total}}No volumes on this page.{{else}}No volumes yet. Create one with <code>roam volume create</code>.{{end}}</p>{{end}}
{{end}}

{{define "volume"}}
<dl class="facts">
<dt>ID</dt><dd>{{.V.ID}}</dd>
<dt>Name</dt><dd>{{.V.Name}}</dd>
<dt>External ID</dt><dd><code>{{.V.ExternalID}}</code></dd>
<dt>Plugin</dt><dd><a href="/ui/plugins">{{.V.PluginID}}</a> {{if .V.Provider}}({{.V.Provider}} {{.V.ProviderVersion}}){{end}}</dd>
<dt>Schedulable</dt><dd>{{if .V.Schedulable}}<span class="st ok">✓ yes</span>{{else}}<span class="st bad">✗ no</span>{{end}}
 — controllers {{.V.ControllersHealthy}}/{{.V.ControllersExpected}}, nodes {{.V.NodesHealthy}}/{{.V.NodesExpected}} healthy</dd>
<dt>Access mode</dt><dd>{{.V.AccessMode}} / {{.V.AttachmentMode}}</dd>
<dt>Capacity</dt><dd>{{bytes .V.Capacity}}{{if .V.RequestedCapacityMin}} (requested {{bytes .V.RequestedCapacityMin}}{{if .V.RequestedCapacityMax}} – {{bytes .V.RequestedCapacityMax}}{{end}}){{end}}</dd>
<dt>Topology</dt><dd>{{range .V.Topologies}}<span class="chip">{{range $k, $v := .Segments}}{{$k}}={{$v}} {{end}}</span>{{else}}none{{end}}</dd>
{{if .V.SnapshotID}}<dt>From snapshot</dt><dd><code>{{.V.SnapshotID}}</code></dd>{{end}}
{{if .V.CloneID}}<dt>Cloned from</dt><dd><code>{{.V.CloneID}}</code></dd>{{end}}
<dt>Index</dt><dd>created {{.V.CreateIndex}}, modified {{.V.ModifyIndex}}</dd>
</dl>
<h2 id="claims-h">Claims</h2>
{{if .V.Claims}}
<table class="list" aria-labelledby="claims-h">
<thead><tr><th scope="col">Allocation</th><th scope="col">Node</th><th scope="col">Mode</th><th scope="col">State</th><th scope="col">Progress</th><th scope="col">Since</th></tr></thead>
<tbody>
{{range .V.Claims}}<tr data-claim="{{.AllocationID}}" data-claim-state="{{.State}}" data-claim-node="{{.NodeID}}" data-claim-mode="{{.Mode}}">
<td><code>{{.AllocationID}}</code></td><td><code>{{.NodeID}}</code></td><td>{{.Mode}}</td>
<td><span class="st claim-{{.State}}">{{.State}}</span></td>
<td><ol class="steps" aria-label="claim progress">{{$cur := .State}}{{range $.Steps}}<li{{if eq . $cur}} class="cur" aria-current="step"{{end}}>{{.}}</li>{{end}}</ol></td>
<td>{{if .UpdatedAt}}{{unixnano .UpdatedAt}} UTC{{end}}</td></tr>
{{end}}</tbody>
</table>
{{else}}<p class="empty" id="no-claims">No claims: the volume is free.</p>{{end}}
<h2 id="timeline-h">Claim timeline</h2>
<p class="hint">Each claim's states as this page saw them: <code>publishing → taken → [unpublishing →] node-detached → freed</code>.</p>
<ol id="claim-timeline" class="timeline" aria-labelledby="timeline-h"></ol>
{{end}}

{{define "plugins"}}
{{if .Plugins}}
<table class="list" aria-label="Plugins">
<thead><tr><th scope="col">ID</th><th scope="col">Provider</th><th scope="col">Controllers healthy / expected</th><th scope="col">Nodes healthy / expected</th><th scope="col">Health</th></tr></thead>
<tbody>
{{range .Plugins}}<tr data-plugin="{{.ID}}"><td>{{.ID}}</td><td>{{.Provider}}</td>
<td>{{if .ControllerRequired}}{{.ControllersHealthy}} / {{.ControllersExpected}}{{else}}not required{{end}}</td>
<td>{{.NodesHealthy}} / {{.NodesExpected}}</td>
<td>{{if and (gt .NodesHealthy 0) (or (not .ControllerRequired) (gt .ControllersHealthy 0))}}<span class="st ok">✓ healthy</span>{{else}}<span class="st bad">✗ unhealthy</span>{{end}}</td></tr>
{{end}}</tbody>
</table>
{{else}}<p class="empty">No plugins have reported yet.</p>{{end}}
<h2 id="lanes-h">Controller lanes (on the leader)</h2>
<p class="hint">Destructive controller calls (publish, unpublish, delete, snapshot, expand) run one at a time per plugin, first come first served; a plugin with controller_concurrency N runs up to N, never two on one volume nor two publish/unpublish calls for one node.</p>
{{if .LanesErr}}<p class="notice error" role="alert">{{.LanesErr}}</p>
{{else if .Lanes}}
<table class="list" aria-labelledby="lanes-h">
<thead><tr><th scope="col">Plugin</th><th scope="col">Depth now</th><th scope="col">In flight</th><th scope="col">Calls</th><th scope="col">Timeouts</th><th scope="col">Recent calls (ms, oldest first)</th></tr></thead>
<tbody>
{{range .Lanes}}<tr data-lane="{{.PluginID}}" data-depth="{{.Depth}}" data-inflight="{{.InFlight}}" data-limit="{{.Limit}}"><td>{{.PluginID}}</td>
<td><span class="num{{if .Depth}} busy{{end}}">{{.Depth}}</span>{{if .Depth}} queued{{end}}{{with .Queued}}<br><small class="keys">{{range .}}{{lanekey .}} {{end}}</small>{{end}}</td>
<td>{{.InFlight}}{{if gt .Limit 1}} of {{.Limit}}{{end}}{{with .Running}}<br><small class="keys">{{range .}}{{lanekey .}} {{end}}</small>{{end}}</td><td>{{.Calls}}</td>
<td>{{if .Timeouts}}<span class="st bad">✗ {{.Timeouts}}</span>{{else}}0{{end}}</td>
<td>{{lanechart .}}</td></tr>
{{end}}</tbody>
</table>
{{else}}<p class="empty" id="no-lanes">No controller calls since this leader took over.</p>{{end}}
{{end}}

{{define "node"}}
<dl class="facts">
<dt>ID</dt><dd><code>{{.N.ID}}</code></dd>
<dt>Name</dt><dd>{{.N.Name}}</dd>
<dt>Datacenter</dt><dd>{{.N.Datacenter}}</dd>
<dt>Status</dt><dd>{{if eq .N.Status "ready"}}<span class="st ok">✓ ready</span>{{else}}<span class="st bad">✗ {{.N.Status}}</span>{{end}}</dd>
<dt>Eligibility</dt><dd id="node-eligibility">{{.N.SchedulingEligibility}}</dd>
<dt>Drain</dt><dd id="node-drain" data-draining="{{.N.Drain}}">{{if .N.Drain}}<span class="st warn">draining</span>{{if .N.DrainStrategy}}{{if not .N.DrainStrategy.ForceDeadline.IsZero}}, deadline {{.N.DrainStrategy.ForceDeadline.UTC.Format "15:04:05"}} UTC{{end}}{{end}}{{else}}no{{end}}</dd>
</dl>
<h2 id="drain-h">Drain</h2>
<form id="drain-form" class="drain" data-node="{{.N.ID}}" data-draining="{{.N.Drain}}" aria-labelledby="drain-h">
{{if not .CanWrite}}<p id="drain-denied" class="hint">Your token cannot change nodes: draining needs node write.</p>{{end}}
{{if .N.Drain}}<button type="submit" id="drain-button" data-action="stop"{{if not .CanWrite}} disabled aria-disabled="true"{{end}}>Stop drain</button>
{{else}}<label for="drain-deadline">Deadline</label>
<input id="drain-deadline" name="deadline" value="1h" size="6" aria-describedby="drain-hint">
<label><input type="checkbox" id="drain-ignore-system"> Ignore system jobs</label>
<button type="submit" id="drain-button" data-action="start"{{if not .CanWrite}} disabled aria-disabled="true"{{end}}>Drain node</button>
{{if eq .N.SchedulingEligibility "ineligible"}}<button type="button" id="eligible-button"{{if not .CanWrite}} disabled aria-disabled="true"{{end}}>Mark eligible</button>{{end}}
<span id="drain-hint" class="hint">Go duration such as 30s, 10m or 1h; needs a token with node write.</span>{{end}}
<span id="drain-result" role="status" aria-live="polite"></span>
</form>
<h2 id="allocs-h">Allocations</h2>
{{if .Allocs}}
<table class="list" aria-labelledby="allocs-h">
<thead><tr><th scope="col">ID</th><th scope="col">Name</th><th scope="col">Job</th><th scope="col">Desired</th><th scope="col">Client status</th></tr></thead>
<tbody>
{{range .Allocs}}<tr data-alloc="{{.ID}}"><td><code>{{.ID}}</code></td><td>{{.Name}}</td><td>{{.JobID}}</td><td>{{.DesiredStatus}}</td>
<td>{{if eq .ClientStatus "running"}}<span class="st ok">✓ running</span>{{else if eq .ClientStatus "failed" "lost"}}<span class="st bad">✗ {{.ClientStatus}}</span>{{else}}{{.ClientStatus}}{{end}}</td></tr>
{{end}}</tbody>
</table>
{{else}}<p class="empty">No allocations on this node.</p>{{end}}
<h2 id="drivers-h">Drivers</h2>
<ul aria-labelledby="drivers-h">{{range $name, $d := .N.Drivers}}<li>{{$name}}: {{if $d.Healthy}}<span class="st ok">✓ healthy</span>{{else if $d.Detected}}<span class="st bad">✗ unhealthy</span>{{else}}not detected{{end}}</li>{{else}}<li>none</li>{{end}}</ul>
<h2 id="csi-h">CSI plugins</h2>
<ul aria-labelledby="csi-h">
{{range $id, $p := .N.CSIControllerPlugins}}<li>{{$id}} (controller): {{if $p.Healthy}}<span class="st ok">✓ healthy</span>{{else}}<span class="st bad">✗ unhealthy</span> {{$p.HealthDescription}}{{end}}</li>{{end}}
{{range $id, $p := .N.CSINodePlugins}}<li>{{$id}} (node): {{if $p.Healthy}}<span class="st ok">✓ healthy</span>{{else}}<span class="st bad">✗ unhealthy</span> {{$p.HealthDescription}}{{end}}</li>{{end}}
{{if and (not .N.CSIControllerPlugins) (not .N.CSINodePlugins)}}<li>none</li>{{end}}
</ul>
{{end}}

{{define "allocrows"}}
<table class="list" aria-label="Allocations">
<thead><tr><th scope="col">ID</th><th scope="col">Name</th><th scope="col">Node</th><th scope="col">Desired</th><th scope="col">Client status</th></tr></thead>
<tbody>
{{range .}}<tr data-alloc="{{.ID}}" data-status="{{.ClientStatus}}"><td><a href="/ui/alloc/{{pathesc .ID}}"><code>{{.ID}}</code></a></td><td>{{.Name}}</td>
<td><a href="/ui/node/{{pathesc .NodeID}}">{{if .NodeName}}{{.NodeName}}{{else}}{{.NodeID}}{{end}}</a></td><td>{{.DesiredStatus}}</td>
<td>{{template "allocstatus" .ClientStatus}}</td></tr>
{{end}}</tbody>
</table>
{{end}}

{{define "allocstatus"}}{{if eq . "running"}}<span class="st ok">✓ running</span>{{else if eq . "failed" "lost"}}<span class="st bad">✗ {{.}}</span>{{else}}{{.}}{{end}}{{end}}

{{define "jobs"}}
{{if .}}
<table class="list" aria-label="Jobs">
<thead><tr><th scope="col">ID</th><th scope="col">Type</th><th scope="col">Status</th><th scope="col">Stopped</th><th scope="col">Version</th></tr></thead>
<tbody>
{{range .}}<tr data-job="{{.ID}}"><td><a href="/ui/job/{{pathesc .ID}}">{{.ID}}</a></td><td>{{.Type}}</td><td>{{.Status}}</td><td>{{yesno .Stop}}</td><td>{{.Version}}</td></tr>
{{end}}</tbody>
</table>
{{else}}<p class="empty">No jobs. Run one with <code>roam job run</code>.</p>{{end}}
{{end}}

{{define "job"}}
<dl class="facts">
<dt>ID</dt><dd>{{.J.ID}}</dd>
<dt>Type</dt><dd>{{.J.Type}}</dd>
<dt>Status</dt><dd>{{.J.Status}}{{if .J.Stop}} (stopped){{end}}</dd>
<dt>Datacenters</dt><dd>{{range .J.Datacenters}}<span class="chip">{{.}}</span>{{end}}</dd>
</dl>
<h2 id="groups-h">Task groups and volumes</h2>
<table class="list" aria-labelledby="groups-h">
<thead><tr><th scope="col">Group</th><th scope="col">Count</th><th scope="col">Tasks</th><th scope="col">CSI volumes</th></tr></thead>
<tbody>
{{range .J.TaskGroups}}<tr><td>{{.Name}}</td><td>{{.Count}}</td><td>{{range .Tasks}}<span class="chip">{{.Name}} ({{.Driver}})</span>{{end}}</td>
<td>{{range $name, $v := .Volumes}}<div>{{$name}}: {{if $v.PerAlloc}}{{$v.Source}}[N]{{else}}<a href="/ui/volume/{{pathesc $v.Source}}">{{$v.Source}}</a>{{end}} — {{$v.AccessMode}}{{if $v.ReadOnly}}, read-only{{end}}</div>{{else}}none{{end}}</td></tr>
{{end}}</tbody>
</table>
<h2 id="jallocs-h">Allocations</h2>
{{if .Allocs}}{{template "allocrows" .Allocs}}{{else}}<p class="empty">No allocations.</p>{{end}}
{{end}}

{{define "alloc"}}
<dl class="facts">
<dt>ID</dt><dd><code>{{.A.ID}}</code></dd>
<dt>Name</dt><dd>{{.A.Name}}</dd>
<dt>Job</dt><dd><a href="/ui/job/{{pathesc .A.JobID}}">{{.A.JobID}}</a></dd>
<dt>Node</dt><dd><a href="/ui/node/{{pathesc .A.NodeID}}">{{if .A.NodeName}}{{.A.NodeName}}{{else}}{{.A.NodeID}}{{end}}</a></dd>
<dt>Desired</dt><dd>{{.A.DesiredStatus}}{{if .A.DesiredDescription}} — {{.A.DesiredDescription}}{{end}}</dd>
<dt>Client status</dt><dd id="alloc-status">{{template "allocstatus" .A.ClientStatus}}{{if .A.ClientDescription}} — {{.A.ClientDescription}}{{end}}</dd>
</dl>
{{range $name, $ts := .A.TaskStates}}
<h2>Task {{$name}}: {{$ts.State}}{{if $ts.Failed}} <span class="st bad">✗ failed</span>{{end}}</h2>
<table class="list" aria-label="Events of task {{$name}}">
<thead><tr><th scope="col">Time (UTC)</th><th scope="col">Type</th><th scope="col">Message</th></tr></thead>
<tbody>
{{range $ts.Events}}<tr data-task-event="{{.Type}}"><td>{{unixnano .Time}}</td><td>{{.Type}}</td><td>{{if .DisplayMessage}}{{.DisplayMessage}}{{else}}{{.Message}}{{end}}</td></tr>
{{end}}</tbody>
</table>
<h3 id="log-{{$name}}">Log tail ({{$name}}, stderr then stdout, last 4 KiB each)</h3>
<pre class="log" aria-labelledby="log-{{$name}}" data-log="/v1/client/fs/logs/{{pathesc $.A.ID}}?task={{$name}}&amp;type=stderr&amp;origin=end&amp;offset=4096&amp;plain=true"></pre>
<pre class="log" aria-label="stdout of {{$name}}" data-log="/v1/client/fs/logs/{{pathesc $.A.ID}}?task={{$name}}&amp;type=stdout&amp;origin=end&amp;offset=4096&amp;plain=true"></pre>
{{end}}
{{end}}

{{define "cluster"}}
<h2 id="servers-h">Servers</h2>
<table class="list" aria-labelledby="servers-h">
<thead><tr><th scope="col">Name</th><th scope="col">Address</th><th scope="col">Status</th><th scope="col">Role</th><th scope="col">Voter</th></tr></thead>
<tbody>
{{range .Members}}<tr data-server="{{.Name}}"{{if .Leader}} data-leader="true"{{end}}><td>{{.Name}}</td><td><code>{{.Addr}}</code></td>
<td>{{if eq .Status "alive"}}<span class="st ok">✓ alive</span>{{else}}<span class="st bad">✗ {{.Status}}</span>{{end}}</td>
<td>{{if .Leader}}<span class="st leader">★ leader</span>{{else}}follower{{end}}</td><td>{{yesno .Voter}}</td></tr>
{{end}}</tbody>
</table>
{{if not .KnownLeader}}<p class="notice error" role="alert" id="no-leader"><strong>No leader</strong> right now: the servers are electing one.</p>{{end}}
<h2 id="changes-h">Leadership changes</h2>
{{if .ChangesErr}}<p class="notice error">{{.ChangesErr}}</p>
{{else if .Changes}}
<p class="hint">As seen by server <code>{{.ChangesFrom}}</code>, newest first. The gap is how long no leader could serve.</p>
<table class="list" aria-labelledby="changes-h">
<thead><tr><th scope="col">When (UTC)</th><th scope="col">New leader</th><th scope="col">Previous leader</th><th scope="col">Leaderless gap</th></tr></thead>
<tbody>
{{range .Changes}}<tr data-change="{{.LeaderID}}" data-gap-ms="{{if .GapKnown}}{{ms .Gap}}{{end}}"><td>{{.At.UTC.Format "15:04:05.000"}}</td>
<td>{{servername $.Names .LeaderID}}</td><td>{{if .PreviousID}}{{servername $.Names .PreviousID}}{{else}}—{{end}}</td>
<td>{{if .GapKnown}}<strong>{{ms .Gap}} ms</strong>{{if .MeasuredByLeader}} (measured by the new leader){{end}}{{else}}not measured{{end}}</td></tr>
{{end}}</tbody>
</table>
{{else}}<p class="empty">No leadership changes seen yet.</p>{{end}}
<h2 id="peers-h">Raft peers</h2>
{{if .PeersErr}}<p class="notice error">{{.PeersErr}}</p>{{else}}
<table class="list" aria-labelledby="peers-h">
<thead><tr><th scope="col">Node</th><th scope="col">ID</th><th scope="col">Address</th><th scope="col">Leader</th><th scope="col">Voter</th><th scope="col">Healthy</th></tr></thead>
<tbody>
{{range .Peers}}<tr><td>{{.Node}}</td><td><code>{{.ID}}</code></td><td><code>{{.Address}}</code></td><td>{{yesno .Leader}}</td><td>{{yesno .Voter}}</td><td>{{yesno .Healthy}}</td></tr>
{{end}}</tbody>
</table>{{end}}
<h2 id="nodes-h">Nodes</h2>
{{if .Nodes}}
<table class="list" aria-labelledby="nodes-h">
<thead><tr><th scope="col">Name</th><th scope="col">ID</th><th scope="col">Address</th><th scope="col">Status</th><th scope="col">Eligibility</th><th scope="col">Drain</th></tr></thead>
<tbody>
{{range .Nodes}}<tr data-node="{{.ID}}"><td><a href="/ui/node/{{pathesc .ID}}">{{.Name}}</a></td><td><code>{{.ID}}</code></td><td><code>{{.Address}}</code></td>
<td>{{if eq .Status "ready"}}<span class="st ok">✓ ready</span>{{else}}<span class="st bad">✗ {{.Status}}</span>{{end}}</td>
<td>{{.SchedulingEligibility}}</td><td>{{if .Drain}}<span class="st warn">draining</span>{{else}}no{{end}}</td></tr>
{{end}}</tbody>
</table>
{{else}}<p class="empty">No client nodes have registered.</p>{{end}}
{{end}}
`))

// uiExec renders the named content template.
func uiExec(name string, data any) (template.HTML, error) {
	var buf bytes.Buffer
	if err := uiTemplates.ExecuteTemplate(&buf, name, data); err != nil {
		return "", fmt.Errorf("render ui %s: %w", name, err)
	}
	return template.HTML(buf.String()), nil // #nosec: html/template escaped it
}

// uiClaimSteps are a claim's states in order, as the UI names them.
var uiClaimSteps = []string{"publishing", "taken", "unpublishing", "node-detached", "controller-detached", "freed"}

func (s *HTTPServer) uiVolumesPage() *uiPage {
	const api = "/v1/volumes?type=csi"
	return &uiPage{
		Title: "Volumes", Topics: []string{structs.TopicCSIVolume, structs.TopicCSIPlugin}, APIs: []string{api},
		render: func(r *http.Request) (template.HTML, error) {
			page, err := uiPageParam(r)
			if err != nil {
				return "", err
			}
			obj, err := s.uiCall(r, s.csiVolumesList, api)
			if err != nil {
				return "", err
			}
			all := obj.([]*structs.CSIVolListStub)
			data := map[string]any{"Total": len(all), "Page": page, "Prev": page - 1, "Next": page + 1,
				"Pages": max(1, (len(all)+uiPageSize-1)/uiPageSize)}
			from := min(len(all), (page-1)*uiPageSize)
			to := min(len(all), from+uiPageSize)
			data["Volumes"], data["First"], data["Last"] = all[from:to], from+1, to
			return uiExec("volumes", data)
		},
	}
}

func (s *HTTPServer) uiVolumePage(id string) *uiPage {
	api := csiVolumePathPrefix + url.PathEscape(id)
	return &uiPage{
		Title: "Volume " + id, Volume: id, Topics: []string{structs.TopicCSIVolume + ":" + id}, APIs: []string{api},
		render: func(r *http.Request) (template.HTML, error) {
			obj, err := s.uiCall(r, s.csiVolumeGet, api)
			if err != nil {
				return "", err
			}
			return uiExec("volume", map[string]any{"V": obj, "Steps": uiClaimSteps})
		},
	}
}

func (s *HTTPServer) uiPluginsPage() *uiPage {
	const api = "/v1/plugins?type=csi"
	// No event describes a lane's queue, so the page refreshes once a
	// second rather than on events.
	return &uiPage{
		Title: "Plugins", APIs: []string{api, csiLanesPath},
		render: func(r *http.Request) (template.HTML, error) {
			obj, err := s.uiCall(r, s.csiPluginsList, api)
			if err != nil {
				return "", err
			}
			data := map[string]any{"Plugins": obj}
			if lanes, err := s.uiCall(r, s.csiLanes, csiLanesPath); err != nil {
				data["LanesErr"] = "Lanes unavailable: " + err.Error()
			} else {
				data["Lanes"] = lanes
			}
			return uiExec("plugins", data)
		},
	}
}

// laneKey names a lane call by what it does and holds: "publish vol@node".
func laneKey(k structs.CSILaneKey) string {
	s := k.Op
	if k.Volume != "" {
		s += " " + k.Volume
	}
	if k.Node != "" {
		s += "@" + shortNodeID(k.Node)
	}
	return s
}

// shortNodeID is the first 8 characters of a node ID, as the UI lists them.
func shortNodeID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// laneChart draws a lane's recent call durations as a small bar chart,
// with each bar's op and duration as its tooltip and the summary as its
// label; timed-out calls are drawn in red and marked "timeout".
func laneChart(st *structs.CSILaneStats) template.HTML {
	const (
		barW, gap, h = 8, 2, 36
	)
	if len(st.Recent) == 0 {
		return "no calls yet"
	}
	var longest time.Duration
	for _, c := range st.Recent {
		longest = max(longest, c.Duration)
	}
	w := len(st.Recent) * (barW + gap)
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg class="chart" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		w, h+2, w, h+2, template.HTMLEscapeString(fmt.Sprintf("%d recent calls, longest %d ms", len(st.Recent), longest.Milliseconds())))
	for i, c := range st.Recent {
		bh := 2
		if longest > 0 {
			bh = max(2, int(float64(h)*float64(c.Duration)/float64(longest)))
		}
		fill, note := "#2d5a88", ""
		switch {
		case c.TimedOut:
			fill, note = "#a40e26", " (timeout)"
		case c.Failed:
			fill, note = "#7a4a00", " (error)"
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"><title>%s</title></rect>`,
			i*(barW+gap), h+2-bh, barW, bh, fill,
			template.HTMLEscapeString(fmt.Sprintf("%s: %d ms%s", c.Op, c.Duration.Milliseconds(), note)))
	}
	b.WriteString(`</svg>`)
	last := st.Recent[len(st.Recent)-1]
	fmt.Fprintf(&b, ` <span class="hint">last %s %d ms</span>`, template.HTMLEscapeString(last.Op), last.Duration.Milliseconds())
	return template.HTML(b.String()) // #nosec: every piece of text above is escaped
}

func (s *HTTPServer) uiClusterPage() *uiPage {
	const (
		membersAPI = "/v1/agent/members"
		raftAPI    = "/v1/operator/raft/configuration"
		nodesAPI   = "/v1/nodes"
	)
	return &uiPage{
		Title: "Cluster", APIs: []string{membersAPI, statusLeadershipPath, raftAPI, nodesAPI},
		render: func(r *http.Request) (template.HTML, error) {
			members, err := s.members(r)
			if err != nil {
				return "", err
			}
			ms := append([]*structs.ServerMember(nil), members.Members...)
			sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
			known := false
			for _, m := range ms {
				known = known || m.Leader
			}
			names := make(map[string]string, len(ms))
			for _, m := range ms {
				names[m.ID] = m.Name
			}
			data := map[string]any{"Members": ms, "KnownLeader": known, "Names": names}
			// The leader holds the exact gap of the latest change; while
			// there is none, this server's own view.
			changesAPI := statusLeadershipPath
			if !known {
				changesAPI += "?stale"
			}
			if obj, err := s.uiCall(r, s.statusLeadership, changesAPI); err != nil {
				data["ChangesErr"] = "Leadership changes unavailable: " + err.Error()
			} else {
				h := obj.(*structs.LeadershipHistoryResponse)
				changes := make([]*structs.LeadershipChange, 0, len(h.Changes))
				for i := len(h.Changes) - 1; i >= 0; i-- {
					changes = append(changes, h.Changes[i])
				}
				data["Changes"], data["ChangesFrom"] = changes, servername(names, h.ServerID)
			}
			// Peers need a leader's answer; without one the page still
			// shows the servers and says so.
			if obj, err := s.uiCall(r, s.raftConfiguration, raftAPI+"?stale"); err != nil {
				data["PeersErr"] = "Raft peers unavailable: " + err.Error()
			} else {
				data["Peers"] = obj.(*structs.RaftConfigurationResponse).Servers
			}
			nodes, err := s.uiCall(r, s.nodesList, nodesAPI+"?stale")
			if err != nil {
				return "", err
			}
			data["Nodes"] = nodes
			return uiExec("cluster", data)
		},
	}
}

func (s *HTTPServer) uiNodePage(id string) *uiPage {
	api := nodePathPrefix + url.PathEscape(id)
	allocsAPI := api + "/allocations"
	return &uiPage{
		Title: "Node " + id, APIs: []string{api, allocsAPI},
		Topics: []string{structs.TopicNode + ":" + id, structs.TopicAllocation},
		render: func(r *http.Request) (template.HTML, error) {
			obj, err := s.uiCall(r, s.nodeGet, api)
			if err != nil {
				return "", err
			}
			n := obj.(nodeView).Node
			allocs, err := s.uiCall(r, s.nodeAllocations, nodePathPrefix+url.PathEscape(n.ID)+"/allocations")
			if err != nil {
				return "", err
			}
			list := append([]*structs.Allocation(nil), allocs.([]*structs.Allocation)...)
			sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
			return uiExec("node", map[string]any{"N": n, "Allocs": list,
				"CanWrite": s.uiAllows(r, http.MethodPut, nodePathPrefix+url.PathEscape(n.ID)+"/drain")})
		},
	}
}

func (s *HTTPServer) uiJobsPage() *uiPage {
	const api = "/v1/jobs"
	return &uiPage{
		Title: "Jobs", APIs: []string{api}, Topics: []string{structs.TopicJob},
		render: func(r *http.Request) (template.HTML, error) {
			obj, err := s.uiCall(r, s.jobsList, api)
			if err != nil {
				return "", err
			}
			return uiExec("jobs", obj)
		},
	}
}

func (s *HTTPServer) uiJobPage(id string) *uiPage {
	api := jobPathPrefix + url.PathEscape(id)
	allocsAPI := api + "/allocations"
	return &uiPage{
		Title: "Job " + id, APIs: []string{api, allocsAPI},
		Topics: []string{structs.TopicJob + ":" + id, structs.TopicAllocation},
		render: func(r *http.Request) (template.HTML, error) {
			job, err := s.uiCall(r, s.jobGet, api)
			if err != nil {
				return "", err
			}
			allocs, err := s.uiCall(r, s.jobAllocations, allocsAPI)
			if err != nil {
				return "", err
			}
			list := append([]*structs.AllocListStub(nil), allocs.([]*structs.AllocListStub)...)
			sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
			return uiExec("job", map[string]any{"J": job, "Allocs": list})
		},
	}
}

func (s *HTTPServer) uiAllocPage(id string) *uiPage {
	api := allocPathPrefix + url.PathEscape(id)
	return &uiPage{
		Title: "Allocation " + id, APIs: []string{api, logsPathPrefix + url.PathEscape(id)},
		Topics: []string{structs.TopicAllocation + ":" + id},
		render: func(r *http.Request) (template.HTML, error) {
			obj, err := s.uiCall(r, s.allocGet, api)
			if err != nil {
				return "", err
			}
			return uiExec("alloc", map[string]any{"A": obj})
		},
	}
}

// uiPageSize is how many rows a long list shows per page: a page of a
// few hundred rows paints at once, and a cluster with 10,000 volumes does
// not send megabytes of HTML on every refresh.
const uiPageSize = 250

// maxUIPage bounds the page parameter.
const maxUIPage = 1 << 20

// uiPageParam reads ?page= (1-based; 1 when absent).
func uiPageParam(r *http.Request) (int, error) {
	raw := r.URL.Query().Get("page")
	if raw == "" {
		return 1, nil
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 || n > maxUIPage {
		return 0, badRequest("Invalid page %q: must be a whole number from 1 to %d", raw, maxUIPage)
	}
	return n, nil
}

// servername is a server's name when known, else its ID.
func servername(names map[string]string, id string) string {
	if n, ok := names[id]; ok {
		return n
	}
	return id
}

// humanBytes renders a byte count in binary units.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
