package nomad

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// testSnapshotFile builds a snapshot file of a populated FSM.
func testSnapshotFile(t *testing.T) (*FSM, []byte) {
	t.Helper()
	f := testFSM(t)
	populateFSM(t, f)
	body := snapshotBytes(t, f)
	_, counts, err := restoreStore(bytes.NewReader(body))
	must.NoError(t, err)
	file, err := encodeSnapshotFile(&SnapshotHeader{Index: 40, Term: 3, RaftVersion: 1, Region: "global", Counts: counts}, body)
	must.NoError(t, err)
	return f, file
}

func TestSnapshotFile_RoundTrip(t *testing.T) {
	f, file := testSnapshotFile(t)
	hdr, body, err := ReadSnapshotFile(bytes.NewReader(file), 0)
	must.NoError(t, err)
	must.Eq(t, uint64(40), hdr.Index)
	must.Eq(t, uint64(3), hdr.Term)
	must.Eq(t, int64(len(body)), hdr.Size)
	must.Eq(t, len(contentsOf(t, f.State()).nodes), hdr.Counts["nodes"])
	must.Eq(t, 64, len(hdr.SHA256))

	st, _, err := restoreStore(bytes.NewReader(body))
	must.NoError(t, err)
	requireSameContents(t, contentsOf(t, f.State()), contentsOf(t, st))
}

func TestSnapshotFile_RefusesDamage(t *testing.T) {
	_, file := testSnapshotFile(t)

	// A node's name sits in the body as plain bytes: changing one letter
	// still decodes, so only the checksum can tell.
	i := bytes.Index(file, []byte("rich-0"))
	must.Positive(t, i)
	flipped := bytes.Clone(file)
	flipped[i] = 'N'

	hdrEnd := bytes.Index(file, []byte(`"Index":40`))
	must.Positive(t, hdrEnd)
	editedHeader := bytes.Clone(file)
	copy(editedHeader[hdrEnd:], `"Index":99`)

	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrSnapshotTruncated},
		{"magic only", file[:5], ErrSnapshotTruncated},
		{"header cut", file[:20], ErrSnapshotTruncated},
		{"body cut", file[:len(file)/2], ErrSnapshotTruncated},
		{"checksum cut", file[:len(file)-1], ErrSnapshotTruncated},
		{"trailing bytes", append(bytes.Clone(file), 0), ErrSnapshotCorrupt},
		{"flipped body byte", flipped, ErrSnapshotCorrupt},
		{"edited header", editedHeader, ErrSnapshotCorrupt},
		{"not a snapshot", []byte("hello, this is not a snapshot file at all"), ErrSnapshotCorrupt},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ReadSnapshotFile(bytes.NewReader(tc.data), 0)
			must.Error(t, err)
			must.True(t, errors.Is(err, tc.want), must.Sprintf("got %v, want %v", err, tc.want))
		})
	}

	t.Run("too large", func(t *testing.T) {
		_, _, err := ReadSnapshotFile(bytes.NewReader(file), int64(len(file)-1))
		must.True(t, errors.Is(err, ErrSnapshotTooLarge), must.Sprintf("got %v", err))
	})
}

// A file, or a body, from a newer build is refused as newer, not as
// damaged: the fix is an upgrade, not another file.
func TestSnapshotFile_RefusesNewerFormat(t *testing.T) {
	f, file := testSnapshotFile(t)

	newerFile := bytes.Clone(file)
	newerFile[len(snapshotMagic)+1]++ // the low byte of the file version
	body := stripVersion(t, snapshotBytes(t, f))
	newerBody, err := encodeSnapshotFile(&SnapshotHeader{Index: 40, Term: 3, RaftVersion: 1, Region: "global"},
		concatBytes(versionRecord(t, snapshotFormatVersion+1), body))
	must.NoError(t, err)

	cases := map[string]struct {
		data []byte
		want string
	}{
		"file": {newerFile, fmt.Sprintf("snapshot file format version %d is newer than this build reads (%d)",
			snapshotFileVersion+1, snapshotFileVersion)},
		"body": {newerBody, fmt.Sprintf("snapshot format version %d is newer than this build reads (%d)",
			snapshotFormatVersion+1, snapshotFormatVersion)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, _, err := ReadSnapshotFile(bytes.NewReader(tc.data), 0)
			must.ErrorIs(t, err, ErrSnapshotNewer)
			must.False(t, errors.Is(err, ErrSnapshotCorrupt), must.Sprintf("newer refused as corrupt: %v", err))
			must.ErrorContains(t, err, tc.want)
		})
	}

	// Through the restore RPC it is the caller's request that is refused
	// (a 400 over HTTP), and nothing changes.
	s := testServer(t, func(c *Config) { c.BootstrapExpect = 1 })
	waitForLeader(t, s)
	kept := testNode("kept")
	registerNode(t, s, kept)
	_, err = uploadSnapshot(s, newerBody)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.ErrorContains(t, err, "upgrade this server first")
	n, err := s.State().NodeByID(nil, kept.ID)
	must.NoError(t, err)
	must.NotNil(t, n)
}

// downloadSnapshot saves a snapshot through s the way the HTTP API does.
func downloadSnapshot(t *testing.T, s *Server) []byte {
	t.Helper()
	var save structs.SnapshotSaveResponse
	must.NoError(t, s.RPC("Operator.SnapshotSave", &structs.SnapshotSaveRequest{}, &save))
	var out []byte
	for {
		var chunk structs.SnapshotChunkResponse
		must.NoError(t, s.RPC("Operator.SnapshotRead", &structs.SnapshotChunkRequest{ID: save.ID, Offset: int64(len(out))}, &chunk))
		out = append(out, chunk.Data...)
		if chunk.Done {
			break
		}
	}
	must.Eq(t, save.Size, int64(len(out)))
	return out
}

// uploadSnapshot restores file through s the way the HTTP API does.
func uploadSnapshot(s *Server, file []byte) (*structs.SnapshotRestoreResponse, error) {
	var id string
	for off := 0; off == 0 || off < len(file); {
		end := min(off+SnapshotChunkSize, len(file))
		var up structs.SnapshotUploadResponse
		if err := s.RPC("Operator.SnapshotUpload", &structs.SnapshotUploadRequest{ID: id, Offset: int64(off), Data: file[off:end]}, &up); err != nil {
			return nil, err
		}
		id, off = up.ID, end
		if len(file) == 0 {
			break
		}
	}
	var resp structs.SnapshotRestoreResponse
	if err := s.RPC("Operator.SnapshotRestore", &structs.SnapshotRestoreRequest{ID: id}, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

func TestOperator_SnapshotSaveRestoreThroughFollower(t *testing.T) {
	t.Parallel()
	servers := testMemCluster(t, 3).servers
	leader := waitForLeader(t, servers...)
	follower := followers(servers)[0]

	kept := testNode("kept")
	registerNode(t, leader, kept)
	file := downloadSnapshot(t, follower)
	hdr, _, err := ReadSnapshotFile(bytes.NewReader(file), 0)
	must.NoError(t, err)
	must.Eq(t, 1, hdr.Counts["nodes"])
	must.Positive(t, hdr.Index)
	must.Positive(t, hdr.Term)

	// Written after the snapshot: a restore must take it away everywhere.
	later := testNode("later")
	registerNode(t, leader, later)
	waitAllHaveNode(t, servers, later.ID)

	// A damaged file is refused and changes nothing.
	bad := bytes.Clone(file)
	bad[len(bad)/2] ^= 0xff
	_, err = uploadSnapshot(follower, bad)
	must.ErrorContains(t, err, "snapshot file is corrupt")
	for _, s := range servers {
		n, err := s.State().NodeByID(nil, later.ID)
		must.NoError(t, err)
		must.NotNil(t, n, must.Sprintf("server %s lost a node to a refused restore", s.ID()))
	}

	resp, err := uploadSnapshot(follower, file)
	must.NoError(t, err)
	must.Eq(t, hdr.Index, resp.Index)
	must.Greater(t, hdr.Index, resp.RestoredIndex)

	for _, s := range servers {
		must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
			n, err := s.State().NodeByID(nil, later.ID)
			if err != nil || n != nil {
				return fmt.Errorf("server %s still has the node written after the snapshot (%v)", s.ID(), err)
			}
			n, err = s.State().NodeByID(nil, kept.ID)
			if err != nil || n == nil {
				return fmt.Errorf("server %s lacks the snapshot's node (%v)", s.ID(), err)
			}
			return nil
		}), wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond)))
	}

	// The restored cluster takes writes.
	registerNode(t, follower, testNode("after-restore"))
}

// waitAllHaveNode waits until every server has applied the node.
func waitAllHaveNode(t *testing.T, servers []*Server, id string) {
	t.Helper()
	for _, s := range servers {
		must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
			n, err := s.State().NodeByID(nil, id)
			if err != nil || n == nil {
				return fmt.Errorf("server %s lacks node %s (%v)", s.ID(), id, err)
			}
			return nil
		}), wait.Timeout(10*time.Second), wait.Gap(10*time.Millisecond)))
	}
}

func TestOperator_SnapshotUploadLimits(t *testing.T) {
	s := testServer(t, func(c *Config) {
		c.BootstrapExpect = 1
		c.SnapshotMaxBytes = 100
	})
	waitForLeader(t, s)
	var up structs.SnapshotUploadResponse
	err := s.RPC("Operator.SnapshotUpload", &structs.SnapshotUploadRequest{Offset: 5, Data: []byte("x")}, &up)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.NoError(t, s.RPC("Operator.SnapshotUpload", &structs.SnapshotUploadRequest{Data: make([]byte, 60)}, &up))
	id := up.ID
	err = s.RPC("Operator.SnapshotUpload", &structs.SnapshotUploadRequest{ID: id, Offset: 10, Data: make([]byte, 60)}, &up)
	must.ErrorContains(t, err, "offset 10")
	err = s.RPC("Operator.SnapshotUpload", &structs.SnapshotUploadRequest{ID: id, Offset: 60, Data: make([]byte, 60)}, &up)
	must.ErrorContains(t, err, "too large")
	// The oversized upload is gone.
	var resp structs.SnapshotRestoreResponse
	err = s.RPC("Operator.SnapshotRestore", &structs.SnapshotRestoreRequest{ID: id}, &resp)
	must.ErrorIs(t, err, structs.ErrNotFound)
}

// A restore waits for the controller calls in flight, as a handoff does:
// one that ended after the restore would checkpoint into the restored
// state.
func TestOperator_SnapshotRestoreDrainsControllerCalls(t *testing.T) {
	t.Parallel()
	s := testServer(t, nil)
	waitForLeaderDuties(t, s)
	file := downloadSnapshot(t, s)
	release, finished := holdControllerCall(t, s)
	before := s.fsm.State()
	swapped := func() bool { return s.fsm.State() != before }

	done := make(chan error, 1)
	go func() {
		_, err := uploadSnapshot(s, file)
		done <- err
	}()
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return s.lanes.Load() == nil }),
		wait.Timeout(5*time.Second), wait.Gap(5*time.Millisecond)))
	// Without the drain the store is swapped within milliseconds of the
	// lanes closing; it gets a second to (wrongly) do so.
	deadline := time.Now().Add(time.Second)
	for !swapped() && time.Now().Before(deadline) {
		select {
		case <-time.After(5 * time.Millisecond):
		case err := <-done:
			t.Fatalf("restore finished while a controller call was in flight: %v", err)
		}
	}
	must.False(t, swapped(), must.Sprint("the state was restored while a controller call was in flight"))

	close(release)
	<-finished
	must.NoError(t, <-done)
	must.True(t, swapped())
	waitForLeaderDuties(t, s)
}
