package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/rpc"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/roamhq/roam/nomad"
	"github.com/roamhq/roam/plugins/csi/hostpath"
	"github.com/roamhq/roam/structs"
)

func TestCSIClaimRequest(t *testing.T) {
	alloc := &structs.Allocation{ID: "a1", Name: "db.g[2]"}
	cases := []struct {
		name string
		req  *structs.VolumeRequest
		want *structs.CSIVolumeClaimRequest
	}{
		{"defaults to a single-node file-system writer",
			&structs.VolumeRequest{Source: "vol"},
			&structs.CSIVolumeClaimRequest{VolumeID: "vol", Mode: structs.CSIVolumeClaimWrite,
				AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem}},
		{"read-only claims read; modes come from the request",
			&structs.VolumeRequest{Source: "vol", ReadOnly: true,
				AccessMode: structs.CSIAccessModeMultiNodeReader, AttachmentMode: structs.CSIAttachmentModeBlockDevice},
			&structs.CSIVolumeClaimRequest{VolumeID: "vol", Mode: structs.CSIVolumeClaimRead,
				AccessMode: structs.CSIAccessModeMultiNodeReader, AttachmentMode: structs.CSIAttachmentModeBlockDevice}},
		{"per-alloc adds the allocation's index",
			&structs.VolumeRequest{Source: "vol", PerAlloc: true},
			&structs.CSIVolumeClaimRequest{VolumeID: "vol[2]", Mode: structs.CSIVolumeClaimWrite,
				AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.want.AllocationID, tc.want.NodeID, tc.want.State = "a1", "n1", structs.CSIVolumeClaimStateTaken
			must.Eq(t, tc.want, csiClaimRequest("n1", alloc, tc.req))
		})
	}
}

// viaRPC is err as Client.RPC hands it back: coded by the server's RPC
// server, decoded by serverConn.call.
func viaRPC(err error) error {
	return structs.FromRPCError(rpc.ServerError(structs.EncodeRPCError(err)))
}

func TestCSIClaimError_NamesTheCause(t *testing.T) {
	args := &structs.CSIVolumeClaimRequest{VolumeID: "vol", Mode: structs.CSIVolumeClaimWrite, AccessMode: structs.CSIAccessModeSingleNodeWriter}
	// Errors as they arrive over RPC.
	err := csiClaimError(args, viaRPC(fmt.Errorf("%w: volume vol already has 1 writer(s)", structs.ErrCSIMaxClaims)))
	must.ErrorIs(t, err, structs.ErrCSIMaxClaims)
	must.StrContains(t, err.Error(), `volume "vol" has no room for another write claim`)
	err = csiClaimError(args, viaRPC(fmt.Errorf(`%w: volume "vol"`, structs.ErrNotFound)))
	must.ErrorIs(t, err, structs.ErrNotFound)
	must.StrContains(t, err.Error(), "not registered")
	must.False(t, retryableCall(structs.ErrCSIMaxClaims))
	must.True(t, retryableCall(fmt.Errorf("CSIVolume.Claim: gave up: %w", structs.ErrNoLeader)))
	must.True(t, retryableCall(structs.ErrClaimInProgress))
}

// TestClient_CSIVolumeClaimedMountedAndReleased runs a real server and a
// client with the hostpath plugin as a monolith: a batch job whose group
// requests a CSI volume writes through the task's volume_mount into the
// volume; afterwards the claim is freed and the controller detached once.
func TestClient_CSIVolumeClaimedMountedAndReleased(t *testing.T) {
	// The servers' claim window must hold the client's stop window
	// (stop_on_client_after, the task's 2 s kill timeout, the margin), or
	// the client rightly logs an error that this test counts as a
	// failure; TestConfig's 750 ms window does not.
	srv := testServer(t, func(c *nomad.Config) {
		c.MinHeartbeatTTL = time.Minute
		c.FailoverHeartbeatTTL = time.Minute
	})
	stateDir := t.TempDir()
	plugin := testHostpath(t, hostpath.ModeMonolith, "node-a", stateDir, nil)

	cfg := TestConfig(t, srv.Addr())
	cfg.ExecutorPath = os.Args[0]
	// The client's own release must free the claim, not the servers'
	// volume watcher settling after a failed one: record client errors.
	errLog := &syncBuffer{}
	logger := hclog.NewInterceptLogger(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn, Output: hclog.DefaultOutput})
	logger.RegisterSink(hclog.NewSinkAdapter(&hclog.LoggerOptions{Level: hclog.Error, Output: errLog}))
	cfg.Logger = logger
	cfg.CSIPlugins = map[string]*CSIPluginConfig{
		"hostpath": {ID: "hostpath", Type: CSIPluginTypeMonolith, Socket: strings.TrimPrefix(plugin.Endpoint(), "unix://")},
	}
	c := testClient(t, cfg)
	waitRegistered(t, c)
	waitForNode(t, srv, c.NodeID(), 10*time.Second, "ready with a healthy hostpath node plugin", func(n *structs.Node) bool {
		return isReady(n) && n.CSINodePlugins["hostpath"] != nil && n.CSINodePlugins["hostpath"].Healthy
	})
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		p, err := srv.State().CSIPluginByID(nil, "hostpath")
		if err != nil || p == nil || p.ControllersHealthy != 1 {
			return fmt.Errorf("plugin %+v (%v)", p, err)
		}
		return nil
	}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))

	// The volume exists in the provider and is registered with the servers.
	conn, err := grpc.NewClient(plugin.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	must.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	created, err := csi.NewControllerClient(conn).CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name: "vol1",
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
	})
	must.NoError(t, err)
	ext := created.Volume.VolumeId
	var rresp structs.CSIVolumeRegisterResponse
	must.NoError(t, srv.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{{
		ID: "vol1", ExternalID: ext, PluginID: "hostpath",
		RequestedCapabilities: []*structs.CSIVolumeCapability{{
			AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
		}},
	}}}, &rresp))

	var jresp structs.JobRegisterResponse
	must.NoError(t, srv.RPC("Job.Register", &structs.JobRegisterRequest{Job: &structs.Job{
		ID: "writer", Type: structs.JobTypeBatch, Datacenters: []string{"dc1"},
		TaskGroups: []*structs.TaskGroup{{
			Name: "g", Count: 1,
			Volumes: map[string]*structs.VolumeRequest{"data": {
				Name: "data", Type: "csi", Source: "vol1",
				AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
			}},
			Tasks: []*structs.Task{{
				Name: "main", Driver: "raw_exec",
				Config: map[string]any{"command": "/bin/sh", "args": []any{"-c",
					`echo "hello from $ROAM_ALLOC_ID" > "$ROAM_TASK_DIR/data/out.txt"`}},
				VolumeMounts: []*structs.VolumeMount{{Volume: "data", Destination: "data"}},
				KillTimeout:  2 * time.Second, KillSignal: "SIGTERM",
			}},
		}},
	}}, &jresp))

	done := waitServerAlloc(t, srv, "writer", clientStatusIs(structs.AllocClientStatusComplete))

	// The task wrote into the volume itself, not into the task dir.
	out, err := os.ReadFile(filepath.Join(stateDir, "volumes", ext, "out.txt"))
	must.NoError(t, err)
	must.Eq(t, "hello from "+done.ID+"\n", string(out))

	// The claim is released once the allocation is done.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		vol, err := srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, "vol1")
		if err != nil {
			return err
		}
		if vol == nil {
			return errors.New("volume vol1 is gone")
		}
		if len(vol.Claims) != 0 {
			return fmt.Errorf("volume vol1 still has claims %v", vol.Claims)
		}
		return nil
	}), wait.Timeout(20*time.Second), wait.Gap(20*time.Millisecond)))

	must.Eq(t, "", errLog.String(), must.Sprint("client errors while claiming and releasing"))

	calls, err := hostpath.ReadCalls(stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(1), calls["ControllerPublishVolume"], must.Sprintf("calls %v", calls))
	must.Eq(t, int64(1), calls["ControllerUnpublishVolume"], must.Sprintf("calls %v", calls))
	overlaps, err := hostpath.ReadOverlaps(stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(0), overlaps)
}

// syncBuffer is a bytes.Buffer safe for the logger's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A claim waits a bounded while for an unreachable controller, and retries
// the usual transient errors regardless; a refusal ends it at once.
func TestClaimRetryPolicy(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	retry := claimRetryPolicy(time.Minute, clock)

	// As it arrives over RPC.
	unavailable := viaRPC(fmt.Errorf(`%w: plugin "hostpath": all 3 candidates failed, last on node a: %w`,
		structs.ErrCSIControllerUnavailable, structs.ErrNodeNotConnected))
	must.True(t, retry(unavailable))
	now = now.Add(59 * time.Second)
	must.True(t, retry(unavailable))
	must.True(t, retry(structs.ErrNoLeader), must.Sprint("transient errors are not limited by the controller wait"))
	now = now.Add(time.Second)
	must.False(t, retry(unavailable), must.Sprint("waited a full minute for a controller"))
	must.True(t, retry(structs.ErrNoLeader))

	fresh := claimRetryPolicy(time.Minute, clock)
	must.False(t, fresh(structs.ErrCSIMaxClaims))
	must.False(t, fresh(fmt.Errorf("%w: volume %q", structs.ErrNotFound, "v")))
	must.False(t, claimRetryPolicy(0, clock)(unavailable), must.Sprint("a zero wait fails at once"))

	// The plugin answered UNAVAILABLE: the servers kept the reservation,
	// and the claim tries again within the same wait.
	busy := claimRetryPolicy(time.Minute, clock)
	pluginBusy := viaRPC(fmt.Errorf("volume v: the publish did not run; the reservation is kept for a retry: %w: try later", structs.ErrCSIUnavailable))
	must.True(t, busy(pluginBusy))
	now = now.Add(time.Minute)
	must.False(t, busy(pluginBusy))
	// A publish cut off by the plugin's death: its outcome is unknown,
	// retried regardless of the wait.
	must.True(t, busy(viaRPC(fmt.Errorf("%w: the plugin's connection broke during the call", structs.ErrOutcomeUnknown))))
}

// A leader's call whose plugin connection broke after it was sent may
// have run: outcome unknown, unlike a dial that failed or the plugin's
// own UNAVAILABLE.
func TestConnectionBroke(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("csi plugin: %w: error reading from server: EOF", structs.ErrCSIUnavailable), true},
		{fmt.Errorf("csi plugin: %w: transport is closing", structs.ErrCSIUnavailable), true},
		{fmt.Errorf("csi plugin: %w: connection error: desc = \"transport: Error while dialing: dial unix /s: connect: no such file\"", structs.ErrCSIUnavailable), false},
		{fmt.Errorf("csi plugin: %w: backend busy, try later", structs.ErrCSIUnavailable), false},
		{errors.New("error reading from server: EOF"), false},
		{nil, false},
	}
	for _, c := range cases {
		must.EqOp(t, c.want, connectionBroke(c.err), must.Sprintf("%v", c.err))
	}
}

// A claim refused because the leader's controller call was refused as a
// deposed leader's keeps the client's connection (the servers' calls to
// this node may run on it), as a claim in progress does; a server without
// a leader does not.
func TestClaimStillMoving(t *testing.T) {
	wire := func(err error) error { return structs.FromRPCError(rpc.ServerError(structs.EncodeRPCError(err))) }
	for _, err := range []error{structs.ErrClaimInProgress, structs.ErrStaleLeaderTerm} {
		must.True(t, claimStillMoving(wire(fmt.Errorf("claim: %w", err))), must.Sprint(err))
		must.True(t, retryableCall(wire(err)))
	}
	must.False(t, claimStillMoving(wire(structs.ErrNoLeader)))
}
