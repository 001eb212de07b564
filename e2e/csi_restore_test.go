//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
)

// TestCSI_RestoreSnapshotAndClone writes a token into a volume, snapshots
// it with the CLI, and creates one volume from the snapshot and one as a
// clone of the written volume: a reader of each finds the same bytes. The
// source is written again after the snapshot and the clone, and neither
// copy sees that.
func TestCSI_RestoreSnapshotAndClone(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 1, Clients: 2})
	srcExt := cc.createVolumeCLI(t, "orig", createVolumeSpec("orig", "1MiB", ""))
	token := randomToken(t)
	cc.RunJob(csiJob("writer", "batch", 1, "orig", false, "",
		fmt.Sprintf(`printf %%s %s > "$ROAM_TASK_DIR/data/token"`, token)))
	cc.waitCSIAllocs(t, "writer", csiSettle, oneAlloc("complete"))
	cc.waitUnclaimed(t, "orig")

	out := cc.MustCLI("volume", "snapshot", "create", "-json", "orig", "orig-snap")
	var snaps []*api.CSISnapshot
	must.NoError(t, json.Unmarshal([]byte(out), &snaps), must.Sprintf("output: %s", out))
	must.SliceLen(t, 1, snaps)
	snapID := snaps[0].ID
	must.NotEq(t, "", snapID)

	restoredExt := cc.createVolumeCLI(t, "restored", createVolumeSpec("restored", "1MiB", fmt.Sprintf("snapshot_id = %q", snapID)))
	clonedExt := cc.createVolumeCLI(t, "cloned", createVolumeSpec("cloned", "1MiB", fmt.Sprintf("clone_id = %q", srcExt)))
	must.NotEq(t, srcExt, restoredExt)
	must.NotEq(t, srcExt, clonedExt)
	for id, want := range map[string][2]string{"restored": {snapID, ""}, "cloned": {"", srcExt}} {
		v, err := cc.volume(id)
		must.NoError(t, err)
		must.Eq(t, want[0], v.SnapshotID, must.Sprintf("volume %s", id))
		must.Eq(t, want[1], v.CloneID, must.Sprintf("volume %s", id))
	}

	// Both sources at once are refused, naming the problem.
	both := createVolumeSpec("both", "1MiB", fmt.Sprintf("snapshot_id = %q\nclone_id = %q", snapID, srcExt))
	path := filepath.Join(t.TempDir(), "both.hcl")
	must.NoError(t, os.WriteFile(path, []byte(both), 0o644))
	_, errOut, code := cc.RunCLI("volume", "create", path)
	must.NotEq(t, 0, code)
	must.StrContains(t, errOut, "a volume has one source")

	// The source changes after the copies were made.
	cc.RunJob(csiJob("overwrite", "batch", 1, "orig", false, "", `printf changed > "$ROAM_TASK_DIR/data/token"`))
	cc.waitCSIAllocs(t, "overwrite", csiSettle, oneAlloc("complete"))
	cc.waitUnclaimed(t, "orig")

	for _, id := range []string{"restored", "cloned"} {
		job := "read-" + id
		cc.RunJob(csiJob(job, "batch", 1, id, false, "", `cat "$ROAM_TASK_DIR/data/token"`))
		reader := cc.waitCSIAllocs(t, job, csiSettle, oneAlloc("complete"))[0]
		logs := cc.MustCLI("alloc", "logs", reader.ID, "t")
		must.Eq(t, token, logs, must.Sprintf("reader of %s", id))
	}
	cc.mustNoOverlaps(t)
}
