package nomad

import (
	"fmt"
	"testing"
	"time"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// workNode is a ready node that can run raw_exec tasks.
func workNode(name string) *structs.Node {
	n := testNode(name)
	n.Attributes["cpu.numcores"] = "4"
	n.Attributes["memory.totalbytes"] = fmt.Sprint(8 << 30)
	n.Drivers = map[string]*structs.DriverInfo{"raw_exec": {Detected: true, Healthy: true}}
	return n
}

func serviceJob(id string, count int) *structs.Job {
	return &structs.Job{
		ID: id, Type: structs.JobTypeService, Datacenters: []string{"dc1"},
		TaskGroups: []*structs.TaskGroup{{
			Name: "web", Count: count,
			Migrate: &structs.MigrateStrategy{MaxParallel: 1},
			Tasks: []*structs.Task{{Name: "t", Driver: "raw_exec",
				Config: map[string]any{"command": "/bin/sleep", "args": []any{"600"}}}},
		}},
	}
}

func registerJob(t *testing.T, s *Server, job *structs.Job) *structs.JobRegisterResponse {
	t.Helper()
	var resp structs.JobRegisterResponse
	must.NoError(t, s.RPC("Job.Register", &structs.JobRegisterRequest{Job: job}, &resp))
	return &resp
}

// waitAllocs waits until the job's live allocations satisfy ok.
func waitAllocs(t *testing.T, s *Server, jobID string, ok func(live []*structs.Allocation) error) []*structs.Allocation {
	t.Helper()
	var live []*structs.Allocation
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		all, err := s.State().AllocsByJob(nil, structs.DefaultNamespace, jobID)
		if err != nil {
			return err
		}
		live = live[:0]
		for _, a := range all {
			if !a.TerminalStatus() {
				live = append(live, a)
			}
		}
		return ok(live)
	}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))
	return live
}

func countIs(n int) func([]*structs.Allocation) error {
	return func(live []*structs.Allocation) error {
		if len(live) != n {
			return fmt.Errorf("%d live allocations, want %d", len(live), n)
		}
		return nil
	}
}

// reportStatus sends a client's status update for allocs.
func reportStatus(t *testing.T, s *Server, node *structs.Node, status string, allocs ...*structs.Allocation) {
	t.Helper()
	var updates []*structs.Allocation
	for _, a := range allocs {
		updates = append(updates, &structs.Allocation{ID: a.ID, ClientStatus: status})
	}
	var resp structs.GenericResponse
	must.NoError(t, s.RPC("Node.UpdateAlloc", &structs.AllocUpdateRequest{
		Alloc: updates, WriteRequest: structs.WriteRequest{AuthToken: node.SecretID},
	}, &resp))
}

// waitEvalsSettled waits until none of the job's evaluations is pending.
func waitEvalsSettled(t *testing.T, s *Server, jobID string) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		evals, err := s.State().EvalsByJob(nil, structs.DefaultNamespace, jobID)
		if err != nil {
			return err
		}
		for _, e := range evals {
			if e.Status == structs.EvalStatusPending {
				return fmt.Errorf("eval %s pending", e.ID)
			}
		}
		return nil
	}), wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond)))
}

func TestJob_RegisterPlacesAllocations(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	node := workNode("n1")
	registerNodeRetry(t, s, node)

	resp := registerJob(t, s, serviceJob("web", 3))
	must.NotEq(t, "", resp.EvalID)
	live := waitAllocs(t, s, "web", countIs(3))
	names := map[string]bool{}
	for _, a := range live {
		must.Eq(t, node.ID, a.NodeID)
		must.Eq(t, structs.AllocClientStatusPending, a.ClientStatus)
		names[a.Name] = true
	}
	must.MapLen(t, 3, names)

	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		ev, err := s.State().EvalByID(nil, resp.EvalID)
		if err != nil || ev == nil || ev.Status != structs.EvalStatusComplete {
			return fmt.Errorf("eval %v (%v)", ev, err)
		}
		return nil
	}), wait.Timeout(5*time.Second), wait.Gap(20*time.Millisecond)))

	var got structs.SingleJobResponse
	must.NoError(t, s.RPC("Job.GetJob", &structs.JobSpecificRequest{JobID: "web"}, &got))
	must.Eq(t, structs.JobStatusRunning, got.Job.Status)

	// Scale down keeps the lowest indexes.
	registerJob(t, s, serviceJob("web", 1))
	live = waitAllocs(t, s, "web", countIs(1))
	must.Eq(t, "web.web[0]", live[0].Name)
}

func TestJob_RegisterRejectsBadJobs(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	before, err := s.State().LatestIndex()
	must.NoError(t, err)

	bad := serviceJob("bad", -1)
	var resp structs.JobRegisterResponse
	err = s.RPC("Job.Register", &structs.JobRegisterRequest{Job: bad}, &resp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "count -1")
	must.ErrorIs(t, s.RPC("Job.Register", &structs.JobRegisterRequest{}, &resp), structs.ErrInvalidRequest)
	var dresp structs.JobDeregisterResponse
	must.ErrorIs(t, s.RPC("Job.Deregister", &structs.JobDeregisterRequest{JobID: "nope"}, &dresp), structs.ErrNotFound)

	after, err := s.State().LatestIndex()
	must.NoError(t, err)
	must.Eq(t, before, after, must.Sprint("nothing written"))
}

func TestJob_StopStopsAllocations(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	registerNodeRetry(t, s, workNode("n1"))
	registerJob(t, s, serviceJob("web", 2))
	waitAllocs(t, s, "web", countIs(2))

	var resp structs.JobDeregisterResponse
	must.NoError(t, s.RPC("Job.Deregister", &structs.JobDeregisterRequest{JobID: "web"}, &resp))
	waitAllocs(t, s, "web", countIs(0))
	var got structs.SingleJobResponse
	must.NoError(t, s.RPC("Job.GetJob", &structs.JobSpecificRequest{JobID: "web"}, &got))
	must.True(t, got.Job.Stop)

	must.NoError(t, s.RPC("Job.Deregister", &structs.JobDeregisterRequest{JobID: "web", Purge: true}, &resp))
	must.NoError(t, s.RPC("Job.GetJob", &structs.JobSpecificRequest{JobID: "web"}, &got))
	must.Nil(t, got.Job)
}

func TestNode_UpdateAllocAuth(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	n1, n2 := workNode("n1"), workNode("n2")
	registerNodeRetry(t, s, n1)
	registerJob(t, s, serviceJob("web", 1))
	live := waitAllocs(t, s, "web", countIs(1))
	registerNodeRetry(t, s, n2)

	// Another node may not report on n1's allocation; nothing changes.
	var resp structs.GenericResponse
	err := s.RPC("Node.UpdateAlloc", &structs.AllocUpdateRequest{
		Alloc:        []*structs.Allocation{{ID: live[0].ID, ClientStatus: structs.AllocClientStatusRunning}},
		WriteRequest: structs.WriteRequest{AuthToken: n2.SecretID},
	}, &resp)
	must.ErrorIs(t, err, structs.ErrPermissionDenied)
	err = s.RPC("Node.UpdateAlloc", &structs.AllocUpdateRequest{
		Alloc:        []*structs.Allocation{{ID: "no-such-alloc", ClientStatus: structs.AllocClientStatusRunning}},
		WriteRequest: structs.WriteRequest{AuthToken: n1.SecretID},
	}, &resp)
	must.ErrorIs(t, err, structs.ErrNotFound)
	got, err := s.State().AllocByID(nil, live[0].ID)
	must.NoError(t, err)
	must.Eq(t, structs.AllocClientStatusPending, got.ClientStatus)

	reportStatus(t, s, n1, structs.AllocClientStatusRunning, live[0])
	got, err = s.State().AllocByID(nil, live[0].ID)
	must.NoError(t, err)
	must.Eq(t, structs.AllocClientStatusRunning, got.ClientStatus)

	// The node sees its allocation with its job.
	var ca structs.NodeClientAllocsResponse
	must.NoError(t, s.RPC("Node.GetClientAllocs", &structs.NodeSpecificRequest{
		NodeID: n1.ID, QueryOptions: structs.QueryOptions{AuthToken: n1.SecretID},
	}, &ca))
	must.Len(t, 1, ca.Allocs)
	must.NotNil(t, ca.Allocs[0].Job)
	err = s.RPC("Node.GetClientAllocs", &structs.NodeSpecificRequest{
		NodeID: n1.ID, QueryOptions: structs.QueryOptions{AuthToken: n2.SecretID},
	}, &ca)
	must.ErrorIs(t, err, structs.ErrPermissionDenied)
}

func TestNode_DrainMigratesAndEnds(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	n1 := workNode("n1")
	registerNodeRetry(t, s, n1)
	registerJob(t, s, serviceJob("web", 2))
	live := waitAllocs(t, s, "web", countIs(2))
	reportStatus(t, s, n1, structs.AllocClientStatusRunning, live...)
	n2 := workNode("n2")
	registerNodeRetry(t, s, n2)

	var dresp structs.NodeDrainUpdateResponse
	must.NoError(t, s.RPC("Node.UpdateDrain", &structs.NodeUpdateDrainRequest{
		NodeID: n1.ID, DrainStrategy: &structs.DrainStrategy{DrainSpec: structs.DrainSpec{Deadline: time.Minute}},
	}, &dresp))

	// Play the clients: stopped allocs on n1 complete, and only once the
	// server has digested that do replacements on n2 start running. That
	// order once stalled the drain: nothing re-evaluated the job when the
	// replacement came up, so the next migration never started.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		all, err := s.State().AllocsByJob(nil, structs.DefaultNamespace, "web")
		if err != nil {
			return err
		}
		for _, a := range all {
			if a.NodeID == n1.ID && a.DesiredStatus == structs.AllocDesiredStatusStop && !a.ClientTerminalStatus() {
				reportStatus(t, s, n1, structs.AllocClientStatusComplete, a)
			}
		}
		waitEvalsSettled(t, s, "web")
		onN2 := 0
		for _, a := range all {
			if a.NodeID == n2.ID && a.ClientStatus == structs.AllocClientStatusPending {
				reportStatus(t, s, n2, structs.AllocClientStatusRunning, a)
			}
			if a.NodeID == n2.ID && !a.TerminalStatus() {
				onN2++
			}
		}
		node, err := s.State().NodeByID(nil, n1.ID)
		if err != nil {
			return err
		}
		if onN2 != 2 || node.DrainStrategy != nil {
			return fmt.Errorf("%d allocs on n2, drain strategy %v", onN2, node.DrainStrategy)
		}
		return nil
	}), wait.Timeout(15*time.Second), wait.Gap(50*time.Millisecond)))

	node, err := s.State().NodeByID(nil, n1.ID)
	must.NoError(t, err)
	must.Eq(t, structs.NodeSchedulingIneligible, node.SchedulingEligibility)

	var eresp structs.NodeEligibilityUpdateResponse
	must.ErrorIs(t, s.RPC("Node.UpdateEligibility", &structs.NodeUpdateEligibilityRequest{NodeID: "nope", Eligibility: "eligible"}, &eresp), structs.ErrUnknownNode)
	must.ErrorIs(t, s.RPC("Node.UpdateEligibility", &structs.NodeUpdateEligibilityRequest{NodeID: n1.ID, Eligibility: "bogus"}, &eresp), structs.ErrInvalidRequest)
	must.NoError(t, s.RPC("Node.UpdateEligibility", &structs.NodeUpdateEligibilityRequest{NodeID: n1.ID, Eligibility: "eligible"}, &eresp))
	var dr structs.NodeDrainUpdateResponse
	must.ErrorIs(t, s.RPC("Node.UpdateDrain", &structs.NodeUpdateDrainRequest{NodeID: "nope"}, &dr), structs.ErrUnknownNode)
}

func TestNode_DownNodeAllocsReplaced(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	n1 := workNode("n1")
	registerNodeRetry(t, s, n1)
	registerJob(t, s, serviceJob("web", 1))
	first := waitAllocs(t, s, "web", countIs(1))[0]
	n2 := workNode("n2")
	registerNodeRetry(t, s, n2)

	// n1 misses its heartbeat: its allocation is lost and replaced on n2.
	s.heartbeats.clear(n1.ID)
	s.markNodeDown(n1.ID)
	live := waitAllocs(t, s, "web", func(live []*structs.Allocation) error {
		if len(live) != 1 || live[0].NodeID != n2.ID {
			evals, _ := s.State().Evals(nil, "")
			var st []string
			for _, e := range evals {
				st = append(st, e.TriggeredBy+":"+e.Status+":"+e.StatusDescription)
			}
			n, _ := s.State().NodeByID(nil, n1.ID)
			return fmt.Errorf("live allocs %d, want one on n2; n1 %s; evals %v", len(live), n.Status, st)
		}
		return nil
	})
	must.Eq(t, first.Name, live[0].Name)
	must.Eq(t, first.ID, live[0].PreviousAllocation)
	old, err := s.State().AllocByID(nil, first.ID)
	must.NoError(t, err)
	must.Eq(t, structs.AllocClientStatusLost, old.ClientStatus)
}

func TestJob_FailedAllocRescheduled(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	n1, n2 := workNode("n1"), workNode("n2")
	registerNodeRetry(t, s, n1)
	registerNodeRetry(t, s, n2)
	job := serviceJob("flaky", 1)
	job.TaskGroups[0].ReschedulePolicy = &structs.ReschedulePolicy{
		Attempts: 1, Interval: time.Hour, Delay: 50 * time.Millisecond, DelayFunction: structs.DelayFunctionConstant,
	}
	registerJob(t, s, job)
	first := waitAllocs(t, s, "flaky", countIs(1))[0]
	nodes := map[string]*structs.Node{n1.ID: n1, n2.ID: n2}

	// The first failure is replaced after the delay, on the other node.
	reportStatus(t, s, nodes[first.NodeID], structs.AllocClientStatusFailed, first)
	second := waitAllocs(t, s, "flaky", func(live []*structs.Allocation) error {
		for _, a := range live {
			if a.ID != first.ID {
				return nil
			}
		}
		evals, _ := s.State().EvalsByJob(nil, structs.DefaultNamespace, "flaky")
		var st []string
		for _, e := range evals {
			st = append(st, fmt.Sprintf("%s:%s:%s:%v", e.TriggeredBy, e.Status, e.StatusDescription, e.WaitUntil))
		}
		return fmt.Errorf("no replacement yet: %v", st)
	})[0]
	if second.ID == first.ID {
		second = waitAllocs(t, s, "flaky", countIs(1))[0]
	}
	must.Eq(t, first.ID, second.PreviousAllocation)
	must.NotEq(t, first.NodeID, second.NodeID)
	must.Len(t, 1, second.RescheduleTracker.Events)

	// The second failure exhausts the attempts: nothing replaces it.
	reportStatus(t, s, nodes[second.NodeID], structs.AllocClientStatusFailed, second)
	waitEvalsSettled(t, s, "flaky")
	all, err := s.State().AllocsByJob(nil, structs.DefaultNamespace, "flaky")
	must.NoError(t, err)
	must.Len(t, 2, all)
	var got structs.SingleJobResponse
	must.NoError(t, s.RPC("Job.GetJob", &structs.JobSpecificRequest{JobID: "flaky"}, &got))
	must.Eq(t, structs.JobStatusDead, got.Job.Status)
}

// A drain stops a node's system allocations (its CSI plugins among them)
// last: only once every other allocation there is done and no volume claim
// of another allocation names the node, since those claims are released
// through the plugins.
// systemDrainFixture is a server and a node n1 running a system job's
// allocation (sys, standing for a CSI plugin) and a service allocation
// (web) whose claim on vol names n1 and cannot be released (n1 has no real
// client); sys also holds a claim of its own.
func systemDrainFixture(t *testing.T, fn func(*Config)) (s *Server, n1 *structs.Node, sys, web *structs.Allocation, vol *structs.CSIVolume, claim *structs.CSIVolumeClaim) {
	t.Helper()
	s = testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		if fn != nil {
			fn(c)
		}
	})
	waitForLeaderDuties(t, s)
	n1 = workNode("n1")
	n1.CSINodePlugins = map[string]*structs.CSIInfo{"hostpath": {PluginID: "hostpath", Healthy: true,
		NodeInfo: &structs.CSINodeInfo{ID: "n1", MaxVolumes: 8}}}
	registerNodeRetry(t, s, n1)
	plugin := serviceJob("plugin", 1)
	plugin.Type = structs.JobTypeSystem
	plugin.TaskGroups[0].Count = 1
	registerJob(t, s, plugin)
	registerJob(t, s, serviceJob("web", 1))
	sys = waitAllocs(t, s, "plugin", countIs(1))[0]
	web = waitAllocs(t, s, "web", countIs(1))[0]
	reportStatus(t, s, n1, structs.AllocClientStatusRunning, sys, web)

	// The web allocation holds a claim on a volume of the node's plugin.
	vol = testVolume("data")
	vol.Namespace = structs.DefaultNamespace
	_, _, err := s.raftApply(structs.CSIVolumeRegisterRequestType, &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{vol}})
	must.NoError(t, err)
	claim = &structs.CSIVolumeClaim{AllocationID: web.ID, NodeID: n1.ID, ExternalNodeID: "n1",
		Mode: structs.CSIVolumeClaimWrite, AccessMode: structs.CSIAccessModeSingleNodeWriter,
		AttachmentMode: structs.CSIAttachmentModeFilesystem, State: structs.CSIVolumeClaimStateTaken}
	must.NoError(t, s.checkpointClaim(vol.ID, claim))
	// The plugin allocation's own claim (a system job may use volumes too)
	// does not hold it back.
	own := testVolume("own")
	own.Namespace = structs.DefaultNamespace
	_, _, err = s.raftApply(structs.CSIVolumeRegisterRequestType, &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{own}})
	must.NoError(t, err)
	ownClaim := *claim
	ownClaim.AllocationID = sys.ID
	must.NoError(t, s.checkpointClaim(own.ID, &ownClaim))

	return s, n1, sys, web, vol, claim
}

func TestNode_DrainStopsSystemAllocsLast(t *testing.T) {
	s, n1, sys, web, vol, claim := systemDrainFixture(t, nil)

	var dresp structs.NodeDrainUpdateResponse
	must.NoError(t, s.RPC("Node.UpdateDrain", &structs.NodeUpdateDrainRequest{
		NodeID: n1.ID, DrainStrategy: &structs.DrainStrategy{DrainSpec: structs.DrainSpec{Deadline: time.Minute}},
	}, &dresp))

	// The web allocation is told to go; the plugin's is not.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		got, err := s.State().AllocByID(nil, web.ID)
		if err != nil {
			return err
		}
		if got.DesiredStatus != structs.AllocDesiredStatusStop {
			return fmt.Errorf("web alloc desired %s", got.DesiredStatus)
		}
		return nil
	}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))
	webNow, err := s.State().AllocByID(nil, web.ID)
	must.NoError(t, err)
	reportStatus(t, s, n1, structs.AllocClientStatusComplete, webNow)
	waitEvalsSettled(t, s, "web")

	// Web is gone but its claim still names the node (its release needs
	// the node's plugin): a drain pass leaves the plugin alone.
	must.NoError(t, s.drainPass(memdb.NewWatchSet()))
	waitEvalsSettled(t, s, "plugin")
	got, err := s.State().AllocByID(nil, sys.ID)
	must.NoError(t, err)
	must.Eq(t, structs.AllocDesiredStatusRun, got.DesiredStatus, must.Sprint("plugin stopped while a claim still named its node"))
	must.False(t, got.DesiredTransition.ShouldMigrate())

	// Once the claim is released, the plugin goes and the drain ends.
	claim.State = ""
	must.NoError(t, s.checkpointClaim(vol.ID, claim))
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		got, err := s.State().AllocByID(nil, sys.ID)
		if err != nil {
			return err
		}
		if got.DesiredStatus == structs.AllocDesiredStatusStop && !got.ClientTerminalStatus() {
			reportStatus(t, s, n1, structs.AllocClientStatusComplete, got)
		}
		node, err := s.State().NodeByID(nil, n1.ID)
		if err != nil {
			return err
		}
		if got.DesiredStatus != structs.AllocDesiredStatusStop || node.DrainStrategy != nil {
			return fmt.Errorf("plugin alloc desired %s, drain %v", got.DesiredStatus, node.DrainStrategy)
		}
		return nil
	}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))
}

// Past a drain's deadline, a claim that cannot be released holds the
// node's system allocations back for DrainClaimGrace only.
func TestNode_ForcedDrainStopsSystemAllocsAfterClaimGrace(t *testing.T) {
	t.Parallel()
	s, n1, sys, web, _, _ := systemDrainFixture(t, func(c *Config) { c.DrainClaimGrace = 300 * time.Millisecond })
	var dresp structs.NodeDrainUpdateResponse
	must.NoError(t, s.RPC("Node.UpdateDrain", &structs.NodeUpdateDrainRequest{
		NodeID: n1.ID, DrainStrategy: &structs.DrainStrategy{DrainSpec: structs.DrainSpec{Deadline: -1}},
	}, &dresp))
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		got, err := s.State().AllocByID(nil, web.ID)
		if err != nil {
			return err
		}
		if got.DesiredStatus != structs.AllocDesiredStatusStop {
			return fmt.Errorf("web alloc desired %s", got.DesiredStatus)
		}
		if !got.ClientTerminalStatus() {
			reportStatus(t, s, n1, structs.AllocClientStatusComplete, got)
		}
		return nil
	}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))

	// The web claim cannot be released (n1 has no client to detach it), so
	// the plugin stays until the grace is over, then goes.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		got, err := s.State().AllocByID(nil, sys.ID)
		if err != nil {
			return err
		}
		if got.DesiredStatus != structs.AllocDesiredStatusStop {
			return fmt.Errorf("plugin alloc desired %s", got.DesiredStatus)
		}
		return nil
	}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))
	vols, err := nodeClaims(s.State(), nil, n1.ID, map[string]bool{sys.ID: true})
	must.NoError(t, err)
	must.Eq(t, []string{"data"}, vols, must.Sprint("the plugin went although a claim still named the node"))
	node, err := s.State().NodeByID(nil, n1.ID)
	must.NoError(t, err)
	got, err := s.State().AllocByID(nil, sys.ID)
	must.NoError(t, err)
	stoppedAfter := time.Unix(0, got.ModifyTime).Sub(node.DrainStrategy.StartedAt)
	must.True(t, stoppedAfter >= 300*time.Millisecond,
		must.Sprintf("the plugin was stopped %s into the drain, before the claim grace was over", stoppedAfter))
}
