package client

import (
	"testing"

	"github.com/google/uuid"
	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
)

// The client's own stop is read back with its allocation, and recording it
// for an allocation already forgotten brings back no half record (a bucket
// without an allocation, which loadAllocs would report as damage).
func TestStateDB_LocalStop(t *testing.T) {
	dataDir := t.TempDir()
	db, err := openStateDB(dataDir)
	must.NoError(t, err)
	t.Cleanup(func() { _ = db.close() })

	kept := testAlloc(uuid.NewString(), structs.JobTypeService, nil, shTask("t", "true"))
	plain := testAlloc(uuid.NewString(), structs.JobTypeService, nil, shTask("t", "true"))
	gone := testAlloc(uuid.NewString(), structs.JobTypeService, nil, shTask("t", "true"))
	for _, a := range []*structs.Allocation{kept, plain, gone} {
		must.NoError(t, db.putAlloc(a))
	}
	must.NoError(t, db.putLocalStop(kept.ID, "no server reached for 10s"))
	must.NoError(t, db.deleteAlloc(gone.ID))
	must.NoError(t, db.putLocalStop(gone.ID, "no server reached for 10s"))

	restored, errs := db.loadAllocs()
	must.SliceEmpty(t, errs)
	stops := map[string]string{}
	for _, ra := range restored {
		stops[ra.Alloc.ID] = ra.LocalStop
	}
	must.Eq(t, map[string]string{kept.ID: "no server reached for 10s", plain.ID: ""}, stops)
}
