//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/shoenig/test/must"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/roamhq/roam/api"
)

// CSI helpers: a built-in hostpath plugin instance per client and plugin
// ID, the instances of one plugin ID sharing one state directory so that
// every node sees the same "network disks", and readers of the plugins'
// overlap and call records.

// csiPluginID is the plugin ID every client's plugin is configured under.
const csiPluginID = "hostpath"

// csiSettle bounds waits for claims, publishes and allocations to settle.
const csiSettle = 60 * time.Second

// csiCluster is a cluster whose clients each run their own hostpath plugin
// instance.
type csiCluster struct {
	*Cluster
	// StateDir is the state directory every plugin instance shares.
	StateDir string
	// Plugins are the plugin instances by client name.
	Plugins map[string]*csiPluginProc
	// Sockets are the plugin sockets by client name.
	Sockets map[string]string
	// NodeIDs are the clients' node IDs by client name.
	NodeIDs map[string]string
	// Extra are the plugins of csiOpts.ExtraPluginIDs by plugin ID.
	Extra map[string]*csiPluginSet
	// ACLToken is the management secret when csiOpts.ACL is set.
	ACLToken string
}

// csiPluginSet is one more plugin ID: a monolith hostpath plugin instance
// per client, all sharing a state directory of their own, so that the
// plugin is a storage provider separate from the default one.
type csiPluginSet struct {
	ID       string
	StateDir string
	// Plugins are the plugin instances by client name.
	Plugins map[string]*csiPluginProc
	// Sockets are the plugin sockets by client name.
	Sockets map[string]string
}

// csiOpts shapes a csiCluster.
type csiOpts struct {
	Servers, Clients int
	// PublishLatency is the plugins' -publish-latency.
	PublishLatency time.Duration
	// MaxVolumesPerNode is the plugins' -max-volumes-per-node (0: default).
	MaxVolumesPerNode int
	// ExtraPluginIDs are more plugin IDs besides csiPluginID, each served
	// like it by one plugin instance per client, with its own state dir.
	ExtraPluginIDs []string
	// ExternalPlugins starts the plugins as processes outside Roam, named
	// by socket in each client's config, instead of as system jobs.
	ExternalPlugins bool
	// ServerConfigExtra and ClientConfigExtra are Opts' fields of the same
	// names: more HCL for every server (client), such as shorter timeouts.
	ServerConfigExtra, ClientConfigExtra string
	// Zones puts the plugin of each named client in a zone (-zone); it
	// needs ExternalPlugins, whose flags are per client.
	Zones map[string]string
	// LogLevel is Opts' field of the same name (DEBUG when empty).
	LogLevel string
	// ACL turns ACLs on in every agent and bootstraps them once there is
	// a leader: the harness's requests and CLI runs then carry the
	// management token (csiCluster.ACLToken).
	ACL bool
	// PluginGroupExtra is more HCL for the plugin job's group (job mode),
	// such as a restart policy for runs that kill plugins often.
	PluginGroupExtra string
	// OwnAddrs and StopOnClientAfter are Opts' fields of the same names.
	OwnAddrs          bool
	StopOnClientAfter string
	// Binary is Opts' field of the same name: the agents' binary (the
	// plugins always run the one under test).
	Binary string
	// ControllerConcurrency is, by plugin ID, the controller_concurrency
	// the clients give the plugin; it needs ExternalPlugins.
	ControllerConcurrency map[string]int
}

// startCSICluster starts the cluster and one monolith hostpath plugin per
// client and plugin ID (node ID = the client's name): by default as a
// system job per plugin ID, with ExternalPlugins as processes of the test's
// own that the clients are pointed at. It waits until the servers count
// every plugin instance healthy as controller and node.
func startCSICluster(t *testing.T, opts csiOpts) *csiCluster {
	t.Helper()
	bin := roamBinary(t)
	// Unix socket paths are limited to about 108 bytes, and t.TempDir is
	// long; keep the sockets and shared state under a short directory.
	dir, err := os.MkdirTemp("", "roam-csi-")
	must.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })

	cc := &csiCluster{
		StateDir: filepath.Join(dir, "state"),
		Plugins:  make(map[string]*csiPluginProc),
		Sockets:  make(map[string]string),
		Extra:    make(map[string]*csiPluginSet),
	}
	must.NoError(t, os.MkdirAll(cc.StateDir, 0o755))
	for _, id := range opts.ExtraPluginIDs {
		set := &csiPluginSet{
			ID:       id,
			StateDir: filepath.Join(dir, "state-"+id),
			Plugins:  make(map[string]*csiPluginProc),
			Sockets:  make(map[string]string),
		}
		must.NoError(t, os.MkdirAll(set.StateDir, 0o755))
		cc.Extra[id] = set
	}
	// sets visits the default plugin and every extra one.
	type pluginSet struct {
		id, stateDir string
		procs        map[string]*csiPluginProc
		sockets      map[string]string
	}
	sets := []pluginSet{{csiPluginID, cc.StateDir, cc.Plugins, cc.Sockets}}
	for _, id := range opts.ExtraPluginIDs {
		set := cc.Extra[id]
		sets = append(sets, pluginSet{id, set.StateDir, set.Plugins, set.Sockets})
	}
	clientName := func(i int) string { return fmt.Sprintf("client-%d", i) }

	if len(opts.Zones) > 0 && !opts.ExternalPlugins {
		t.Fatal("e2e: csiOpts.Zones needs ExternalPlugins")
	}
	if len(opts.ControllerConcurrency) > 0 && !opts.ExternalPlugins {
		t.Fatal("e2e: csiOpts.ControllerConcurrency needs ExternalPlugins")
	}
	if opts.ExternalPlugins {
		var agents []*Agent
		// Registered before the cluster's cleanup, so it runs after it:
		// the clients stop before their plugins do.
		t.Cleanup(func() { stopAndReport(t, agents) })
		for i := 0; i < opts.Clients; i++ {
			name := clientName(i)
			for _, s := range sets {
				prefix := ""
				if s.id != csiPluginID {
					prefix = s.id + "-"
				}
				sock := filepath.Join(dir, prefix+name+".sock")
				args := append([]string{"plugin", "csi-hostpath", "-endpoint", "unix://" + sock, "-node-id", name},
					csiPluginFlags(s.stateDir, opts)...)
				if z := opts.Zones[name]; z != "" {
					args = append(args, "-zone", z)
				}
				a := NewAgent(t, "plugin-"+prefix+name, filepath.Join(dir, "plugin-"+prefix+name), 0, 0, args...)
				agents = append(agents, a)
				must.NoError(t, a.Start())
				s.procs[name] = &csiPluginProc{PluginID: s.id, Client: name, StateDir: s.stateDir, Socket: sock, agent: a}
				s.sockets[name] = sock
			}
		}
		// Clients fingerprint their plugins when they start; the sockets
		// must answer by then.
		for _, s := range sets {
			for _, p := range s.procs {
				WaitFor(t, startTimeout, func() error {
					if !p.Running() {
						return fmt.Errorf("%s exited (%s):\n%s", p.Name(), p.agent.ExitState(), p.LogTail(20))
					}
					return probePlugin(p.Socket)
				})
			}
		}
	}

	if opts.ACL {
		opts.ServerConfigExtra += "\nacl {\n  enabled = true\n}\n"
		opts.ClientConfigExtra += "\nacl {\n  enabled = true\n}\n"
	}
	cc.Cluster = StartCluster(t, Opts{
		Servers:           opts.Servers,
		Clients:           opts.Clients,
		ServerConfigExtra: opts.ServerConfigExtra,
		ClientConfigExtra: opts.ClientConfigExtra,
		LogLevel:          opts.LogLevel,
		OwnAddrs:          opts.OwnAddrs,
		StopOnClientAfter: opts.StopOnClientAfter,
		Binary:            opts.Binary,
		ClientConfigFor: func(name string) string {
			if !opts.ExternalPlugins {
				return ""
			}
			hcl := "client {\n"
			for _, s := range sets {
				extra := ""
				if n := opts.ControllerConcurrency[s.id]; n != 0 {
					extra = fmt.Sprintf("    controller_concurrency = %d\n", n)
				}
				hcl += fmt.Sprintf(`  csi_plugin %q {
    type   = "monolith"
    socket = %q
%s  }
`, s.id, s.sockets[name], extra)
			}
			return hcl + "}\n"
		},
	})
	if opts.ACL {
		cc.ACLToken = bootstrapACL(t, cc.Cluster)
	}
	cc.ReportServerEvents(150)
	cc.NodeIDs = cc.Cluster.NodeIDs()

	if !opts.ExternalPlugins {
		for _, s := range sets {
			for i, client := range cc.Clients {
				name := clientName(i)
				s.procs[name] = &csiPluginProc{PluginID: s.id, Client: name, StateDir: s.stateDir, dataDir: client.DataDir}
			}
		}
		// Registered after the cluster's cleanup, so it runs before it:
		// the task logs are read before the cluster's files go.
		t.Cleanup(func() {
			if !t.Failed() {
				return
			}
			for _, s := range sets {
				for _, name := range sortedKeys(s.procs) {
					p := s.procs[name]
					t.Logf("==== e2e: %s, last %d lines ====\n%s", p.Name(), logTailLines, p.LogTail(logTailLines))
				}
			}
		})
		for _, s := range sets {
			cc.RunJob(csiPluginJob(bin, s.id, s.stateDir, opts))
		}
		for _, s := range sets {
			for name, p := range s.procs {
				if err := p.waitTask(csiSettle); err != nil {
					list, _ := JobAllocs(cc.API(), csiPluginJobID(s.id))
					t.Fatalf("e2e: %v\nallocations of %s:\n%s", err, csiPluginJobID(s.id), allocTable(list))
				}
				s.sockets[name] = p.Socket
			}
		}
		// A socket the client put outside the cluster's directory (its
		// temp dir was too deep for one) outlives the plugin: executors
		// and tasks are killed at the end, not stopped.
		t.Cleanup(func() {
			for _, s := range sets {
				for _, sock := range s.sockets {
					if !strings.HasPrefix(sock, cc.Dir+string(filepath.Separator)) {
						os.Remove(sock)
					}
				}
			}
		})
	}

	for _, s := range sets {
		WaitFor(t, csiSettle, func() error {
			var p api.CSIPlugin
			if err := GetJSON(cc.API(), "/v1/plugin/csi/"+s.id, &p); err != nil {
				return err
			}
			if p.ControllersHealthy != opts.Clients || p.NodesHealthy != opts.Clients {
				return fmt.Errorf("plugin %s: %d/%d controllers and %d/%d nodes healthy, want %d",
					s.id, p.ControllersHealthy, p.ControllersExpected, p.NodesHealthy, p.NodesExpected, opts.Clients)
			}
			return nil
		})
	}
	return cc
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// dialPlugin opens a gRPC connection to a plugin socket.
func dialPlugin(sock string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// probePlugin calls Probe once on the plugin at sock.
func probePlugin(sock string) error {
	if _, err := os.Stat(sock); err != nil {
		return err
	}
	conn, err := dialPlugin(sock)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
	return err
}

// createVolumes creates one volume per name through the controller service
// of client's plugin, one call at a time (concurrent calls would themselves
// count as overlaps), and returns their external IDs in order.
func (cc *csiCluster) createVolumes(t *testing.T, client string, names ...string) []string {
	t.Helper()
	return createVolumesAt(t, cc.Sockets[client], names...)
}

// createVolumesAt is createVolumes through the plugin listening on sock.
func createVolumesAt(t *testing.T, sock string, names ...string) []string {
	t.Helper()
	conn, err := dialPlugin(sock)
	must.NoError(t, err)
	defer conn.Close()
	ctrl := csi.NewControllerClient(conn)
	ids := make([]string, 0, len(names))
	for _, name := range names {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: name,
			VolumeCapabilities: []*csi.VolumeCapability{{
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			}},
		})
		cancel()
		must.NoError(t, err, must.Sprintf("CreateVolume %s", name))
		ids = append(ids, resp.GetVolume().GetVolumeId())
	}
	return ids
}

// volumeSpec is a volume register file for a single-node-writer
// file-system volume of the hostpath plugin.
func volumeSpec(id, externalID string) string {
	return fmt.Sprintf(`id          = %q
name        = %q
type        = "csi"
plugin_id   = %q
external_id = %q

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
`, id, id, csiPluginID, externalID)
}

// registerVolumeCLI registers a volume with `roam volume register FILE`.
func (cc *csiCluster) registerVolumeCLI(t *testing.T, id, externalID string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "volume.hcl")
	must.NoError(t, os.WriteFile(path, []byte(volumeSpec(id, externalID)), 0o644))
	cc.MustCLI("volume", "register", path)
}

// registerVolumeHTTP registers a volume with PUT /v1/volume/csi/:id.
func (cc *csiCluster) registerVolumeHTTP(t *testing.T, id, externalID string) {
	t.Helper()
	body := map[string]any{"Volumes": []map[string]any{{
		"ID": id, "Name": id, "ExternalID": externalID, "PluginID": csiPluginID,
		"RequestedCapabilities": []map[string]string{{
			"AccessMode": api.CSIAccessModeSingleNodeWriter, "AttachmentMode": api.CSIAttachmentModeFilesystem,
		}},
	}}}
	must.NoError(t, SendJSON("PUT", cc.API(), "/v1/volume/csi/"+url.PathEscape(id), body, nil))
}

// volume reads GET /v1/volume/csi/:id.
func (cc *csiCluster) volume(id string) (*api.CSIVolume, error) {
	var v api.CSIVolume
	err := GetJSON(cc.API(), "/v1/volume/csi/"+url.PathEscape(id), &v)
	return &v, err
}

// claimsString renders a volume's claims for failure messages.
func claimsString(v *api.CSIVolume) string {
	if len(v.Claims) == 0 {
		return "no claims"
	}
	var parts []string
	for _, c := range v.Claims {
		parts = append(parts, fmt.Sprintf("alloc=%.8s node=%.8s mode=%s state=%s", c.AllocationID, c.NodeID, c.Mode, c.State))
	}
	return strings.Join(parts, "; ")
}

// overlaps reads the overlap count of the plugin with node ID name; a
// missing file counts as 0 only if the process never served a controller.
func (cc *csiCluster) overlaps(name string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(cc.StateDir, "overlaps-"+name))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// calls reads the destructive controller call counts of the plugin with
// node ID name.
func (cc *csiCluster) calls(name string) (map[string]int64, error) {
	b, err := os.ReadFile(filepath.Join(cc.StateDir, "calls-"+name+".json"))
	if err != nil {
		return nil, err
	}
	m := make(map[string]int64)
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("calls-%s.json: %w", name, err)
	}
	return m, nil
}

// providerOverlaps reads the provider-wide overlap count of the plugins
// sharing stateDir (hostpath.ProviderOverlapsFile); missing reads as 0.
func providerOverlaps(stateDir string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, "provider-overlaps"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// mustNoOverlaps checks that no plugin process saw overlapping destructive
// controller calls, and that the provider (every instance on the shared
// state dir) never had two in flight at once.
func (cc *csiCluster) mustNoOverlaps(t *testing.T) {
	t.Helper()
	n, err := providerOverlaps(cc.StateDir)
	must.NoError(t, err)
	must.Eq(t, 0, n, must.Sprint("the provider saw overlapping destructive controller calls across plugin instances"))
	for name, p := range cc.Plugins {
		n, err := cc.overlaps(name)
		must.NoError(t, err)
		must.Eq(t, 0, n, must.Sprintf("plugin of %s counted overlapping controller calls; its log:\n%s", name, p.LogTail(40)))
	}
}

// controllerOrder returns the client names among names sorted by node ID,
// lowest first: the order in which the leader tries controllers.
func (cc *csiCluster) controllerOrder(names ...string) []string {
	if len(names) == 0 {
		for name := range cc.NodeIDs {
			names = append(names, name)
		}
	}
	out := append([]string(nil), names...)
	sort.Slice(out, func(i, j int) bool { return cc.NodeIDs[out[i]] < cc.NodeIDs[out[j]] })
	return out
}

// clientName returns the client name of nodeID.
func (cc *csiCluster) clientName(nodeID string) string {
	for name, id := range cc.NodeIDs {
		if id == nodeID {
			return name
		}
	}
	return ""
}

// clientIndex returns the index in Clients of the client named name.
func (cc *csiCluster) clientIndex(name string) int {
	for i, a := range cc.Clients {
		if a.Name == name {
			return i
		}
	}
	return -1
}

// csiJob is a job of one group "g" whose task "t" runs script under
// /bin/sh with the group's CSI volume "data" (source, per_alloc as given)
// mounted at $ROAM_TASK_DIR/data. groupExtra is more HCL for the group.
func csiJob(id, typ string, count int, source string, perAlloc bool, groupExtra, script string) string {
	return csiJobTask(id, typ, count, source, perAlloc, groupExtra, "", script)
}

// csiJobTask is csiJob with taskExtra, more HCL for the task (kill_signal,
// kill_timeout, ...).
func csiJobTask(id, typ string, count int, source string, perAlloc bool, groupExtra, taskExtra, script string) string {
	return fmt.Sprintf(`job %q {
  type        = %q
  datacenters = ["dc1"]

  group "g" {
    count = %d
%s
    volume "data" {
      type            = "csi"
      source          = %q
      per_alloc       = %t
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }

    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", %q]
      }
%s
      volume_mount {
        volume      = "data"
        destination = "data"
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
`, id, typ, count, groupExtra, source, perAlloc, script, taskExtra)
}

// oneAlloc is a WaitJobAllocs condition: exactly one allocation, in client
// status want; a failed one ends the wait early with its task events.
func oneAlloc(want string) func([]*Alloc) error {
	return func(list []*Alloc) error {
		if len(list) != 1 {
			return fmt.Errorf("want 1 allocation, have %d", len(list))
		}
		a := list[0]
		if a.ClientStatus == "failed" && want != "failed" {
			return errFatal(fmt.Errorf("allocation %s failed: %s", a, taskEvents(a)))
		}
		if a.ClientStatus != want {
			return fmt.Errorf("allocation %s is %s, want %s", a, a.ClientStatus, want)
		}
		return nil
	}
}

// fatalErr marks a condition error that no amount of waiting will fix.
type fatalErr struct{ error }

func errFatal(err error) error { return fatalErr{err} }

// waitCSIAllocs is WaitJobAllocs that stops at once on a fatal error.
func (cc *csiCluster) waitCSIAllocs(t *testing.T, jobID string, timeout time.Duration, cond func([]*Alloc) error) []*Alloc {
	t.Helper()
	var last []*Alloc
	err := poll(timeout, func() error {
		list, err := JobAllocs(cc.API(), jobID)
		if err != nil {
			return err
		}
		last = list
		if err := cond(list); err != nil {
			var f fatalErr
			if errors.As(err, &f) {
				return nil // reported below
			}
			return fmt.Errorf("%w\nallocations of %s:\n%s", err, jobID, allocTable(list))
		}
		return nil
	})
	if err == nil {
		err = cond(last)
	}
	if err != nil {
		t.Fatalf("e2e: allocations of %s: %v", jobID, err)
	}
	return last
}

// taskEvents renders every task's events of a.
func taskEvents(a *Alloc) string {
	var b strings.Builder
	for name, ts := range a.TaskStates {
		fmt.Fprintf(&b, "task %s %s:", name, ts.State)
		for _, e := range ts.Events {
			fmt.Fprintf(&b, " [%s: %s]", e.Type, e.Message)
		}
		b.WriteString("; ")
	}
	if a.ClientDescription != "" {
		fmt.Fprintf(&b, "client: %s", a.ClientDescription)
	}
	return b.String()
}
