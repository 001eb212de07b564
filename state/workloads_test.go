package state

import (
	"testing"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func testJob(id string) *structs.Job {
	return &structs.Job{
		ID: id, Name: id, Namespace: structs.DefaultNamespace, Type: structs.JobTypeService,
		Priority:   50,
		TaskGroups: []*structs.TaskGroup{{Name: "g", Count: 1, Tasks: []*structs.Task{{Name: "t", Driver: "raw_exec"}}}},
	}
}

func TestStateStore_Jobs(t *testing.T) {
	s, err := NewStateStore()
	must.NoError(t, err)

	must.NoError(t, s.UpsertJob(10, testJob("web")))
	must.NoError(t, s.UpsertJob(11, testJob("db")))
	got, err := s.JobByID(nil, structs.DefaultNamespace, "web")
	must.NoError(t, err)
	must.Eq(t, uint64(10), got.CreateIndex)
	must.Eq(t, uint64(0), got.Version)
	must.Eq(t, structs.JobStatusPending, got.Status)

	ws := memdb.NewWatchSet()
	_, err = s.JobByID(ws, structs.DefaultNamespace, "web")
	must.NoError(t, err)
	must.NoError(t, s.UpsertJob(12, testJob("web")))
	must.False(t, ws.Watch(nil), must.Sprint("watch fires on update"))
	got, err = s.JobByID(nil, structs.DefaultNamespace, "web")
	must.NoError(t, err)
	must.Eq(t, uint64(10), got.CreateIndex)
	must.Eq(t, uint64(12), got.ModifyIndex)
	must.Eq(t, uint64(1), got.Version)

	jobs, err := s.Jobs(nil, structs.DefaultNamespace, "")
	must.NoError(t, err)
	must.Len(t, 2, jobs)
	must.Eq(t, "db", jobs[0].ID)

	must.ErrorIs(t, s.DeleteJob(13, structs.DefaultNamespace, "nope"), structs.ErrNotFound)
	must.NoError(t, s.DeleteJob(13, structs.DefaultNamespace, "db"))
	idx, err := s.Index(TableJobs)
	must.NoError(t, err)
	must.Eq(t, uint64(13), idx)
}

func TestStateStore_Allocs(t *testing.T) {
	s, err := NewStateStore()
	must.NoError(t, err)
	job := testJob("web")
	a1 := &structs.Allocation{ID: "a1", Namespace: structs.DefaultNamespace, JobID: "web", Job: job, NodeID: "n1", EvalID: "e1",
		DesiredStatus: structs.AllocDesiredStatusRun, ClientStatus: structs.AllocClientStatusPending}
	a2 := &structs.Allocation{ID: "a2", Namespace: structs.DefaultNamespace, JobID: "web", Job: job, NodeID: "n2", EvalID: "e1",
		DesiredStatus: structs.AllocDesiredStatusRun, ClientStatus: structs.AllocClientStatusPending}
	must.NoError(t, s.UpsertAllocs(5, []*structs.Allocation{a2, a1}))

	byJob, err := s.AllocsByJob(nil, structs.DefaultNamespace, "web")
	must.NoError(t, err)
	must.Len(t, 2, byJob)
	must.Eq(t, "a1", byJob[0].ID)
	byNode, err := s.AllocsByNode(nil, "n2")
	must.NoError(t, err)
	must.Len(t, 1, byNode)

	// The client reports running; a later server-side update without a
	// client status keeps it.
	must.NoError(t, s.UpdateAllocsFromClient(6, []*structs.Allocation{{ID: "a1", ClientStatus: structs.AllocClientStatusRunning}}))
	stop := a1.Copy()
	stop.DesiredStatus = structs.AllocDesiredStatusStop
	stop.ClientStatus = ""
	must.NoError(t, s.UpsertAllocs(7, []*structs.Allocation{stop}))
	got, err := s.AllocByID(nil, "a1")
	must.NoError(t, err)
	must.Eq(t, structs.AllocClientStatusRunning, got.ClientStatus)
	must.Eq(t, structs.AllocDesiredStatusStop, got.DesiredStatus)
	must.Eq(t, uint64(5), got.CreateIndex)
	must.Eq(t, uint64(7), got.ModifyIndex)

	// An update for an unknown allocation changes nothing.
	must.ErrorIs(t, s.UpdateAllocsFromClient(8, []*structs.Allocation{
		{ID: "a2", ClientStatus: structs.AllocClientStatusRunning},
		{ID: "missing", ClientStatus: structs.AllocClientStatusRunning},
	}), structs.ErrNotFound)
	got, err = s.AllocByID(nil, "a2")
	must.NoError(t, err)
	must.Eq(t, structs.AllocClientStatusPending, got.ClientStatus)
	idx, err := s.Index(TableAllocs)
	must.NoError(t, err)
	must.Eq(t, uint64(7), idx)
}

func TestStateStore_Evals(t *testing.T) {
	s, err := NewStateStore()
	must.NoError(t, err)
	e := &structs.Evaluation{ID: "e1", Namespace: structs.DefaultNamespace, JobID: "web", Status: structs.EvalStatusPending}
	must.NoError(t, s.UpsertEvals(3, []*structs.Evaluation{e}))
	done := e.Copy()
	done.Status = structs.EvalStatusComplete
	must.NoError(t, s.UpsertEvals(4, []*structs.Evaluation{done}))
	got, err := s.EvalByID(nil, "e1")
	must.NoError(t, err)
	must.Eq(t, uint64(3), got.CreateIndex)
	must.Eq(t, structs.EvalStatusComplete, got.Status)
	byJob, err := s.EvalsByJob(nil, structs.DefaultNamespace, "web")
	must.NoError(t, err)
	must.Len(t, 1, byJob)
	// The stored copy is not the caller's value.
	e.Status = "mutated"
	got, err = s.EvalByID(nil, "e1")
	must.NoError(t, err)
	must.Eq(t, structs.EvalStatusComplete, got.Status)
}
