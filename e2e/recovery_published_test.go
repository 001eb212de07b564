//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/shoenig/test/must"
)

// publishAt publishes the volume ext to the provider node at the plugin
// listening on sock, outside Roam: an attachment no claim explains.
func publishAt(t *testing.T, sock, ext, providerNode string) {
	t.Helper()
	conn, err := dialPlugin(sock)
	must.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = csi.NewControllerClient(conn).ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
		VolumeId: ext, NodeId: providerNode,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
	})
	must.NoError(t, err)
}

// publishedNodes lists the provider nodes ext is published to, as the
// plugin at sock says (ListVolumes).
func publishedNodes(t *testing.T, sock, ext string) []string {
	t.Helper()
	conn, err := dialPlugin(sock)
	must.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := csi.NewControllerClient(conn).ListVolumes(ctx, &csi.ListVolumesRequest{})
	must.NoError(t, err)
	for _, e := range resp.GetEntries() {
		if e.GetVolume().GetVolumeId() == ext {
			return e.GetStatus().GetPublishedNodeIds()
		}
	}
	t.Fatalf("volume %s is not listed", ext)
	return nil
}

// restoreOnLeader restores snap through the leader's HTTP API.
func (cc *csiCluster) restoreOnLeader(t *testing.T, snap string) {
	t.Helper()
	out, errOut, code := RunCLIAt(t, cc.ServerHTTP(cc.Leader()), "operator", "snapshot", "restore", snap)
	must.EqOp(t, 0, code, must.Sprintf("restore: %s%s", out, errOut))
}

// serverLogCount counts the lines holding every one of parts in the
// servers' logs.
func (cc *csiCluster) serverLogCount(parts ...string) int {
	n := 0
	for _, s := range cc.Servers {
	line:
		for _, l := range strings.Split(s.Log(), "\n") {
			for _, p := range parts {
				if !strings.Contains(l, p) {
					continue line
				}
			}
			n++
		}
	}
	return n
}

// TestRecovery_RestoreUnpublishesUnclaimedAttachment: a volume published
// at the provider after the snapshot was taken (here by a direct
// ControllerPublishVolume, as a claim the snapshot predates would have
// left it) has no claim once the snapshot is restored. The leader finds
// it in the plugin's ListVolumes, asks the node, which uses nothing of
// it, and unpublishes it exactly once, through the lane; the volume that
// was never published is not touched.
func TestRecovery_RestoreUnpublishesUnclaimedAttachment(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 1, Clients: 2, ExternalPlugins: true})
	names := []string{"vol[0]", "vol[1]"}
	exts := cc.createVolumes(t, "client-0", names...)
	for i, name := range names {
		cc.registerVolumeHTTP(t, name, exts[i])
	}
	snap := filepath.Join(cc.Dir, "backup.snap")
	out, errOut, code := RunCLIAt(t, cc.ServerHTTP(cc.Leader()), "operator", "snapshot", "save", snap)
	must.EqOp(t, 0, code, must.Sprintf("save: %s%s", out, errOut))

	publishAt(t, cc.Sockets["client-0"], exts[0], "client-1")
	must.Eq(t, []string{"client-1"}, publishedNodes(t, cc.Sockets["client-0"], exts[0]))
	before := cc.controllerCounts(t, exts)
	must.EqOp(t, 0, before[exts[0]]["ControllerUnpublishVolume"])

	cc.restoreOnLeader(t, snap)
	WaitFor(t, csiSettle, func() error {
		if nodes := publishedNodes(t, cc.Sockets["client-0"], exts[0]); len(nodes) != 0 {
			return fmt.Errorf("vol[0] is still published to %v, with no claim and no allocation using it", nodes)
		}
		return nil
	})
	WaitFor(t, csiSettle, func() error {
		if n := cc.serverLogCount("restore reconcile: provider attachments checked"); n == 0 {
			return fmt.Errorf("the leader has not finished its restore reconcile")
		}
		return nil
	})
	after := cc.controllerCounts(t, exts)
	t.Logf("before the restore: %v; after: %v", before, after)
	must.EqOp(t, 1, after[exts[0]]["ControllerUnpublishVolume"], must.Sprint("the unclaimed attachment was not unpublished exactly once"))
	must.EqOp(t, 0, after[exts[1]]["ControllerUnpublishVolume"])
	must.EqOp(t, before[exts[0]]["ControllerPublishVolume"], after[exts[0]]["ControllerPublishVolume"])
	must.SliceEmpty(t, publishedNodes(t, cc.Sockets["client-0"], exts[0]))
	must.EqOp(t, 1, cc.serverLogCount("restore reconcile: unpublished a volume", exts[0]))
	cc.mustNoOverlaps(t)
}

// TestRecovery_RestoreKeepsAttachmentOfUnknownRunningAlloc: an
// allocation placed after the snapshot holds its volume at the provider;
// the restored state knows neither. While the node says the allocation
// uses the volume, the leader leaves the attachment published; it is
// unpublished (once) only after the node has let go of the volume (its
// NodeUnpublishVolume), whenever the client stops the allocation the
// restored state does not list.
func TestRecovery_RestoreKeepsAttachmentOfUnknownRunningAlloc(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 1, Clients: 2, ExternalPlugins: true})
	names := []string{"vol[0]"}
	exts := cc.createVolumes(t, "client-0", names...)
	cc.registerVolumeHTTP(t, names[0], exts[0])
	snap := filepath.Join(cc.Dir, "backup.snap")
	out, errOut, code := RunCLIAt(t, cc.ServerHTTP(cc.Leader()), "operator", "snapshot", "save", snap)
	must.EqOp(t, 0, code, must.Sprintf("save: %s%s", out, errOut))

	cc.RunJob(csiJob("late", "service", 1, "vol", true, "", pidScript))
	allocs := cc.waitCSIAllocs(t, "late", csiSettle, oneAlloc("running"))
	pidFile := filepath.Join(cc.StateDir, "volumes", exts[0], "pid")
	WaitFor(t, csiSettle, func() error { _, err := os.Stat(pidFile); return err })
	holder := cc.clientName(allocs[0].NodeID)
	must.Eq(t, []string{holder}, publishedNodes(t, cc.Sockets["client-0"], exts[0]))
	restoredAt := time.Now().UnixNano()

	cc.restoreOnLeader(t, snap)
	// No controller unpublish may come before the node's own unpublish,
	// and at most one comes.
	check := func() (finished bool, kept, nUnpub int) {
		nodeLetGo, unpublished, n := postRestoreCalls(t, cc, exts[0], restoredAt)
		must.LessEq(t, 1, n, must.Sprint("the attachment was unpublished more than once"))
		if n == 1 {
			must.Positive(t, nodeLetGo, must.Sprint("the controller unpublished the volume and the node never let go of it"))
			must.True(t, unpublished > nodeLetGo, must.Sprintf(
				"the controller unpublished the volume (at %d) before the node let go of it (at %d)", unpublished, nodeLetGo))
		}
		return cc.serverLogCount("restore reconcile: provider attachments checked") > 0,
			cc.serverLogCount("still in use on its node; left published", exts[0]), n
	}
	// The client holds on to the allocation the restored state does not
	// list until its blocking allocation query returns: meanwhile the
	// leader finds the volume in use, pass after pass, and leaves it
	// published.
	WaitFor(t, csiSettle, func() error {
		finished, kept, n := check()
		must.False(t, finished, must.Sprint("the reconcile finished while the allocation ran"))
		must.EqOp(t, 0, n)
		if kept < 3 {
			return fmt.Errorf("the leader kept the attachment in %d passes, want 3", kept)
		}
		t.Logf("kept in %d passes", kept)
		return nil
	})
	pid, err := os.ReadFile(pidFile)
	must.NoError(t, err)
	taskPID, err := strconv.Atoi(strings.TrimSpace(string(pid)))
	must.NoError(t, err)
	must.True(t, pidAlive(taskPID), must.Sprint("the task holding the volume died"))

	// Another job's allocation wakes the client's query: it stops the
	// allocation the servers do not list and lets go of the volume (its
	// release finds no claim). Only then is the attachment unpublished,
	// once.
	cc.RunJob(systemJob("wake"))
	WaitFor(t, 2*csiSettle, func() error {
		finished, kept, n := check()
		if !finished {
			return fmt.Errorf("the reconcile did not finish once the allocation stopped (kept in %d passes, %d unpublishes)", kept, n)
		}
		must.EqOp(t, 1, n, must.Sprint("the reconcile finished without unpublishing the released attachment"))
		t.Logf("kept in %d passes in all", kept)
		return nil
	})
	must.False(t, pidAlive(taskPID), must.Sprint("the volume was unpublished while its task lived"))
	must.SliceEmpty(t, publishedNodes(t, cc.Sockets["client-0"], exts[0]))
	cc.mustNoOverlaps(t)
}

// postRestoreCalls reads the calls on ext that started after since: when
// the node first finished unpublishing it, when the last controller
// unpublish started, and how many controller unpublishes there were.
func postRestoreCalls(t *testing.T, cc *csiCluster, ext string, since int64) (nodeLetGo, unpublished int64, n int) {
	t.Helper()
	calls, err := cc.volumeCalls(ext)
	must.NoError(t, err)
	for _, c := range calls {
		if c.Start < since || c.Error != "" {
			continue
		}
		switch c.Method {
		case "NodeUnpublishVolume":
			if nodeLetGo == 0 {
				nodeLetGo = c.End
			}
		case "ControllerUnpublishVolume":
			n++
			unpublished = c.Start
		}
	}
	return nodeLetGo, unpublished, n
}
