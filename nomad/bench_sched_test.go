package nomad

import (
	"fmt"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// benchWorkNode is a benchmark node that can run raw_exec tasks.
func benchWorkNode(name string) *structs.Node {
	n := benchNode(name)
	n.Attributes["cpu.numcores"] = "64"
	n.Attributes["memory.totalbytes"] = fmt.Sprint(int64(256) << 30)
	n.Drivers = map[string]*structs.DriverInfo{"raw_exec": {Detected: true, Healthy: true}}
	return n
}

func benchJob(id string, count int) *structs.Job {
	return &structs.Job{
		ID: id, Type: structs.JobTypeService, Datacenters: []string{"dc1"},
		TaskGroups: []*structs.TaskGroup{{
			Name: "g", Count: count,
			Tasks: []*structs.Task{{Name: "t", Driver: "raw_exec",
				Config:    map[string]any{"command": "/bin/true"},
				Resources: &structs.Resources{CPU: 100, MemoryMB: 64}}},
		}},
	}
}

// waitEvalDone waits for an evaluation to reach a terminal status.
func waitEvalDone(tb testing.TB, s *Server, id string) *structs.Evaluation {
	tb.Helper()
	var ev *structs.Evaluation
	must.Wait(tb, wait.InitialSuccess(wait.ErrorFunc(func() error {
		var err error
		ev, err = s.State().EvalByID(nil, id)
		if err != nil {
			return err
		}
		if ev == nil || !ev.TerminalStatus() {
			return fmt.Errorf("eval %s not finished", id)
		}
		return nil
	}), wait.Timeout(2*time.Minute), wait.Gap(time.Millisecond)))
	return ev
}

// BenchmarkSchedule_Count1000On100Nodes registers a service job of count
// 1,000 on a 3-server on-disk cluster with 100 registered nodes and
// measures from the register call to the evaluation being complete with
// every allocation committed: scheduling, the apply-time re-check and the
// Raft commit of the plan.
func BenchmarkSchedule_Count1000On100Nodes(b *testing.B) {
	_, leader := benchCluster(b, 3)
	for i := range 100 {
		must.NoError(b, registerOp(leader, fmt.Sprintf("node-%03d", i)))
	}
	// registerOp registers plain nodes; give them raw_exec and room.
	nodes, err := leader.State().Nodes(nil)
	must.NoError(b, err)
	for _, n := range nodes {
		w := benchWorkNode(n.Name)
		w.ID, w.SecretID = n.ID, n.SecretID
		var resp structs.NodeUpdateResponse
		must.NoError(b, leader.RPC("Node.Register", &structs.NodeRegisterRequest{Node: w}, &resp))
	}
	raftRate := raftBaseline(b, leader)
	placed := 0
	round := 0
	for b.Loop() {
		id := fmt.Sprintf("big-%d", round)
		round++
		var resp structs.JobRegisterResponse
		must.NoError(b, leader.RPC("Job.Register", &structs.JobRegisterRequest{Job: benchJob(id, 1000)}, &resp))
		ev := waitEvalDone(b, leader, resp.EvalID)
		must.Eq(b, structs.EvalStatusComplete, ev.Status, must.Sprintf("eval %s: %s", ev.ID, ev.StatusDescription))
		allocs, err := leader.State().AllocsByJob(nil, structs.DefaultNamespace, id)
		must.NoError(b, err)
		must.Len(b, 1000, allocs)
		placed += len(allocs)
	}
	rate := float64(placed) / b.Elapsed().Seconds()
	b.ReportMetric(rate, "placements/s")
	reportRaftRatio(b, rate, raftRate, "placements")
}

// BenchmarkSchedule_EvalLatency registers small jobs one after another and
// measures each from the register call to its evaluation completing.
func BenchmarkSchedule_EvalLatency(b *testing.B) {
	_, leader := benchCluster(b, 3)
	for i := range 10 {
		w := benchWorkNode(fmt.Sprintf("node-%d", i))
		var resp structs.NodeUpdateResponse
		must.NoError(b, leader.RPC("Node.Register", &structs.NodeRegisterRequest{Node: w}, &resp))
	}
	raftRate := raftBaseline(b, leader)
	lat := &latencies{}
	round := 0
	for b.Loop() {
		for i := range 200 {
			start := time.Now()
			var resp structs.JobRegisterResponse
			must.NoError(b, leader.RPC("Job.Register", &structs.JobRegisterRequest{Job: benchJob(fmt.Sprintf("small-%d-%d", round, i), 2)}, &resp))
			ev := waitEvalDone(b, leader, resp.EvalID)
			must.Eq(b, structs.EvalStatusComplete, ev.Status)
			lat.add(time.Since(start))
		}
		round++
	}
	reportRaftRatio(b, lat.report(b, "evals/s"), raftRate, "evals")
}
