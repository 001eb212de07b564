package agent

import (
	"fmt"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// nomadBatchJob is a one-task raw_exec batch job built with Nomad's
// client and canonicalized there, as Nomad's CLI sends it.
func nomadBatchJob(id string) *nomadapi.Job {
	job := nomadapi.NewBatchJob(id, id, "global", 50)
	job.Datacenters = []string{"dc1"}
	tg := nomadapi.NewTaskGroup("g", 1)
	cpu, mem := 100, 32
	task := nomadapi.NewTask("t", "raw_exec").
		SetConfig("command", "/bin/sh").
		SetConfig("args", []string{"-c", "echo hi"}).
		Require(&nomadapi.Resources{CPU: &cpu, MemoryMB: &mem})
	tg.AddTask(task)
	job.AddTaskGroup(tg)
	job.Canonicalize()
	return job
}

func TestNomadAPI_JobLifecycle(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	c := newNomadClient(t, a)

	reg, wm, err := c.Jobs().Register(nomadBatchJob("nomad-batch"), nil)
	must.NoError(t, err)
	must.NotEq(t, "", reg.EvalID)
	must.Positive(t, wm.LastIndex)

	var eval *nomadapi.Evaluation
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool {
			eval, _, err = c.Evaluations().Info(reg.EvalID, nil)
			must.NoError(t, err)
			return eval.Status == structs.EvalStatusComplete
		}),
		wait.Timeout(30*time.Second),
		wait.Gap(50*time.Millisecond),
	))
	must.EqOp(t, "nomad-batch", eval.JobID)

	job, qm, err := c.Jobs().Info("nomad-batch", nil)
	must.NoError(t, err)
	must.EqOp(t, "batch", *job.Type)
	must.EqOp(t, 1, *job.TaskGroups[0].Count)
	must.Positive(t, qm.LastIndex)

	allocs, _, err := c.Jobs().Allocations("nomad-batch", true, nil)
	must.NoError(t, err)
	must.SliceLen(t, 1, allocs)
	must.EqOp(t, a.Client().NodeID(), allocs[0].NodeID)

	list, _, err := c.Allocations().List(nil)
	must.NoError(t, err)
	must.SliceLen(t, 1, list)
	alloc, _, err := c.Allocations().Info(allocs[0].ID, nil)
	must.NoError(t, err)
	must.EqOp(t, "nomad-batch", alloc.JobID)
	must.EqOp(t, "g", alloc.TaskGroup)
	must.NotNil(t, alloc.Job)

	nodeAllocs, _, err := c.Nodes().Allocations(a.Client().NodeID(), nil)
	must.NoError(t, err)
	must.SliceLen(t, 1, nodeAllocs)

	evalID, _, err := c.Jobs().Deregister("nomad-batch", false, nil)
	must.NoError(t, err)
	must.NotEq(t, "", evalID)
	job, _, err = c.Jobs().Info("nomad-batch", nil)
	must.NoError(t, err)
	must.True(t, *job.Stop)

	_, _, err = c.Jobs().Info("no-such-job", nil)
	must.ErrorContains(t, err, "404")
}

func TestNomadAPI_NodeDrainAndEligibility(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	c := newNomadClient(t, a)
	nodeID := a.Client().NodeID()

	_, err := c.Nodes().ToggleEligibility(nodeID, false, nil)
	must.NoError(t, err)
	node, _, err := c.Nodes().Info(nodeID, nil)
	must.NoError(t, err)
	must.EqOp(t, "ineligible", node.SchedulingEligibility)
	_, err = c.Nodes().ToggleEligibility(nodeID, true, nil)
	must.NoError(t, err)

	resp, err := c.Nodes().UpdateDrain(nodeID, &nomadapi.DrainSpec{Deadline: time.Hour}, false, nil)
	must.NoError(t, err)
	must.Positive(t, resp.NodeModifyIndex)
	node, _, err = c.Nodes().Info(nodeID, nil)
	must.NoError(t, err)
	must.EqOp(t, "ineligible", node.SchedulingEligibility)

	resp, err = c.Nodes().UpdateDrainOpts(nodeID, &nomadapi.DrainOptions{DrainSpec: nil, MarkEligible: true}, nil)
	must.NoError(t, err)
	must.Positive(t, resp.NodeModifyIndex)
	node, _, err = c.Nodes().Info(nodeID, nil)
	must.NoError(t, err)
	must.Nil(t, node.DrainStrategy)
	must.EqOp(t, "eligible", node.SchedulingEligibility)

	_, err = c.Nodes().UpdateDrain("ffffffff-0000-0000-0000-000000000000", &nomadapi.DrainSpec{Deadline: -1}, false, nil)
	must.ErrorContains(t, err, "404")
}

// TestNomadAPI_LastDrain: Nomad's client reads LastDrain from the node
// and its list stub. The dev node has nothing to move, so the drainer
// ends its drain at once, as complete. (draining and canceled are
// checked at the state store: TestStateStore_LastDrain.)
func TestNomadAPI_LastDrain(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	c := newNomadClient(t, a)
	nodeID := a.Client().NodeID()
	node, _, err := c.Nodes().Info(nodeID, nil)
	must.NoError(t, err)
	must.Nil(t, node.LastDrain)

	before := time.Now().Add(-time.Second)
	_, err = c.Nodes().UpdateDrain(nodeID, &nomadapi.DrainSpec{Deadline: time.Hour, IgnoreSystemJobs: true}, false, nil)
	must.NoError(t, err)
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		node, _, err := c.Nodes().Info(nodeID, nil)
		if err != nil {
			return err
		}
		if node.LastDrain == nil || node.LastDrain.Status != nomadapi.DrainStatusComplete {
			return fmt.Errorf("last drain %+v", node.LastDrain)
		}
		return nil
	}), wait.Timeout(30*time.Second), wait.Gap(50*time.Millisecond)))
	node, _, err = c.Nodes().Info(nodeID, nil)
	must.NoError(t, err)
	must.False(t, node.LastDrain.StartedAt.Before(before))
	must.False(t, node.LastDrain.UpdatedAt.Before(node.LastDrain.StartedAt))
	stubs, _, err := c.Nodes().List(nil)
	must.NoError(t, err)
	must.SliceLen(t, 1, stubs)
	must.NotNil(t, stubs[0].LastDrain)
	must.EqOp(t, nomadapi.DrainStatusComplete, stubs[0].LastDrain.Status)
}
