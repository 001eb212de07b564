package nomad

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// csiNode is a work node that runs the hostpath plugin as a monolith.
func csiNode(name string) *structs.Node {
	n := workNode(name)
	info := &structs.CSIInfo{PluginID: "hostpath", Healthy: true, Provider: "hostpath.csi.roam.dev", RequiresControllerPlugin: true}
	n.CSIControllerPlugins = map[string]*structs.CSIInfo{"hostpath": info}
	n.CSINodePlugins = map[string]*structs.CSIInfo{"hostpath": {PluginID: "hostpath", Healthy: true,
		NodeInfo: &structs.CSINodeInfo{ID: name, MaxVolumes: 16, RequiresNodeStageVolume: true}}}
	return n
}

func testVolume(id string) *structs.CSIVolume {
	return &structs.CSIVolume{
		ID: id, ExternalID: "ext-" + id, PluginID: "hostpath",
		RequestedCapabilities: []*structs.CSIVolumeCapability{{
			AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
		}},
		Secrets: map[string]string{"token": "s3cret"},
	}
}

func TestCSIVolume_RegisterGetList(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	before, err := s.State().LatestIndex()
	must.NoError(t, err)

	// Unknown plugin, and bad capabilities: refused, nothing written.
	var rresp structs.CSIVolumeRegisterResponse
	err = s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{testVolume("v1")}}, &rresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), `unknown plugin "hostpath"`)
	after, err := s.State().LatestIndex()
	must.NoError(t, err)
	must.Eq(t, before, after)

	registerNodeRetry(t, s, csiNode("n1"))
	var plugins structs.CSIPluginListResponse
	must.NoError(t, s.RPC("CSIPlugin.List", &structs.CSIPluginListRequest{}, &plugins))
	must.Len(t, 1, plugins.Plugins)
	must.Eq(t, 1, plugins.Plugins[0].ControllersHealthy)
	must.Eq(t, 1, plugins.Plugins[0].NodesHealthy)

	bad := testVolume("v2")
	bad.RequestedCapabilities[0].AccessMode = "everyone-writes"
	err = s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{testVolume("v1"), bad}}, &rresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "everyone-writes")
	var get structs.CSIVolumeGetResponse
	must.NoError(t, s.RPC("CSIVolume.Get", &structs.CSIVolumeGetRequest{ID: "v1"}, &get))
	must.Nil(t, get.Volume, must.Sprint("one bad volume fails the whole request"))

	must.NoError(t, s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{testVolume("v1")}}, &rresp))
	must.NoError(t, s.RPC("CSIVolume.Get", &structs.CSIVolumeGetRequest{ID: "v1"}, &get))
	must.NotNil(t, get.Volume)
	must.Nil(t, get.Volume.Secrets, must.Sprint("secrets are never returned"))
	stored, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "v1")
	must.NoError(t, err)
	must.Eq(t, "s3cret", stored.Secrets["token"])

	var list structs.CSIVolumeListResponse
	must.NoError(t, s.RPC("CSIVolume.List", &structs.CSIVolumeListRequest{PluginID: "hostpath"}, &list))
	must.Len(t, 1, list.Volumes)
	must.True(t, list.Volumes[0].Schedulable)
	must.True(t, list.Volumes[0].ControllerRequired)
}

func TestCSIVolume_DeregisterClaimed(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	n1 := csiNode("n1")
	registerNodeRetry(t, s, n1)
	var rresp structs.CSIVolumeRegisterResponse
	must.NoError(t, s.RPC("CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{testVolume("v1")}}, &rresp))
	registerJob(t, s, serviceJob("web", 1))
	alloc := waitAllocs(t, s, "web", countIs(1))[0]

	claim := &structs.CSIVolumeClaim{AllocationID: alloc.ID, NodeID: n1.ID, Mode: structs.CSIVolumeClaimWrite,
		AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
		State: structs.CSIVolumeClaimStateTaken}
	_, _, err := s.raftApply(structs.CSIVolumeClaimRequestType, &structs.CSIVolumeClaimUpdateRequest{
		Namespace: structs.DefaultNamespace, VolumeID: "v1", Claim: claim})
	must.NoError(t, err)

	var dresp structs.CSIVolumeDeregisterResponse
	err = s.RPC("CSIVolume.Deregister", &structs.CSIVolumeDeregisterRequest{VolumeIDs: []string{"v1"}}, &dresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "has 1 claim")
	err = s.RPC("CSIVolume.Deregister", &structs.CSIVolumeDeregisterRequest{VolumeIDs: []string{"v1"}, Force: true}, &dresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "is still pending on node")
	must.ErrorIs(t, s.RPC("CSIVolume.Deregister", &structs.CSIVolumeDeregisterRequest{VolumeIDs: []string{"nope"}}, &dresp), structs.ErrNotFound)
	v, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "v1")
	must.NoError(t, err)
	must.NotNil(t, v)

	// Stopping the job is not enough: the task may still be inside its
	// kill timeout. Force refuses until the client reports it done.
	var jresp structs.JobDeregisterResponse
	must.NoError(t, s.RPC("Job.Deregister", &structs.JobDeregisterRequest{JobID: "web"}, &jresp))
	waitAllocs(t, s, "web", countIs(0))
	err = s.RPC("CSIVolume.Deregister", &structs.CSIVolumeDeregisterRequest{VolumeIDs: []string{"v1"}, Force: true}, &dresp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "(desired stop)")
	v, err = s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "v1")
	must.NoError(t, err)
	must.NotNil(t, v)

	done := alloc.Copy()
	done.ClientStatus = structs.AllocClientStatusComplete
	_, _, err = s.raftApply(structs.AllocClientUpdateRequestType, &structs.AllocUpdateRequest{Alloc: []*structs.Allocation{done}})
	must.NoError(t, err)
	must.NoError(t, s.RPC("CSIVolume.Deregister", &structs.CSIVolumeDeregisterRequest{VolumeIDs: []string{"v1"}, Force: true}, &dresp))
	v, err = s.State().CSIVolumeByID(nil, structs.DefaultNamespace, "v1")
	must.NoError(t, err)
	must.Nil(t, v)
}
