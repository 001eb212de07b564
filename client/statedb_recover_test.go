package client

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

func TestStateDB_DamagedMovedAside(t *testing.T) {
	damages := map[string]func(b []byte) []byte{
		"garbage":   func([]byte) []byte { return []byte("this is not a bolt database at all") },
		"truncated": func(b []byte) []byte { return b[:len(b)/3] },
		"flipped page": func(b []byte) []byte {
			for i := 8192; i < len(b) && i < 8192+4096; i++ {
				b[i] ^= 0xff
			}
			return b
		},
	}
	for name, damage := range damages {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			db, err := openStateDB(dir)
			must.NoError(t, err)
			for range 200 {
				must.NoError(t, db.putAlloc(testAlloc("n", structs.JobTypeService, nil)))
			}
			must.NoError(t, db.close())
			path := filepath.Join(dir, "client", "state.db")
			b, err := os.ReadFile(path)
			must.NoError(t, err)
			must.NoError(t, os.WriteFile(path, damage(b), 0o600))

			db, movedTo, dmg, err := openStateDBRecovering(dir)
			must.NoError(t, err)
			t.Cleanup(func() { db.close() })
			must.Error(t, dmg)
			must.ErrorIs(t, dmg, errStateDBDamaged)
			_, err = os.Stat(movedTo)
			must.NoError(t, err, must.Sprint("the damaged db was not kept"))
			allocs, errs := db.loadAllocs()
			must.SliceEmpty(t, errs)
			must.SliceEmpty(t, allocs)
			must.NoError(t, db.putAlloc(testAlloc("n", structs.JobTypeService, nil)))
		})
	}

	t.Run("healthy db stays", func(t *testing.T) {
		dir := t.TempDir()
		db, err := openStateDB(dir)
		must.NoError(t, err)
		must.NoError(t, db.putAlloc(testAlloc("n", structs.JobTypeService, nil)))
		must.NoError(t, db.close())
		db, movedTo, dmg, err := openStateDBRecovering(dir)
		must.NoError(t, err)
		t.Cleanup(func() { db.close() })
		must.NoError(t, dmg)
		must.EqOp(t, "", movedTo)
		allocs, _ := db.loadAllocs()
		must.Len(t, 1, allocs)
	})
}

// After a state DB reset, an allocation the servers already list as
// running here is neither started again (a second copy of its tasks) nor
// reported (which could release its claims); one placed afterwards runs.
func TestAllocManager_StateResetHoldsKnownAllocs(t *testing.T) {
	srv := newFakeServer("node-1")
	before := testAlloc("node-1", structs.JobTypeService, noRestarts, shTask("web", "exec sleep 600"))
	before.ClientStatus = structs.AllocClientStatusRunning
	srv.upsert(before)

	tm := startTestManagerWith(t, srv, t.TempDir(), nil, func(c *allocManagerConfig) { c.StateReset = true })
	// A second query is sent only once the first answer was reconciled.
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.queries >= 2
	}), wait.Timeout(10*time.Second), wait.Gap(5*time.Millisecond)))
	after := testAlloc("node-1", structs.JobTypeService, noRestarts, shTask("web", "exec sleep 600"))
	srv.upsert(after)
	waitStatus(t, srv, after.ID, structs.AllocClientStatusRunning)
	t.Cleanup(func() { srv.stop(after.ID); waitStatus(t, srv, after.ID, structs.AllocClientStatusComplete) })

	must.Nil(t, tm.getRunner(before.ID), must.Sprint("a held allocation was started again"))
	got := srv.alloc(before.ID)
	must.EqOp(t, structs.AllocClientStatusRunning, got.ClientStatus)
	must.MapEmpty(t, got.TaskStates, must.Sprint("a held allocation was reported"))
}
