//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

	// The provider's listing shows all three, each under its Roam ID.
	out = cc.MustCLI("volume", "status", "-type", "csi", "-plugin", csiPluginID, "-external")
	for id, ext := range map[string]string{"orig": srcExt, "restored": restoredExt, "cloned": clonedExt} {
		must.True(t, hasRow(out, ext, id), must.Sprintf("no row %s %s in:\n%s", ext, id, out))
	}
	must.StrContains(t, out, "snapshot "+snapID)
	must.StrContains(t, out, "clone of "+srcExt)
	// Status views: a volume's capacity, the plugin's allocations, a
	// node's CSI plugins.
	must.StrContains(t, cc.MustCLI("volume", "status", "restored"), "1048576 (1.0 MiB)")
	pout := cc.MustCLI("plugin", "status", csiPluginID)
	must.StrContains(t, pout, "Allocations")
	must.StrContains(t, pout, "running")
	nodeID := cc.NodeIDs["client-0"]
	nout := cc.MustCLI("node", "status", "-verbose", nodeID)
	must.StrContains(t, nout, "CSI Node Plugins")
	must.StrContains(t, nout, "CSI Controller Plugins")
	must.True(t, hasRow(nout, csiPluginID, "true"), must.Sprintf("no healthy %s row in:\n%s", csiPluginID, nout))
	cc.mustNoOverlaps(t)
}

// hasRow says whether some line of out holds every one of cols as a
// whole field.
func hasRow(out string, cols ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		ok := true
		for _, c := range cols {
			if !slices.Contains(fields, c) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}
