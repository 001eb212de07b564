package nomad

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/roamhq/roam/client"
	"github.com/roamhq/roam/plugins/csi/hostpath"
	"github.com/roamhq/roam/structs"
)

// csiFixture is one server, a real client A running the hostpath plugin as
// a monolith (so it is the controller), and a synthetic node B whose
// allocations claim volumes; B's node plugin runs in its own plugin
// instance on the same state dir, as a second machine would.
type csiFixture struct {
	srv      *Server
	stateDir string
	nodeB    *structs.Node
	plugin   csi.ControllerClient
	// client is client A.
	client *client.Client
}

func startPlugin(t *testing.T, stateDir, nodeID string, mode hostpath.Mode) *hostpath.Plugin {
	t.Helper()
	cfg := hostpath.DefaultConfig()
	cfg.Endpoint = "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	cfg.NodeID = nodeID
	cfg.StateDir = stateDir
	cfg.Mode = mode
	p, err := hostpath.New(cfg)
	must.NoError(t, err)
	must.NoError(t, p.Start())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		_ = p.Stop(context.Background())
		<-done
	})
	return p
}

func newCSIFixture(t *testing.T) *csiFixture {
	t.Helper()
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	stateDir := t.TempDir()
	pa := startPlugin(t, stateDir, "node-a", hostpath.ModeMonolith)
	startPlugin(t, stateDir, "node-b", hostpath.ModeNode)

	cfg := client.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.Servers = []string{s.Addr()}
	cfg.MinRetryBackoff = 10 * time.Millisecond
	cfg.MaxRetryBackoff = 200 * time.Millisecond
	cfg.CSIPlugins = map[string]*client.CSIPluginConfig{
		"hostpath": {ID: "hostpath", Type: client.CSIPluginTypeMonolith, Socket: filepath.Join(filepath.Dir(pa.Endpoint()[len("unix://"):]), "csi.sock")},
	}
	c, err := client.NewClient(cfg)
	must.NoError(t, err)
	t.Cleanup(func() { _ = c.Shutdown(context.Background()) })

	// The plugin's controller on client A becomes healthy in the cluster.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		p, err := s.State().CSIPluginByID(nil, "hostpath")
		if err != nil || p == nil || p.ControllersHealthy != 1 {
			return fmt.Errorf("plugin %+v (%v)", p, err)
		}
		if _, ok := s.nodeSession(c.NodeID()); !ok {
			return fmt.Errorf("client session not recorded yet")
		}
		return nil
	}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))

	nodeB := workNode("node-b")
	nodeB.CSINodePlugins = map[string]*structs.CSIInfo{"hostpath": {PluginID: "hostpath", Healthy: true,
		NodeInfo: &structs.CSINodeInfo{ID: "node-b", MaxVolumes: 16, RequiresNodeStageVolume: true}}}
	registerNodeRetry(t, s, nodeB)

	conn, err := grpc.NewClient(pa.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	must.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return &csiFixture{srv: s, stateDir: stateDir, nodeB: nodeB, plugin: csi.NewControllerClient(conn), client: c}
}

// volume creates a volume in the plugin and registers it.
func (f *csiFixture) volume(t *testing.T, id string) *structs.CSIVolume {
	t.Helper()
	mode := &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}
	resp, err := f.plugin.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name: id,
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: mode,
		}},
	})
	must.NoError(t, err)
	vol := testVolume(id)
	vol.ExternalID = resp.Volume.VolumeId
	var rresp structs.CSIVolumeRegisterResponse
	must.NoError(t, f.srv.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{vol}}, &rresp))
	return vol
}

// alloc places a live allocation on node B directly in state.
func (f *csiFixture) alloc(t *testing.T, nodeID string) *structs.Allocation {
	t.Helper()
	a := &structs.Allocation{ID: fmt.Sprintf("alloc-%d", time.Now().UnixNano()), Namespace: structs.DefaultNamespace,
		JobID: "db", TaskGroup: "g", NodeID: nodeID, DesiredStatus: structs.AllocDesiredStatusRun,
		ClientStatus: structs.AllocClientStatusRunning}
	_, _, err := f.srv.raftApply(structs.ApplyPlanResultsRequestType, &structs.ApplyPlanResultsRequest{AllocsPlaced: []*structs.Allocation{a}})
	must.NoError(t, err)
	return a
}

func (f *csiFixture) claim(volID, allocID string, state structs.CSIClaimState, token string) (*structs.CSIVolumeClaimResponse, error) {
	var resp structs.CSIVolumeClaimResponse
	err := f.srv.RPC("CSIVolume.Claim", &structs.CSIVolumeClaimRequest{
		VolumeID: volID, AllocationID: allocID, Mode: structs.CSIVolumeClaimWrite,
		AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
		State: state, WriteRequest: structs.WriteRequest{AuthToken: token},
	}, &resp)
	return &resp, err
}

func TestCSIVolume_ClaimPublishesAndReleases(t *testing.T) {
	f := newCSIFixture(t)
	vol := f.volume(t, "data")
	a1 := f.alloc(t, f.nodeB.ID)

	resp, err := f.claim(vol.ID, a1.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.NoError(t, err)
	must.MapContainsKey(t, resp.PublishContext, "device", must.Sprintf("publish context %v", resp.PublishContext))
	must.Eq(t, "s3cret", resp.Volume.Secrets["token"], must.Sprint("the claiming node gets the secrets it needs"))
	got, err := f.srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
	must.NoError(t, err)
	must.Eq(t, structs.CSIVolumeClaimStateTaken, got.Claims[a1.ID].State)
	calls, err := hostpath.ReadCalls(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(1), calls["ControllerPublishVolume"])

	// A retried claim is answered from the checkpoint: no second publish.
	again, err := f.claim(vol.ID, a1.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.NoError(t, err)
	must.Eq(t, resp.PublishContext, again.PublishContext)
	calls, err = hostpath.ReadCalls(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(1), calls["ControllerPublishVolume"])

	// A second writer on a single-node-writer volume: max claims, nothing changes.
	a2 := f.alloc(t, f.nodeB.ID)
	before, err := f.srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
	must.NoError(t, err)
	_, err = f.claim(vol.ID, a2.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.ErrorIs(t, err, structs.ErrCSIMaxClaims)
	after, err := f.srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
	must.NoError(t, err)
	must.Eq(t, before.ModifyIndex, after.ModifyIndex)

	// Bad input changes nothing.
	_, err = f.claim("no-such-volume", a1.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.ErrorIs(t, err, structs.ErrNotFound)
	other := f.alloc(t, "some-other-node")
	_, err = f.claim(vol.ID, other.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.ErrorIs(t, err, structs.ErrPermissionDenied)
	_, err = f.claim(vol.ID, a1.ID, "bogus", f.nodeB.SecretID)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	after, err = f.srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
	must.NoError(t, err)
	must.Eq(t, before.ModifyIndex, after.ModifyIndex)

	// Release walks the claim to freed and detaches at the controller.
	_, err = f.claim(vol.ID, a1.ID, structs.CSIVolumeClaimStateUnpublishing, f.nodeB.SecretID)
	must.NoError(t, err)
	got, err = f.srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
	must.NoError(t, err)
	must.MapEmpty(t, got.Claims)
	calls, err = hostpath.ReadCalls(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(1), calls["ControllerUnpublishVolume"])

	// Now the second writer fits.
	_, err = f.claim(vol.ID, a2.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.NoError(t, err)
	overlaps, err := hostpath.ReadOverlaps(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(0), overlaps)
}

func TestCSIVolume_WatcherReleasesClaimsOfDownNode(t *testing.T) {
	t.Parallel()
	f := newCSIFixture(t)
	vol := f.volume(t, "data")
	a1 := f.alloc(t, f.nodeB.ID)
	_, err := f.claim(vol.ID, a1.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.NoError(t, err)

	// Node B dies holding the claim: once it is marked down, the watcher
	// releases the claim without a node detach (the node is gone) and
	// still detaches at the controller.
	f.srv.heartbeats.clear(f.nodeB.ID)
	f.srv.markNodeDown(f.nodeB.ID)
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		v, err := f.srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
		if err != nil {
			return err
		}
		if len(v.Claims) != 0 {
			return fmt.Errorf("claims %v", v.Claims)
		}
		return nil
	}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))
	calls, err := hostpath.ReadCalls(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(1), calls["ControllerUnpublishVolume"])
}

// A replacement's claim releases the claim of the allocation it replaces
// when that one is over (its node went down), instead of failing with max
// claims until the volume watcher gets there (Nomad #8609).
func TestCSIVolume_ClaimReleasesStaleClaimInTheWay(t *testing.T) {
	f := newCSIFixture(t)
	vol := f.volume(t, "data")
	// Node C is another machine; its storage identity is node-b's, which
	// the plugin knows.
	nodeC := workNode("node-c")
	nodeC.CSINodePlugins = f.nodeB.CSINodePlugins
	registerNodeRetry(t, f.srv, nodeC)
	old := f.alloc(t, nodeC.ID)
	_, err := f.claim(vol.ID, old.ID, structs.CSIVolumeClaimStateTaken, nodeC.SecretID)
	must.NoError(t, err)

	// Node C dies; the replacement runs on node B and claims at once.
	f.srv.heartbeats.clear(nodeC.ID)
	f.srv.markNodeDown(nodeC.ID)
	repl := f.alloc(t, f.nodeB.ID)

	// The watcher may be releasing the old claim at this very moment, in
	// which case the claim is asked to come back (retryable), never refused.
	var resp *structs.CSIVolumeClaimResponse
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		var err error
		resp, err = f.claim(vol.ID, repl.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
		if err != nil && !structs.IsRetryable(err) {
			t.Fatalf("replacement claim refused: %v", err)
		}
		return err
	}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))
	must.MapContainsKey(t, resp.PublishContext, "device")
	v, err := f.srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
	must.NoError(t, err)
	must.MapLen(t, 1, v.Claims)
	must.MapContainsKey(t, v.Claims, repl.ID)
	calls, err := hostpath.ReadCalls(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(1), calls["ControllerUnpublishVolume"])
	must.Eq(t, int64(2), calls["ControllerPublishVolume"])
}

// Each checkpoint of a claim resumes correctly: a leader that finds a claim
// in any state (left there by a predecessor) finishes the walk from that
// state, and only the controller calls still owed are made.
func TestCSIVolume_ClaimCheckpointsResume(t *testing.T) {
	cases := []struct {
		state structs.CSIClaimState
		// Controller calls owed from this state.
		wantPublish, wantUnpublish int64
		claimFirst                 bool // resume a claim (else a release)
	}{
		{structs.CSIVolumeClaimStatePublishing, 1, 0, true},
		{structs.CSIVolumeClaimStateTaken, 0, 1, false},
		{structs.CSIVolumeClaimStateUnpublishing, 0, 1, false},
		{structs.CSIVolumeClaimStateNodeDetached, 0, 1, false},
		{structs.CSIVolumeClaimStateControllerDetached, 0, 0, false},
	}
	f := newCSIFixture(t)
	// Volumes are created up front: the fixture creates them by calling
	// the plugin directly, outside the lane, which must not overlap the
	// lane's calls for earlier cases.
	vols := make([]*structs.CSIVolume, len(cases))
	for i := range cases {
		vols[i] = f.volume(t, fmt.Sprintf("resume-%d", i))
	}
	// retry sends a claim change as a client would: again on retryable
	// answers (the volume watcher may be finishing the same walk).
	retry := func(t *testing.T, volID, allocID string, state structs.CSIClaimState) {
		must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
			_, err := f.claim(volID, allocID, state, f.nodeB.SecretID)
			if err != nil && !structs.IsRetryable(err) {
				t.Fatalf("claim change refused: %v", err)
			}
			return err
		}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))
	}
	for i, tc := range cases {
		t.Run(string(tc.state), func(t *testing.T) {
			vol := vols[i]
			a := f.alloc(t, f.nodeB.ID)
			before, err := hostpath.ReadCalls(f.stateDir, "node-a")
			must.NoError(t, err)
			// A predecessor left the claim at tc.state.
			_, _, err = f.srv.raftApply(structs.CSIVolumeClaimRequestType, &structs.CSIVolumeClaimUpdateRequest{
				Namespace: structs.DefaultNamespace, VolumeID: vol.ID,
				Claim: &structs.CSIVolumeClaim{AllocationID: a.ID, NodeID: f.nodeB.ID, ExternalNodeID: "node-b",
					Mode: structs.CSIVolumeClaimWrite, AccessMode: structs.CSIAccessModeSingleNodeWriter,
					AttachmentMode: structs.CSIAttachmentModeFilesystem, State: tc.state,
					UpdatedAt: time.Now().UnixNano()},
			})
			must.NoError(t, err)

			if tc.claimFirst {
				retry(t, vol.ID, a.ID, structs.CSIVolumeClaimStateTaken)
				v, err := f.srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
				must.NoError(t, err)
				must.Eq(t, structs.CSIVolumeClaimStateTaken, v.Claims[a.ID].State)
			} else {
				retry(t, vol.ID, a.ID, structs.CSIVolumeClaimStateUnpublishing)
				v, err := f.srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
				must.NoError(t, err)
				must.MapEmpty(t, v.Claims)
			}
			after, err := hostpath.ReadCalls(f.stateDir, "node-a")
			must.NoError(t, err)
			must.Eq(t, tc.wantPublish, after["ControllerPublishVolume"]-before["ControllerPublishVolume"])
			must.Eq(t, tc.wantUnpublish, after["ControllerUnpublishVolume"]-before["ControllerUnpublishVolume"])
		})
	}
	overlaps, err := hostpath.ReadOverlaps(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(0), overlaps)
}

// A publish the provider refuses (the single-node volume is attached to
// another node behind Roam's back) fails the claim with the plugin's
// reason, and the reservation is rolled back: no claim is left to block the
// volume, and the controller was told to unpublish in case the refused call
// took effect after all.
func TestCSIVolume_FailedPublishRollsBack(t *testing.T) {
	f := newCSIFixture(t)
	vol := f.volume(t, "data")
	mode := &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}
	_, err := f.plugin.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{
		VolumeId: vol.ExternalID, NodeId: "node-a",
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: mode,
		},
	})
	must.NoError(t, err)

	a := f.alloc(t, f.nodeB.ID)
	_, err = f.claim(vol.ID, a.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.ErrorIs(t, err, structs.ErrCSIFailedPrecondition)
	must.False(t, structs.IsRetryable(err))

	got, err := f.srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
	must.NoError(t, err)
	must.MapEmpty(t, got.Claims, must.Sprint("the failed claim's reservation is still there"))
	calls, err := hostpath.ReadCalls(f.stateDir, "node-a")
	must.NoError(t, err)
	// One publish by the test, one by the claim; the rollback unpublished.
	must.Eq(t, int64(2), calls["ControllerPublishVolume"])
	must.Eq(t, int64(1), calls["ControllerUnpublishVolume"])

	// Once the provider lets go, the same allocation claims the volume.
	_, err = f.plugin.ControllerUnpublishVolume(context.Background(), &csi.ControllerUnpublishVolumeRequest{
		VolumeId: vol.ExternalID, NodeId: "node-a",
	})
	must.NoError(t, err)
	_, err = f.claim(vol.ID, a.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.NoError(t, err)
	overlaps, err := hostpath.ReadOverlaps(f.stateDir, "node-a")
	must.NoError(t, err)
	must.Eq(t, int64(0), overlaps)
}

// A release that checkpointed the claim and then could not reach the
// controller changed the claim even though it failed: the answer is marked
// carried out in part, so forward does not send it to the next leader as a
// call that never ran (where an "in progress" from the volume watcher's
// walk of the same claim would read as "nothing changed", the chaos
// history of 2026-12-07), and the claim is left where the walk stopped,
// for the volume watcher to finish.
func TestCSIVolume_ReleaseStoppedPartWaySaysSo(t *testing.T) {
	f := newCSIFixture(t)
	vol := f.volume(t, "data")
	a := f.alloc(t, f.nodeB.ID)
	_, err := f.claim(vol.ID, a.ID, structs.CSIVolumeClaimStateTaken, f.nodeB.SecretID)
	must.NoError(t, err)

	// The only controller goes away.
	must.NoError(t, f.client.Shutdown(context.Background()))
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		_, ok := f.srv.nodeSession(f.client.NodeID())
		return !ok
	}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))

	_, err = f.claim(vol.ID, a.ID, structs.CSIVolumeClaimStateUnpublishing, f.nodeB.SecretID)
	must.ErrorIs(t, err, structs.ErrPartlyDone)
	// What stopped it still answers for it: no controller, which a client
	// does not retry on the same session (it keeps the session), as before.
	must.ErrorIs(t, err, structs.ErrCSIControllerUnavailable)
	must.False(t, errors.Is(err, structs.ErrOutcomeUnknown), must.Sprint("the outcome is known: done in part"))
	must.False(t, structs.IsRetryable(err))
	must.False(t, forwardRetryable(err), must.Sprintf("forward would resend %v", err))
	got, serr := f.srv.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
	must.NoError(t, serr)
	must.MapContainsKey(t, got.Claims, a.ID)
	must.Eq(t, structs.CSIVolumeClaimStateNodeDetached, got.Claims[a.ID].State)
}

func TestPartWay(t *testing.T) {
	lanesClosed := fmt.Errorf("csi plugin %q: unpublish: lanes closed: %w", "hostpath", structs.ErrNoLeader)
	inProgress := fmt.Errorf("%w: allocation a, volume v", structs.ErrClaimInProgress)
	cases := []struct {
		name       string
		wrote      bool
		err        error
		wantMarked bool
	}{
		{"nothing written, no leader: forward may resend", false, lanesClosed, false},
		{"nothing written, in progress: a refusal", false, inProgress, false},
		{"checkpointed, no leader", true, lanesClosed, true},
		{"checkpointed, in progress", true, inProgress, true},
		{"already marked stays as it is", true, fmt.Errorf("%w: inner", structs.ErrPartlyDone), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := partWay(tc.wrote, structs.CSIVolumeClaimStateNodeDetached, tc.err)
			must.ErrorIs(t, got, tc.err, must.Sprint("the cause is kept"))
			must.Eq(t, tc.wantMarked, errors.Is(got, structs.ErrPartlyDone))
			// The cause, not the mark, says whether a caller retries.
			must.Eq(t, structs.IsRetryable(tc.err), structs.IsRetryable(got))
			if errors.Is(tc.err, structs.ErrNoLeader) {
				must.Eq(t, !tc.wantMarked, forwardRetryable(got))
			}
		})
	}
	must.EqError(t, partWay(true, structs.CSIVolumeClaimStateFreed, inProgress),
		structs.ErrPartlyDone.Error()+": the claim was left freed, to be finished by a retry or the volume watcher: "+inProgress.Error())
}

// A lane call tells its client how long it may wait for its turn and run,
// and the in-memory fence for a call whose outcome is unknown lasts at
// least that long: a call that starts at the client after the fence lifts
// would meet the next call at another node's controller.
func TestControllerQuery_BoundsTheFenceCovers(t *testing.T) {
	cn := &structs.Node{ID: "n1"}
	lane := context.WithValue(context.Background(), leaderTermKey{}, uint64(7))
	q := controllerQuery(lane, cn)
	must.Eq(t, uint64(7), q.LeaderTerm)
	must.Positive(t, q.StartWithin)
	must.Positive(t, q.Timeout)
	now := time.Now()
	must.LessEq(t, unknownCallEnds(now).Sub(now), q.StartWithin+q.Timeout,
		must.Sprint("the fence lifts before a call the client may still start has ended"))

	// Outside a lane (a read) nothing is bounded beyond the client's own.
	read := controllerQuery(context.Background(), cn)
	must.Eq(t, structs.CSIControllerQuery{ControllerNodeID: "n1"}, read)
}
