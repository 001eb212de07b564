package state

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// TestStateStore_LastDrain: a drain is recorded as draining, an operator
// stopping it makes it canceled, the drainer ending it complete; a node
// re-registering keeps the record; a stop without a drain changes none.
func TestStateStore_LastDrain(t *testing.T) {
	s, err := NewStateStore()
	must.NoError(t, err)
	n := mockNode("n1")
	must.NoError(t, s.UpsertNode(1, n))
	get := func() *structs.Node {
		t.Helper()
		got, err := s.NodeByID(nil, n.ID)
		must.NoError(t, err)
		return got
	}
	must.Nil(t, get().LastDrain)

	start := time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)
	strategy := &structs.DrainStrategy{DrainSpec: structs.DrainSpec{Deadline: time.Hour}, StartedAt: start}
	must.NoError(t, s.UpdateNodeDrain(2, n.ID, strategy, false, false, start.Unix(), nil))
	ld := get().LastDrain
	must.NotNil(t, ld)
	must.EqOp(t, structs.DrainStatusDraining, ld.Status)
	must.Eq(t, start, ld.StartedAt)

	must.NoError(t, s.UpsertNode(3, n))
	must.NotNil(t, get().LastDrain, must.Sprint("a re-registration keeps it"))
	must.NotNil(t, get().DrainStrategy, must.Sprint("a re-registration keeps the drain"))
	must.EqOp(t, structs.DrainStatusDraining, get().LastDrain.Status)

	must.NoError(t, s.UpdateNodeDrain(4, n.ID, nil, true, false, start.Unix()+60, nil))
	ld = get().LastDrain
	must.EqOp(t, structs.DrainStatusCanceled, ld.Status)
	must.Eq(t, start, ld.StartedAt)
	must.Eq(t, time.Unix(start.Unix()+60, 0).UTC(), ld.UpdatedAt)

	// Stopping again, with no drain running, changes nothing.
	must.NoError(t, s.UpdateNodeDrain(5, n.ID, nil, true, true, start.Unix()+120, nil))
	must.EqOp(t, structs.DrainStatusCanceled, get().LastDrain.Status)

	again := start.Add(time.Hour)
	strategy = &structs.DrainStrategy{StartedAt: again}
	must.NoError(t, s.UpdateNodeDrain(6, n.ID, strategy, false, false, again.Unix(), nil))
	must.NoError(t, s.UpdateNodeDrain(7, n.ID, nil, false, true, again.Unix(), nil))
	ld = get().LastDrain
	must.EqOp(t, structs.DrainStatusComplete, ld.Status)
	must.Eq(t, again, ld.StartedAt)
	must.False(t, ld.UpdatedAt.Before(ld.StartedAt), must.Sprint("whole-second end times never precede the start"))
}
