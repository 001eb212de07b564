package nomad

import (
	"fmt"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/plugins/csi/hostpath"
	"github.com/roamhq/roam/structs"
)

// hostileIDs are IDs no object may have, each with what its refusal must
// say. They are refused by every endpoint that takes an ID which may
// become a path.
var hostileIDs = []struct {
	name, id, want string
}{
	{"ten dot-dots", strings.Repeat("../", 10) + "victim", `"../../../../../../../../../../victim" must start with a letter or a digit`},
	{"inner dot-dots", "a/../../../x", `"a/../../../x" holds '/' at byte 1`},
	{"slash", "a/b", `"a/b" holds '/'`},
	{"NUL", "vol\x00x", `"vol\x00x" holds a NUL at byte 3`},
	{"too long", strings.Repeat("v", 129), fmt.Sprintf("%q is 129 bytes; at most 128 bytes are allowed", strings.Repeat("v", 129))},
	{"dot dot", "..", `".." must start with a letter or a digit`},
}

// mustNothingWritten checks that the latest Raft index is still before.
func mustNothingWritten(t *testing.T, s *Server, before uint64) {
	t.Helper()
	after, err := s.State().LatestIndex()
	must.NoError(t, err)
	must.Eq(t, before, after, must.Sprint("a refused request wrote to Raft"))
}

func latestIndex(t *testing.T, s *Server) uint64 {
	t.Helper()
	i, err := s.State().LatestIndex()
	must.NoError(t, err)
	return i
}

// Register and create refuse a volume whose ID or plugin ID could not name
// a directory: an invalid request naming the ID, nothing written, and the
// plugin never asked to create anything.
func TestCSIVolume_HostileIDsRefused(t *testing.T) {
	f := newCSIFixture(t)
	s := f.srv
	before := latestIndex(t, s)
	creates := func() int64 {
		calls, err := hostpath.ReadCalls(f.stateDir, "node-a")
		must.NoError(t, err)
		return calls["CreateVolume"]
	}
	createsBefore := creates()

	for _, tc := range hostileIDs {
		t.Run(tc.name, func(t *testing.T) {
			var rresp structs.CSIVolumeRegisterResponse
			err := s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{testVolume(tc.id)}}, &rresp)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.StrContains(t, err.Error(), "volume ID "+tc.want)

			var cresp structs.CSIVolumeCreateResponse
			err = s.RPC("CSIVolume.Create", &structs.CSIVolumeCreateRequest{Volumes: []*structs.CSIVolume{createSpec(tc.id)}}, &cresp)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.StrContains(t, err.Error(), "volume ID "+tc.want)

			// A hostile plugin ID, with a good volume ID.
			v := testVolume("good")
			v.PluginID = tc.id
			err = s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{v}}, &rresp)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.StrContains(t, err.Error(), "plugin ID "+tc.want)

			var dresp structs.CSIVolumeDeleteResponse
			err = s.RPC("CSIVolume.Delete", &structs.CSIVolumeDeleteRequest{VolumeIDs: []string{tc.id}}, &dresp)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.StrContains(t, err.Error(), "volume ID "+tc.want)

			var uresp structs.CSIVolumeUnpublishResponse
			err = s.RPC("CSIVolume.Unpublish", &structs.CSIVolumeUnpublishRequest{VolumeID: tc.id, NodeID: f.nodeB.ID}, &uresp)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.StrContains(t, err.Error(), "volume ID "+tc.want)
			err = s.RPC("CSIVolume.Unpublish", &structs.CSIVolumeUnpublishRequest{VolumeID: "good", NodeID: tc.id}, &uresp)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.StrContains(t, err.Error(), "node ID "+tc.want)

			var sresp structs.CSISnapshotCreateResponse
			err = s.RPC("CSIVolume.CreateSnapshot", &structs.CSISnapshotCreateRequest{
				Snapshots: []*structs.CSISnapshotSpec{{SourceVolumeID: tc.id}}}, &sresp)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.StrContains(t, err.Error(), "volume ID "+tc.want)

			var lresp structs.CSISnapshotListResponse
			err = s.RPC("CSIVolume.ListSnapshots", &structs.CSISnapshotListRequest{PluginID: tc.id}, &lresp)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.StrContains(t, err.Error(), "plugin ID "+tc.want)
		})
	}
	// Snapshot IDs and names are the provider's: only what no provider
	// needs (control characters, over 128 bytes) is refused.
	var dsresp structs.CSISnapshotDeleteResponse
	err := s.RPC("CSIVolume.DeleteSnapshot", &structs.CSISnapshotDeleteRequest{PluginID: "hostpath", SnapshotID: "snap\x00"}, &dsresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), `snapshot ID "snap\x00" holds the control character U+0000`)
	var sresp structs.CSISnapshotCreateResponse
	err = s.RPC("CSIVolume.CreateSnapshot", &structs.CSISnapshotCreateRequest{
		Snapshots: []*structs.CSISnapshotSpec{{SourceVolumeID: "good", Name: strings.Repeat("n", 200)}}}, &sresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "snapshot name")
	// A register's external ID is the provider's too.
	v := testVolume("good")
	v.ExternalID = "ext\x00"
	var rresp structs.CSIVolumeRegisterResponse
	err = s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{v}}, &rresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), `external volume ID "ext\x00"`)

	mustNothingWritten(t, s, before)
	must.Eq(t, createsBefore, creates(), must.Sprint("the plugin was asked to create a volume"))

	// IDs such as per-alloc sources are fine.
	must.NoError(t, s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{
		Volumes: []*structs.CSIVolume{testVolume("data[2]")}}, &rresp))
}

// A volume registered before IDs were checked (written to the state
// directly here) is not handed to a client by a claim; deregistering it
// stays possible.
func TestCSIVolume_LegacyHostileVolumeNotClaimed(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	n := csiNode("n1")
	registerNodeRetry(t, s, n)
	job := serviceJob("web", 1)
	registerJob(t, s, job)
	allocs := waitAllocs(t, s, "web", countIs(1))

	const hostile = "../../../../../victim"
	v := testVolume("placeholder")
	v.ID = hostile
	v.Namespace = structs.DefaultNamespace
	index := latestIndex(t, s)
	must.NoError(t, s.State().UpsertCSIVolumes(index+1, []*structs.CSIVolume{v}))

	var cresp structs.CSIVolumeClaimResponse
	err := s.RPC("CSIVolume.Claim", &structs.CSIVolumeClaimRequest{
		VolumeID: hostile, AllocationID: allocs[0].ID, State: structs.CSIVolumeClaimStateTaken,
		Mode: structs.CSIVolumeClaimWrite, AccessMode: structs.CSIAccessModeSingleNodeWriter,
		AttachmentMode: structs.CSIAttachmentModeFilesystem,
		WriteRequest:   structs.WriteRequest{AuthToken: n.SecretID},
	}, &cresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), fmt.Sprintf("volume ID %q", hostile))
	got, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, hostile)
	must.NoError(t, err)
	must.MapEmpty(t, got.Claims)

	var dresp structs.CSIVolumeDeregisterResponse
	must.NoError(t, s.RPC("CSIVolume.Deregister", &structs.CSIVolumeDeregisterRequest{VolumeIDs: []string{hostile}}, &dresp))
	got, err = s.State().CSIVolumeByID(nil, structs.DefaultNamespace, hostile)
	must.NoError(t, err)
	must.Nil(t, got)
}

// Job register refuses a job whose ID, group names, task names, volume
// sources or plugin IDs could not name a directory on a client.
func TestJob_RegisterRefusesHostileIDs(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	before := latestIndex(t, s)
	for _, tc := range hostileIDs {
		for _, field := range []struct {
			kind string
			edit func(j *structs.Job, id string)
		}{
			{"job ID", func(j *structs.Job, id string) { j.ID = id }},
			{"task group name", func(j *structs.Job, id string) { j.TaskGroups[0].Name = id }},
			{"task name", func(j *structs.Job, id string) { j.TaskGroups[0].Tasks[0].Name = id }},
			{"volume source", func(j *structs.Job, id string) {
				j.TaskGroups[0].Volumes = map[string]*structs.VolumeRequest{"data": {Type: "csi", Source: id}}
			}},
			{"plugin ID", func(j *structs.Job, id string) {
				j.TaskGroups[0].Tasks[0].CSIPluginConfig = &structs.TaskCSIPluginConfig{ID: id, Type: structs.CSIPluginTypeNode}
			}},
		} {
			t.Run(tc.name+"/"+field.kind, func(t *testing.T) {
				job := serviceJob("web", 1)
				field.edit(job, tc.id)
				var resp structs.JobRegisterResponse
				err := s.RPC("Job.Register", &structs.JobRegisterRequest{Job: job}, &resp)
				must.ErrorIs(t, err, structs.ErrInvalidRequest)
				must.StrContains(t, err.Error(), field.kind+" "+tc.want)
			})
		}
	}
	mustNothingWritten(t, s, before)
}

// Node register refuses a node whose ID, name or reported plugin IDs
// could not name a directory: client-reported plugin IDs become the
// cluster's plugin IDs, which clients turn into socket and staging paths.
func TestNode_RegisterRefusesHostileIDs(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	before := latestIndex(t, s)
	for _, tc := range hostileIDs {
		for _, field := range []struct {
			kind string
			edit func(n *structs.Node, id string)
		}{
			{"node ID", func(n *structs.Node, id string) { n.ID = id }},
			{"node name", func(n *structs.Node, id string) { n.Name = id }},
			{"plugin ID", func(n *structs.Node, id string) {
				n.CSINodePlugins = map[string]*structs.CSIInfo{id: {PluginID: id, Healthy: true}}
			}},
			{"plugin ID", func(n *structs.Node, id string) {
				n.CSIControllerPlugins = map[string]*structs.CSIInfo{id: {PluginID: id, Healthy: true}}
			}},
		} {
			t.Run(tc.name+"/"+field.kind, func(t *testing.T) {
				n := csiNode("n1")
				field.edit(n, tc.id)
				var resp structs.NodeUpdateResponse
				err := s.RPC("Node.Register", &structs.NodeRegisterRequest{Node: n}, &resp)
				must.ErrorIs(t, err, structs.ErrInvalidRequest)
				must.StrContains(t, err.Error(), field.kind+" "+tc.want)
			})
		}
	}
	mustNothingWritten(t, s, before)
}
