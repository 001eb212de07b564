package nomad

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"net/rpc"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/go-memdb"
	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// requireNothingWritten checks that the Raft index has not moved past
// before and that no job named id exists.
func requireNothingWritten(t *testing.T, s *Server, before uint64, id string) {
	t.Helper()
	after, err := s.State().LatestIndex()
	must.NoError(t, err)
	must.Eq(t, before, after, must.Sprint("a refused request wrote to Raft"))
	job, err := s.State().JobByID(nil, structs.DefaultNamespace, id)
	must.NoError(t, err)
	must.Nil(t, job)
}

// A job over the limits is refused by Job.Register itself, whoever calls
// it, naming the limit, and nothing reaches Raft.
func TestJobRegister_Limits(t *testing.T) {
	s := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.JobLimits.GroupMaxCount = 50
		c.JobLimits.MaxAllocs = 60
		c.JobLimits.MaxGroups = 3
		c.JobLimits.MaxTasks = 4
	})
	waitForLeaderDuties(t, s)

	group := func(name string, count, tasks int) *structs.TaskGroup {
		tg := &structs.TaskGroup{Name: name, Count: count}
		for i := 0; i < tasks; i++ {
			tg.Tasks = append(tg.Tasks, &structs.Task{Name: string(rune('a' + i)), Driver: "raw_exec",
				Config: map[string]any{"command": "/bin/true"}})
		}
		return tg
	}
	cases := []struct {
		name   string
		groups []*structs.TaskGroup
		want   string
	}{
		{"count 2^62 in an unknown datacenter", []*structs.TaskGroup{group("g", 1<<62, 1)}, "count 4611686018427387904 is more than group_max_count = 50"},
		{"count 2^63-1", []*structs.TaskGroup{group("g", math.MaxInt64, 1)}, "group_max_count = 50"},
		{"allocations", []*structs.TaskGroup{group("g", 40, 1), group("h", 40, 1)}, "more than job_max_allocs = 60"},
		{"groups", []*structs.TaskGroup{group("g", 1, 1), group("h", 1, 1), group("i", 1, 1), group("j", 1, 1)}, "4 task groups, more than job_max_groups = 3"},
		{"tasks", []*structs.TaskGroup{group("g", 1, 3), group("h", 1, 2)}, "more than job_max_tasks = 4"},
		{"raw_exec without command", []*structs.TaskGroup{{Name: "g", Count: 1, Tasks: []*structs.Task{{Name: "t", Driver: "raw_exec"}}}},
			`task "t": bad driver config: raw_exec: option "command" must be a non-empty string`},
		{"null group", []*structs.TaskGroup{nil}, "task group 0 is null"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := latestIndex(t, s)
			job := &structs.Job{ID: "big", Datacenters: []string{"nowhere"}, TaskGroups: tc.groups}
			var resp structs.JobRegisterResponse
			err := s.RPC("Job.Register", &structs.JobRegisterRequest{Job: job}, &resp)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.StrContains(t, err.Error(), tc.want)
			requireNothingWritten(t, s, before, "big")
		})
	}

	// At the limits the job is accepted.
	registerJob(t, s, &structs.Job{ID: "ok", Datacenters: []string{"nowhere"},
		TaskGroups: []*structs.TaskGroup{group("g", 50, 2), group("h", 10, 2)}})
}

// jobRegisterFrame is a Job.Register request of n empty task groups, as
// one msgpack RPC frame.
func jobRegisterFrame(t *testing.T, n int) []byte {
	header := msgpackBytes(t, &rpc.Request{ServiceMethod: "Job.Register", Seq: 1})
	var count [4]byte
	binary.BigEndian.PutUint32(count[:], uint32(n))
	return concatBytes(header,
		[]byte{0x81, 0xa3}, []byte("Job"),
		[]byte{0x82, 0xa2}, []byte("ID"), []byte{0xa3}, []byte("big"),
		[]byte{0xaa}, []byte("TaskGroups"), []byte{0xdd}, count[:],
		bytes.Repeat([]byte{0x80}, n))
}

// One 4 MB Job.Register frame of four million empty task groups once took
// 2.3 GB and answered with a 104 MB error. It is now refused after the
// first RPCMaxFrameContainers of them, having allocated little more than
// the frame, and the server goes on serving.
func TestRPC_JobRegisterManyGroupsBounded(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	before := latestIndex(t, s)

	n := s.config.RPCMaxFrameBytes - 64
	frame := jobRegisterFrame(t, n)
	must.LessEq(t, s.config.RPCMaxFrameBytes, len(frame))

	t.Run("the whole frame", func(t *testing.T) {
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		conn := rawConn(t, s)
		// The server stops reading when it refuses the frame; the rest
		// of the write may fail.
		go func() { _, _ = conn.Write(append([]byte{structs.RPCNomad}, frame...)) }()
		requireConnClosed(t, conn)
		runtime.ReadMemStats(&m1)
		alloc := m1.TotalAlloc - m0.TotalAlloc
		t.Logf("%d empty groups in a %d-byte frame: %d bytes allocated", n, len(frame), alloc)
		must.Less(t, uint64(64<<20), alloc)
		requireServesRPC(t, s)
		requireNothingWritten(t, s, before, "big")
	})

	t.Run("the refusal", func(t *testing.T) {
		// Just past the limit, so that the server reads all that is sent
		// and its reply is not lost to a reset.
		part := frame[:len(frame)-n+s.config.RPCMaxFrameContainers+1]
		conn := rawConn(t, s, append([]byte{structs.RPCNomad}, part...)...)
		must.NoError(t, conn.SetReadDeadline(time.Now().Add(closeWait)))
		dec := codec.NewDecoder(conn, structs.MsgpackHandle)
		var resp rpc.Response
		must.NoError(t, dec.Decode(&resp))
		t.Logf("a %d-byte error: %s", len(resp.Error), resp.Error)
		must.ErrorIs(t, structs.FromRPCError(rpc.ServerError(resp.Error)), structs.ErrInvalidRequest)
		must.StrContains(t, resp.Error, "more than 131072 maps and arrays")
		must.Less(t, 1024, len(resp.Error))
		requireConnClosed(t, conn)
		requireNothingWritten(t, s, before, "big")
	})
}

// The same job as a decoded request, as a follower would forward it, is
// refused by the limits before validation walks it: a one-line error.
func TestJobRegister_ManyGroupsShortError(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	before := latestIndex(t, s)
	job := &structs.Job{ID: "big"}
	for i := 0; i < 300_000; i++ {
		job.TaskGroups = append(job.TaskGroups, &structs.TaskGroup{})
	}
	var resp structs.JobRegisterResponse
	err := s.RPC("Job.Register", &structs.JobRegisterRequest{Job: job}, &resp)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.Eq(t, "invalid request: job exceeds limits: 300000 task groups, more than job_max_groups = 100", err.Error())
	requireNothingWritten(t, s, before, "big")
}

// A job stored before the limits existed (or were lowered) comes back
// from Raft with its evaluation on every restart. The scheduler refuses
// it, failing the evaluation, instead of trying to place 2^62
// allocations.
func TestScheduler_RefusesJobOverLimits(t *testing.T) {
	s := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, s)
	registerNode(t, s, workNode("n1"))

	job := serviceJob("huge", 1)
	job.Canonicalize()
	job.TaskGroups[0].Count = 1 << 62
	eval := s.evalForJob(job, structs.EvalTriggerJobRegister, "")
	// Straight to Raft, as an old server would have written it.
	_, _, err := s.raftApply(structs.JobRegisterRequestType, &structs.JobRegisterRequest{Job: job, Eval: eval})
	must.NoError(t, err)

	var m0 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	got := waitEvalTerminal(t, s, eval.ID)
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	must.Eq(t, structs.EvalStatusFailed, got.Status)
	must.StrContains(t, got.StatusDescription, "group_max_count = 10000")
	allocs, err := s.State().AllocsByJob(nil, structs.DefaultNamespace, "huge")
	must.NoError(t, err)
	must.SliceEmpty(t, allocs)
	t.Logf("evaluation failed: %s; %d bytes allocated meanwhile", got.StatusDescription, m1.TotalAlloc-m0.TotalAlloc)
	must.Less(t, uint64(64<<20), m1.TotalAlloc-m0.TotalAlloc)
}

// waitEvalTerminal waits until the evaluation is complete, failed or
// canceled, woken by the state store when the evaluation changes.
func waitEvalTerminal(t *testing.T, s *Server, id string) *structs.Evaluation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		ws := memdb.NewWatchSet()
		e, err := s.State().EvalByID(ws, id)
		must.NoError(t, err)
		if e != nil && e.TerminalStatus() {
			return e
		}
		if err := ws.WatchCtx(ctx); err != nil {
			t.Fatalf("evaluation %s not terminal: %+v", id, e)
		}
	}
}
