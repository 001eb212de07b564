package client

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// When one task of a group fails, the client reports the whole allocation
// failed at once, while a sibling task is still inside its kill timeout.
// What it reports must still hold the group's volume claims: the servers'
// release rule (structs.CSIClaimReleasable) reads the task states too.
func TestAllocRunner_FailedTaskDoesNotFreeClaimsOfARunningSibling(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	startTestManager(t, srv, dataDir, nil)

	writer := shTask("writer", `echo $$ > "$ROAM_ALLOC_DIR/pid"; trap 'echo flushing; sleep 2; exit 0' TERM; while :; do sleep 0.1; done`)
	writer.KillTimeout = 10 * time.Second
	alloc := testAlloc(srv.nodeID, structs.JobTypeService, noRestarts, writer,
		shTask("sidecar", `while [ ! -e "$ROAM_ALLOC_DIR/pid" ]; do sleep 0.02; done; exit 1`))
	killOnCleanup(t, filepath.Join(dataDir, "alloc", alloc.ID, "alloc", "pid"))
	srv.upsert(alloc)

	var got *structs.Allocation
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			got = srv.alloc(alloc.ID)
			if got.ClientStatus != structs.AllocClientStatusFailed {
				return fmt.Errorf("status %q, tasks %s", got.ClientStatus, describeTasks(got.TaskStates))
			}
			return nil
		}),
		wait.Timeout(30*time.Second), wait.Gap(20*time.Millisecond),
	))
	node := &structs.Node{ID: srv.nodeID, Status: structs.NodeStatusReady}
	t.Logf("servers see client status %q, writer task %q, Releasable=%v",
		got.ClientStatus, got.TaskStates["writer"].State, structs.CSIClaimReleasable(got, node))
	// The writer is running (it wrote its pid), though the report may
	// still say it is starting: either way it is not dead.
	must.NotEqOp(t, structs.TaskStateDead, got.TaskStates["writer"].State,
		must.Sprint("the servers see the writer not dead when the alloc turned failed"))
	must.False(t, structs.CSIClaimReleasable(got, node),
		must.Sprint("the claim is releasable while the writer task is still in its kill timeout"))

	// The writer's exit is reported too, and frees the claim.
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return structs.CSIClaimReleasable(srv.alloc(alloc.ID), node) }),
		wait.Timeout(30*time.Second), wait.Gap(20*time.Millisecond),
	), must.Sprint("the writer's exit is reported and frees the claim"))
	must.EqOp(t, structs.TaskStateDead, srv.alloc(alloc.ID).TaskStates["writer"].State)
}
