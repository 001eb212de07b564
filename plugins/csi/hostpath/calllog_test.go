package hostpath

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
	"google.golang.org/grpc/codes"
)

// TestCallLog_RecordsVolumeCallsInOrder takes a volume through a whole
// attach and detach on one monolith plugin, with one refused call, and
// reads the call log back: one line per volume call, in order, naming the
// volume and node, with the start before the end and the publish latency
// inside the controller calls.
func TestCallLog_RecordsVolumeCallsInOrder(t *testing.T) {
	stateDir := t.TempDir()
	cfg, _ := testConfig(t, stateDir, "node-a")
	cfg.PublishLatency = 20 * time.Millisecond
	p := startPlugin(t, cfg)
	c := dial(t, p)

	before := time.Now()
	vol := createVolume(t, c, "data", singleWriter)
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "alloc", "target")

	// Staging before the attach is refused, and recorded with its error.
	_, err := c.node.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
		VolumeId: vol, StagingTargetPath: staging, VolumeCapability: singleWriter,
	})
	mustCode(t, codes.FailedPrecondition, err)

	dev, err := publish(context.Background(), c, vol, "node-b", singleWriter)
	mustCode(t, codes.NotFound, err) // node-b never registered
	dev, err = publish(context.Background(), c, vol, "node-a", singleWriter)
	must.NoError(t, err)
	stageAndPublish(t, c, vol, dev, staging, target)
	unpublishAndUnstage(t, c, vol, staging, target)
	unpublish(t, c, vol, "node-a")
	// Read-only calls are not recorded.
	_, err = c.ctrl.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	must.NoError(t, err)
	_, err = c.node.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
	must.NoError(t, err)
	after := time.Now()

	got, err := ReadCallLog(stateDir, "node-a")
	must.NoError(t, err)
	type call struct{ method, vol, node string }
	want := []call{
		{"CreateVolume", vol, ""},
		{"NodeStageVolume", vol, "node-a"},
		{"ControllerPublishVolume", vol, "node-b"},
		{"ControllerPublishVolume", vol, "node-a"},
		{"NodeStageVolume", vol, "node-a"},
		{"NodePublishVolume", vol, "node-a"},
		{"NodeUnpublishVolume", vol, "node-a"},
		{"NodeUnstageVolume", vol, "node-a"},
		{"ControllerUnpublishVolume", vol, "node-a"},
	}
	must.Len(t, len(want), got, must.Sprintf("call log: %+v", got))
	for i, r := range got {
		must.Eq(t, want[i], call{r.Method, r.VolumeID, r.NodeID}, must.Sprintf("line %d: %+v", i+1, r))
		must.False(t, r.Truncated)
		must.False(t, r.Start().Before(before), must.Sprintf("line %d starts before the test", i+1))
		must.False(t, r.End().After(after), must.Sprintf("line %d ends after the test", i+1))
		must.LessEq(t, r.EndUnixNano, r.StartUnixNano, must.Sprintf("line %d ends before it starts", i+1))
		if i > 0 {
			// One client, one call at a time: each starts after the last ended.
			must.GreaterEq(t, got[i-1].EndUnixNano, r.StartUnixNano, must.Sprintf("line %d starts before line %d ended", i+1, i))
		}
		switch i {
		case 1:
			must.StrContains(t, r.Error, "FailedPrecondition")
		case 2:
			must.StrContains(t, r.Error, "NotFound")
		default:
			must.Eq(t, "", r.Error, must.Sprintf("line %d", i+1))
		}
		if strings.HasPrefix(r.Method, "Controller") {
			must.GreaterEq(t, cfg.PublishLatency, r.End().Sub(r.Start()), must.Sprintf("line %d: the latency is part of the call", i+1))
		}
	}
}

// TestCallLog_RestartAppendsAndNodeModeRecords: a plugin restarted on the
// same state dir and node ID continues the log, and a node-only plugin
// keeps one too (node calls are what it serves).
func TestCallLog_RestartAppendsAndNodeModeRecords(t *testing.T) {
	stateDir := t.TempDir()
	cfg, _ := testConfig(t, stateDir, "node-a")
	p, err := New(cfg)
	must.NoError(t, err)
	must.NoError(t, p.Start())
	createVolume(t, dial(t, p), "one", singleWriter)
	must.NoError(t, p.Stop(context.Background()))

	cfg2, _ := testConfig(t, stateDir, "node-a")
	createVolume(t, dial(t, startPlugin(t, cfg2)), "two", singleWriter)
	got, err := ReadCallLog(stateDir, "node-a")
	must.NoError(t, err)
	must.Len(t, 2, got, must.Sprintf("call log: %+v", got))
	must.NotEq(t, got[0].VolumeID, got[1].VolumeID)

	cfgB, _ := testConfig(t, stateDir, "node-b")
	cfgB.Mode = ModeNode
	b := dial(t, startPlugin(t, cfgB))
	_, err = b.node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{
		VolumeId: got[0].VolumeID, TargetPath: filepath.Join(t.TempDir(), "target"),
	})
	must.NoError(t, err)
	gotB, err := ReadCallLog(stateDir, "node-b")
	must.NoError(t, err)
	must.Len(t, 1, gotB)
	must.Eq(t, "NodeUnpublishVolume", gotB[0].Method)
	must.Eq(t, "node-b", gotB[0].NodeID)
}

// TestCallLog_Limit: past its limit the log gets one truncation marker and
// nothing more.
func TestCallLog_Limit(t *testing.T) {
	stateDir := t.TempDir()
	path := CallLogFile(stateDir, "node-a")
	l, err := openCallLog(path, 300, hclog.NewNullLogger())
	must.NoError(t, err)
	t.Cleanup(func() { l.close() })

	rec := CallRecord{Method: "NodePublishVolume", VolumeID: "vol-1", NodeID: "node-a", StartUnixNano: 1, EndUnixNano: 2}
	for range 10 {
		l.record(rec)
	}
	got, err := ReadCallLog(stateDir, "node-a")
	must.NoError(t, err)
	must.Greater(t, 1, len(got))
	must.Less(t, 10, len(got))
	for _, r := range got[:len(got)-1] {
		must.Eq(t, rec, r)
	}
	must.True(t, got[len(got)-1].Truncated, must.Sprintf("last line: %+v", got[len(got)-1]))
	fi, err := os.Stat(path)
	must.NoError(t, err)
	must.LessEq(t, int64(300+200), fi.Size(), must.Sprint("the marker may pass the limit by one short line, no more"))

	// A reopened log that is already full records nothing more either.
	l2, err := openCallLog(path, 300, hclog.NewNullLogger())
	must.NoError(t, err)
	t.Cleanup(func() { l2.close() })
	l2.record(rec)
	again, err := ReadCallLog(stateDir, "node-a")
	must.NoError(t, err)
	must.Len(t, len(got)+1, again, must.Sprint("one more marker, as the reopened log finds itself full"))
	must.True(t, again[len(again)-1].Truncated)
}

// TestReadCallLog_PartialLastLine: a line still being written is left out;
// a broken line in the middle is an error; no file is no calls.
func TestReadCallLog_PartialLastLine(t *testing.T) {
	stateDir := t.TempDir()
	got, err := ReadCallLog(stateDir, "node-a")
	must.NoError(t, err)
	must.SliceEmpty(t, got)

	path := CallLogFile(stateDir, "node-a")
	full := `{"method":"NodeStageVolume","volume_id":"v","node_id":"node-a","start_unix_nano":1,"end_unix_nano":2,"error":""}` + "\n"
	must.NoError(t, os.WriteFile(path, []byte(full+`{"method":"NodePub`), 0o644))
	got, err = ReadCallLog(stateDir, "node-a")
	must.NoError(t, err)
	must.Len(t, 1, got)
	must.Eq(t, "NodeStageVolume", got[0].Method)

	must.NoError(t, os.WriteFile(path, []byte(`{"method":`+"\n"+full), 0o644))
	_, err = ReadCallLog(stateDir, "node-a")
	must.ErrorContains(t, err, "line 1")
}
