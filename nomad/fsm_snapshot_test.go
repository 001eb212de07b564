package nomad

import (
	"bytes"
	"fmt"
	"io"
	"testing"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// snapshotRecordCounts decodes a snapshot stream and counts its records by
// type, without restoring it.
func snapshotRecordCounts(t *testing.T, body []byte) map[snapshotRecord]int {
	t.Helper()
	dec := codec.NewDecoder(bytes.NewReader(body), structs.MsgpackHandle)
	out := map[snapshotRecord]int{}
	for {
		var rec snapshotRecord
		must.NoError(t, dec.Decode(&rec))
		out[rec]++
		if rec == snapEnd {
			return out
		}
		var skip codec.Raw
		must.NoError(t, dec.Decode(&skip))
	}
}

func sharedJobTestJob(meta string) *structs.Job {
	return &structs.Job{
		ID: "web", Name: "web", Namespace: structs.DefaultNamespace, Type: structs.JobTypeService, Priority: 50,
		Version: 3, ModifyIndex: 5, JobModifyIndex: 5, Meta: map[string]string{"m": meta, "n": "x"},
		TaskGroups: []*structs.TaskGroup{{Name: "g", Count: 3, Tasks: []*structs.Task{{
			Name: "t", Driver: "raw_exec", Config: map[string]any{"command": "/bin/sleep", "args": []any{"60"}},
		}}}},
	}
}

func sharedJobTestAlloc(id string, job *structs.Job) *structs.Allocation {
	return &structs.Allocation{
		ID: id, Namespace: structs.DefaultNamespace, JobID: job.ID, Job: job, TaskGroup: "g", NodeID: "n1",
		Name: "web.g[0]", DesiredStatus: structs.AllocDesiredStatusRun, ClientStatus: structs.AllocClientStatusRunning,
	}
}

// Allocations of one job version are written with one copy of it, and
// come back sharing it; a copy with the same contents (as a follower's
// decoded plans hold) shares it too.
func TestFSM_SnapshotSharesAllocJobs(t *testing.T) {
	src := testFSM(t)
	job := sharedJobTestJob("a")
	copied := sharedJobTestJob("a")
	must.NoError(t, src.State().UpsertAllocs(6, []*structs.Allocation{
		sharedJobTestAlloc("a1", job), sharedJobTestAlloc("a2", job), sharedJobTestAlloc("a3", copied),
	}))

	body := snapshotBytes(t, src)
	recs := snapshotRecordCounts(t, body)
	must.Eq(t, 1, recs[snapAllocJob])
	must.Eq(t, 3, recs[snapAllocShared])
	must.Eq(t, 0, recs[snapAlloc])

	dst := testFSM(t)
	must.NoError(t, dst.Restore(io.NopCloser(bytes.NewReader(body))))
	var got []*structs.Allocation
	for _, id := range []string{"a1", "a2", "a3"} {
		a, err := dst.State().AllocByID(nil, id)
		must.NoError(t, err)
		want, err := src.State().AllocByID(nil, id)
		must.NoError(t, err)
		must.Eq(t, want, a)
		got = append(got, a)
	}
	must.True(t, got[0].Job == got[1].Job && got[1].Job == got[2].Job, must.Sprint("restored allocations hold one job value"))

	counts, err := countSnapshot(bytes.NewReader(body))
	must.NoError(t, err)
	must.Eq(t, 3, counts["allocs"])
}

// Two job values that claim the same version but differ are never merged:
// the second allocation keeps its own job, written inline.
func TestFSM_SnapshotKeepsDifferingAllocJobsApart(t *testing.T) {
	src := testFSM(t)
	must.NoError(t, src.State().UpsertAllocs(6, []*structs.Allocation{
		sharedJobTestAlloc("a1", sharedJobTestJob("a")), sharedJobTestAlloc("a2", sharedJobTestJob("b")),
	}))

	body := snapshotBytes(t, src)
	recs := snapshotRecordCounts(t, body)
	must.Eq(t, 1, recs[snapAllocShared])
	must.Eq(t, 1, recs[snapAlloc])

	dst := testFSM(t)
	must.NoError(t, dst.Restore(io.NopCloser(bytes.NewReader(body))))
	for id, meta := range map[string]string{"a1": "a", "a2": "b"} {
		a, err := dst.State().AllocByID(nil, id)
		must.NoError(t, err)
		must.Eq(t, meta, a.Job.Meta["m"], must.Sprintf("allocation %s", id))
	}
}

// writeRecords encodes a snapshot stream by hand: record type, then body.
func writeRecords(t *testing.T, recs ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := codec.NewEncoder(&buf, structs.MsgpackHandle)
	for _, r := range recs {
		must.NoError(t, enc.Encode(r))
	}
	return buf.Bytes()
}

// A stream from before shared jobs (each allocation with its job inline)
// still restores.
func TestFSM_RestoreInlineAllocJobs(t *testing.T) {
	job := sharedJobTestJob("a")
	body := writeRecords(t, snapAlloc, sharedJobTestAlloc("a1", job), snapAlloc, sharedJobTestAlloc("a2", job), snapEnd)
	dst := testFSM(t)
	must.NoError(t, dst.Restore(io.NopCloser(bytes.NewReader(body))))
	a, err := dst.State().AllocByID(nil, "a2")
	must.NoError(t, err)
	must.Eq(t, "a", a.Job.Meta["m"])
}

// A shared-job record that names a job record the stream does not have
// (yet) is refused, and the store keeps what it had.
func TestFSM_RestoreRefusesUnknownAllocJob(t *testing.T) {
	job := sharedJobTestJob("a")
	bare := sharedJobTestAlloc("a1", job)
	bare.Job = nil
	cases := map[string][]byte{
		"before any job": writeRecords(t, snapAllocShared, &sharedAlloc{Job: 0, Alloc: bare}, snapEnd),
		"past the last":  writeRecords(t, snapAllocJob, job, snapAllocShared, &sharedAlloc{Job: 1, Alloc: bare}, snapEnd),
		"negative":       writeRecords(t, snapAllocJob, job, snapAllocShared, &sharedAlloc{Job: -1, Alloc: bare}, snapEnd),
		"no allocation":  writeRecords(t, snapAllocJob, job, snapAllocShared, &sharedAlloc{Job: 0}, snapEnd),
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			f := testFSM(t)
			must.NoError(t, f.State().UpsertAllocs(3, []*structs.Allocation{sharedJobTestAlloc("keep", job)}))
			err := f.Restore(io.NopCloser(bytes.NewReader(body)))
			must.ErrorContains(t, err, "fsm: restore allocs")
			_, err = countSnapshot(bytes.NewReader(body))
			must.Error(t, err)
			kept, err := f.State().AllocByID(nil, "keep")
			must.NoError(t, err)
			must.NotNil(t, kept)
		})
	}
}

// versionRecord is a snapVersion record carrying v.
func versionRecord(t *testing.T, v uint) []byte {
	t.Helper()
	return msgpackBytes(t, snapVersion, v)
}

// stripVersion cuts the version record off a stream this build wrote,
// leaving it as a build before versions wrote it.
func stripVersion(t *testing.T, body []byte) []byte {
	t.Helper()
	rec := versionRecord(t, snapshotFormatVersion)
	must.True(t, bytes.HasPrefix(body, rec), must.Sprint("stream does not start with its version record"))
	return body[len(rec):]
}

// restoreRefused restores stream into an FSM holding a node, requires the
// restore to fail and the FSM to keep its store as it was, and returns
// the error.
func restoreRefused(t *testing.T, stream []byte) error {
	t.Helper()
	dst := testFSM(t)
	mustApply(t, dst, 1, structs.NodeRegisterRequestType, &structs.NodeRegisterRequest{Node: testNode("kept")})
	before := contentsOf(t, dst.State())
	old := dst.State()

	err := dst.Restore(io.NopCloser(bytes.NewReader(stream)))
	must.Error(t, err)
	must.Eq(t, old, dst.State())
	requireSameContents(t, before, contentsOf(t, dst.State()))
	select {
	case <-old.AbandonCh():
		t.Fatal("a refused restore abandoned the live store")
	default:
	}
	return err
}

// Every stream says its format version before anything else, so a build
// that cannot read it can say so before reading any of it.
func TestFSM_SnapshotStartsWithVersion(t *testing.T) {
	src := testFSM(t)
	populateFSM(t, src)
	body := snapshotBytes(t, src)

	dec := codec.NewDecoder(bytes.NewReader(body), structs.MsgpackHandle)
	var rec snapshotRecord
	must.NoError(t, dec.Decode(&rec))
	must.Eq(t, snapVersion, rec)
	var v uint
	must.NoError(t, dec.Decode(&v))
	must.Eq(t, snapshotFormatVersion, v)
	must.Eq(t, 1, snapshotRecordCounts(t, body)[snapVersion])
}

// A stream from a build before versions restores as it always did.
func TestFSM_RestoreLegacyStreamWithoutVersion(t *testing.T) {
	src := testFSM(t)
	populateFSM(t, src)
	legacy := stripVersion(t, snapshotBytes(t, src))

	dst := testFSM(t)
	must.NoError(t, dst.Restore(io.NopCloser(bytes.NewReader(legacy))))
	requireSameContents(t, contentsOf(t, src.State()), contentsOf(t, dst.State()))
	_, err := countSnapshot(bytes.NewReader(legacy))
	must.NoError(t, err)
}

// Versions up to this build's restore; a newer one is refused by name,
// before any record of it is read, and the store keeps what it had.
func TestFSM_RestoreFormatVersions(t *testing.T) {
	src := testFSM(t)
	populateFSM(t, src)
	records := stripVersion(t, snapshotBytes(t, src))

	for _, v := range []uint{0, snapshotFormatVersion} {
		t.Run(fmt.Sprintf("version %d", v), func(t *testing.T) {
			dst := testFSM(t)
			must.NoError(t, dst.Restore(io.NopCloser(bytes.NewReader(concatBytes(versionRecord(t, v), records)))))
			requireSameContents(t, contentsOf(t, src.State()), contentsOf(t, dst.State()))
		})
	}

	t.Run("newer", func(t *testing.T) {
		newer := snapshotFormatVersion + 1
		stream := concatBytes(versionRecord(t, newer), records)
		err := restoreRefused(t, stream)
		must.ErrorIs(t, err, ErrSnapshotNewer)
		must.EqError(t, err, fmt.Sprintf(
			"fsm: restore: snapshot format version %d is newer than this build reads (%d): upgrade this server first",
			newer, snapshotFormatVersion))
		_, err = countSnapshot(bytes.NewReader(stream))
		must.ErrorIs(t, err, ErrSnapshotNewer)
	})
}

// The version record says how to read the records after it; one anywhere
// but first is refused.
func TestFSM_RestoreRefusesVersionMidStream(t *testing.T) {
	v := versionRecord(t, snapshotFormatVersion)
	node := msgpackBytes(t, snapNode, testNode("n1"))
	end := msgpackBytes(t, snapEnd)
	cases := map[string][]byte{
		"after a record":  concatBytes(node, v, end),
		"twice":           concatBytes(v, v, node, end),
		"after the first": concatBytes(v, node, v, end),
	}
	for name, stream := range cases {
		t.Run(name, func(t *testing.T) {
			err := restoreRefused(t, stream)
			must.ErrorContains(t, err, "format version record after the first record")
		})
	}
}
