package nomad

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	memdb "github.com/hashicorp/go-memdb"
	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// memSink is a raft.SnapshotSink that keeps the snapshot in memory.
type memSink struct {
	bytes.Buffer
	closed    bool
	cancelled bool
}

var _ raft.SnapshotSink = (*memSink)(nil)

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Close() error  { s.closed = true; return nil }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }

// failingSink fails every write, to exercise Persist's error path.
type failingSink struct{ memSink }

func (s *failingSink) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func testFSM(t *testing.T) *FSM {
	t.Helper()
	f, err := NewFSM(hclog.NewNullLogger())
	must.NoError(t, err)
	return f
}

// applyEntry applies one encoded request at index, as Raft would, and
// returns what the FSM answered.
func applyEntry(t *testing.T, f *FSM, index uint64, typ structs.MessageType, req any) any {
	t.Helper()
	buf, err := structs.Encode(typ, req)
	must.NoError(t, err)
	return f.Apply(&raft.Log{Type: raft.LogCommand, Index: index, Data: buf})
}

func mustApply(t *testing.T, f *FSM, index uint64, typ structs.MessageType, req any) {
	t.Helper()
	resp := applyEntry(t, f, index, typ, req)
	if err, ok := resp.(error); ok {
		t.Fatalf("apply %s at %d: %v", typ, index, err)
	}
	must.Nil(t, resp)
}

// richNode is a node with every kind of field set, so a snapshot round trip
// that drops or mangles one is caught.
func richNode(i int) *structs.Node {
	n := testNode("rich-" + strconv.Itoa(i))
	n.NodeClass = "class-" + strconv.Itoa(i%3)
	n.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", 4646+i)
	n.Meta = map[string]string{"rack": "r" + strconv.Itoa(i%2), "empty": ""}
	n.StatusDescription = "fine"
	n.StatusUpdatedAt = 1700000000 + int64(i)
	n.Drivers = map[string]*structs.DriverInfo{
		"raw_exec": {
			Attributes:        map[string]string{"driver.raw_exec": "true"},
			Detected:          true,
			Healthy:           i%2 == 0,
			HealthDescription: "healthy",
			UpdateTime:        time.Date(2026, 1, 2, 3, 4, 5, 600+i, time.UTC),
		},
	}
	n.CSINodePlugins = map[string]*structs.CSIInfo{
		"hostpath": {PluginID: "hostpath", AllocID: "alloc-" + strconv.Itoa(i), Healthy: true},
	}
	if i%2 == 0 {
		n.CSIControllerPlugins = map[string]*structs.CSIInfo{
			"hostpath": {PluginID: "hostpath", Healthy: true, UpdateTime: time.Unix(1700000000, int64(i)).UTC()},
		}
	}
	if i%3 == 0 {
		n.SchedulingEligibility = structs.NodeSchedulingIneligible
	}
	return n
}

// populateFSM writes nodes, status changes and a deregistration through
// Apply and returns the next free index.
func populateFSM(t *testing.T, f *FSM) uint64 {
	t.Helper()
	index := uint64(1)
	var ids []string
	for i := range 12 {
		n := richNode(i)
		ids = append(ids, n.ID)
		mustApply(t, f, index, structs.NodeRegisterRequestType, &structs.NodeRegisterRequest{Node: n})
		index++
	}
	for _, id := range ids[:4] {
		mustApply(t, f, index, structs.NodeUpdateStatusRequestType, &structs.NodeUpdateStatusRequest{
			NodeID: id, Status: structs.NodeStatusDown, UpdatedAt: 1800000000,
		})
		index++
	}
	mustApply(t, f, index, structs.NodeDeregisterRequestType, &structs.NodeDeregisterRequest{NodeIDs: ids[10:]})
	index++
	// A re-registration keeps its CreateIndex; the snapshot must too.
	again := richNode(5)
	again.ID = ids[5]
	again.SecretID = "resecret"
	mustApply(t, f, index, structs.NodeRegisterRequestType, &structs.NodeRegisterRequest{Node: again})
	index++
	return index
}

type storeContents struct {
	nodes   []*structs.Node
	indexes []*state.IndexEntry
	latest  uint64
}

func contentsOf(t *testing.T, s *state.StateStore) storeContents {
	t.Helper()
	nodes, err := s.Nodes(nil)
	must.NoError(t, err)
	indexes, err := s.Indexes()
	must.NoError(t, err)
	latest, err := s.LatestIndex()
	must.NoError(t, err)
	return storeContents{nodes: nodes, indexes: indexes, latest: latest}
}

func requireSameContents(t *testing.T, want, got storeContents) {
	t.Helper()
	must.Eq(t, len(want.nodes), len(got.nodes))
	for i := range want.nodes {
		must.Eq(t, want.nodes[i], got.nodes[i], must.Sprintf("node %s", want.nodes[i].ID))
	}
	must.Eq(t, want.indexes, got.indexes)
	must.Eq(t, want.latest, got.latest)
}

// snapshotBytes takes a snapshot of f and persists it into memory.
func snapshotBytes(t *testing.T, f *FSM) []byte {
	t.Helper()
	snap, err := f.Snapshot()
	must.NoError(t, err)
	defer snap.Release()
	sink := &memSink{}
	must.NoError(t, snap.Persist(sink))
	must.True(t, sink.closed)
	must.False(t, sink.cancelled)
	return sink.Bytes()
}

func TestFSM_SnapshotRestore(t *testing.T) {
	src := testFSM(t)
	next := populateFSM(t, src)
	want := contentsOf(t, src.State())
	must.Len(t, 10, want.nodes)
	must.Eq(t, next-1, want.latest)

	snap, err := src.Snapshot()
	must.NoError(t, err)
	defer snap.Release()

	// Writes after Snapshot are not in it: it is a point in time, and
	// Persist may run while Apply goes on.
	mustApply(t, src, next, structs.NodeRegisterRequestType, &structs.NodeRegisterRequest{Node: testNode("after")})
	mustApply(t, src, next+1, structs.NodeUpdateStatusRequestType, &structs.NodeUpdateStatusRequest{
		NodeID: want.nodes[0].ID, Status: structs.NodeStatusReady,
	})

	sink := &memSink{}
	must.NoError(t, snap.Persist(sink))
	must.True(t, sink.closed)

	dst := testFSM(t)
	must.NoError(t, dst.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))))
	requireSameContents(t, want, contentsOf(t, dst.State()))

	// Secrets are restored with their index: a node can still be found by
	// its secret after a restore.
	for _, n := range want.nodes {
		got, err := dst.State().NodeBySecretID(nil, n.SecretID)
		must.NoError(t, err)
		must.NotNil(t, got)
		must.Eq(t, n.ID, got.ID)
	}

	// A snapshot of the restored FSM restores to the same state again.
	// (Not the same bytes: maps encode in no fixed order.)
	third := testFSM(t)
	must.NoError(t, third.Restore(io.NopCloser(bytes.NewReader(snapshotBytes(t, dst)))))
	requireSameContents(t, want, contentsOf(t, third.State()))

	// The restored FSM goes on applying where the log left off.
	mustApply(t, dst, next, structs.NodeRegisterRequestType, &structs.NodeRegisterRequest{Node: testNode("after")})
	idx, err := dst.State().Index(state.TableNodes)
	must.NoError(t, err)
	must.Eq(t, next, idx)
}

func TestFSM_SnapshotRestoreEmpty(t *testing.T) {
	src := testFSM(t)
	dst := testFSM(t)
	// Give dst something a restore must throw away.
	mustApply(t, dst, 1, structs.NodeRegisterRequestType, &structs.NodeRegisterRequest{Node: testNode("stale")})

	buf := snapshotBytes(t, src)
	must.NoError(t, dst.Restore(io.NopCloser(bytes.NewReader(buf))))
	got := contentsOf(t, dst.State())
	must.SliceEmpty(t, got.nodes)
	must.SliceEmpty(t, got.indexes)
	must.Zero(t, got.latest)
}

func TestFSM_PersistFailureCancelsSink(t *testing.T) {
	f := testFSM(t)
	populateFSM(t, f)
	snap, err := f.Snapshot()
	must.NoError(t, err)
	defer snap.Release()

	sink := &failingSink{}
	must.Error(t, snap.Persist(sink))
	must.True(t, sink.cancelled)
	must.False(t, sink.closed)
}

func TestFSM_RestoreWakesWatchersOnOldStore(t *testing.T) {
	src := testFSM(t)
	populateFSM(t, src)
	buf := snapshotBytes(t, src)

	dst := testFSM(t)
	watched := testNode("watched")
	mustApply(t, dst, 1, structs.NodeRegisterRequestType, &structs.NodeRegisterRequest{Node: watched})
	old := dst.State()

	// A blocked query watches what it read plus the store's abandon
	// channel, as blockingRPC does.
	ws := memdb.NewWatchSet()
	ws.Add(old.AbandonCh())
	_, err := old.NodeByID(ws, watched.ID)
	must.NoError(t, err)
	woke := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	go func() { woke <- ws.WatchCtx(ctx) }()

	must.NoError(t, dst.Restore(io.NopCloser(bytes.NewReader(buf))))

	select {
	case err := <-woke:
		must.NoError(t, err, must.Sprint("watch ended by its timeout, not by the restore"))
	case <-time.After(10 * time.Second):
		t.Fatal("restore did not wake the watcher on the old store")
	}
	select {
	case <-old.AbandonCh():
	default:
		t.Fatal("old store's abandon channel is still open")
	}
	must.NotEq(t, old, dst.State())
	select {
	case <-dst.State().AbandonCh():
		t.Fatal("the new store is abandoned")
	default:
	}
	n, err := dst.State().NodeByID(nil, watched.ID)
	must.NoError(t, err)
	must.Nil(t, n)
}

func TestFSM_RestoreBadStreamKeepsState(t *testing.T) {
	src := testFSM(t)
	populateFSM(t, src)
	good := snapshotBytes(t, src)

	// The end record on its own, to cut a stream at a record boundary
	// just before it.
	end := msgpackBytes(t, snapEnd)

	cases := map[string][]byte{
		"empty":                 nil,
		"truncated":             good[:len(good)/2],
		"missing end record":    good[:len(good)-len(end)],
		"unknown record type":   append(msgpackBytes(t, snapshotRecord(200)), good...),
		"garbage":               []byte("not a snapshot at all"),
		"node record, bad body": concatBytes(msgpackBytes(t, snapNode), []byte{0xc1}),
	}
	for name, stream := range cases {
		t.Run(name, func(t *testing.T) {
			dst := testFSM(t)
			mustApply(t, dst, 1, structs.NodeRegisterRequestType, &structs.NodeRegisterRequest{Node: testNode("kept")})
			before := contentsOf(t, dst.State())
			old := dst.State()

			rc := &trackingReader{r: bytes.NewReader(stream)}
			must.Error(t, dst.Restore(rc))
			must.True(t, rc.closed, must.Sprint("restore did not close its reader"))

			must.Eq(t, old, dst.State())
			requireSameContents(t, before, contentsOf(t, dst.State()))
			select {
			case <-old.AbandonCh():
				t.Fatal("a failed restore abandoned the live store")
			default:
			}
		})
	}
}

type trackingReader struct {
	r      io.Reader
	closed bool
}

func (r *trackingReader) Read(p []byte) (int, error) { return r.r.Read(p) }
func (r *trackingReader) Close() error               { r.closed = true; return nil }

func TestFSM_ApplyUnknownOrBadEntries(t *testing.T) {
	f := testFSM(t)
	populateFSM(t, f)
	before := contentsOf(t, f.State())

	goodBody, err := structs.Encode(structs.NodeRegisterRequestType, &structs.NodeRegisterRequest{Node: testNode("x")})
	must.NoError(t, err)

	cases := []struct {
		name    string
		log     *raft.Log
		wantErr error // nil: the entry is ignored without an error
		anyErr  bool
	}{
		{
			name:    "unknown message type",
			log:     &raft.Log{Type: raft.LogCommand, Index: 100, Data: append([]byte{0xee}, goodBody[1:]...)},
			wantErr: errUnknownMessage,
		},
		{
			name:    "unknown message type without body",
			log:     &raft.Log{Type: raft.LogCommand, Index: 101, Data: []byte{0x7f}},
			wantErr: errUnknownMessage,
		},
		{
			name:   "register with undecodable body",
			log:    &raft.Log{Type: raft.LogCommand, Index: 102, Data: []byte{byte(structs.NodeRegisterRequestType), 0xc1}},
			anyErr: true,
		},
		{
			name:   "register with truncated body",
			log:    &raft.Log{Type: raft.LogCommand, Index: 103, Data: goodBody[:len(goodBody)/2]},
			anyErr: true,
		},
		{
			name: "status update for an unknown node",
			log: func() *raft.Log {
				buf, err := structs.Encode(structs.NodeUpdateStatusRequestType, &structs.NodeUpdateStatusRequest{
					NodeID: "no-such-node", Status: structs.NodeStatusDown,
				})
				must.NoError(t, err)
				return &raft.Log{Type: raft.LogCommand, Index: 104, Data: buf}
			}(),
			wantErr: structs.ErrUnknownNode,
		},
		{
			name: "deregister with an unknown node",
			log: func() *raft.Log {
				buf, err := structs.Encode(structs.NodeDeregisterRequestType, &structs.NodeDeregisterRequest{
					NodeIDs: []string{before.nodes[0].ID, "no-such-node"},
				})
				must.NoError(t, err)
				return &raft.Log{Type: raft.LogCommand, Index: 105, Data: buf}
			}(),
			wantErr: structs.ErrUnknownNode,
		},
		{
			name: "empty command",
			log:  &raft.Log{Type: raft.LogCommand, Index: 106},
		},
		{
			name: "not a command",
			log:  &raft.Log{Type: raft.LogNoop, Index: 107, Data: goodBody},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := f.Apply(tc.log)
			switch {
			case tc.wantErr != nil:
				err, ok := resp.(error)
				must.True(t, ok, must.Sprintf("want an error value, got %T %v", resp, resp))
				must.ErrorIs(t, err, tc.wantErr)
			case tc.anyErr:
				err, ok := resp.(error)
				must.True(t, ok, must.Sprintf("want an error value, got %T %v", resp, resp))
				must.Error(t, err)
			default:
				must.Nil(t, resp)
			}
			requireSameContents(t, before, contentsOf(t, f.State()))
		})
	}
}

func TestFSM_SnapshotSurvivesRestart(t *testing.T) {
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.RaftSnapshotThreshold = 5
		c.RaftSnapshotInterval = 50 * time.Millisecond
	})
	waitForLeaderDuties(t, srv)

	for i := range 50 {
		registerNodeRetry(t, srv, testNode("persisted-"+strconv.Itoa(i)))
	}
	want := contentsOf(t, srv.State())
	must.Len(t, 50, want.nodes)

	// Force a snapshot of everything applied. A background snapshot that
	// already covers the last index leaves nothing new: that is fine too.
	if err := srv.Raft().Snapshot().Error(); err != nil {
		must.ErrorIs(t, err, raft.ErrNothingNewToSnapshot)
	}
	snapIndex, err := strconv.ParseUint(srv.Raft().Stats()["last_snapshot_index"], 10, 64)
	must.NoError(t, err)
	must.GreaterEq(t, want.latest, snapIndex)

	cfg := srv.Config()
	addr := srv.Addr()
	id := srv.ID()
	must.NoError(t, srv.Shutdown(context.Background()))

	ln, err := net.Listen("tcp", addr)
	must.NoError(t, err)
	restarted := testServer(t, func(c *Config) {
		*c = *cfg
		c.Listener = ln
	})
	must.Eq(t, id, restarted.ID())

	// Raft restores the newest snapshot while the server starts, before
	// any log entry is replayed: everything is there at once.
	requireSameContents(t, want, contentsOf(t, restarted.State()))

	// It leads again, keeps everything, and takes writes.
	waitForLeaderDuties(t, restarted)
	registerNodeRetry(t, restarted, testNode("after-restart"))
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		nodes, err := restarted.State().Nodes(nil)
		if err != nil {
			return err
		}
		if len(nodes) != 51 {
			return fmt.Errorf("%d nodes, want 51", len(nodes))
		}
		return nil
	}), wait.Timeout(5*time.Second), wait.Gap(10*time.Millisecond)))
	for _, n := range want.nodes {
		got := mustGetNode(t, restarted, n.ID)
		must.Eq(t, n.CreateIndex, got.CreateIndex)
		must.Eq(t, n.SecretID, got.SecretID)
	}
}

func TestFSM_RestoreWakesBlockingQuery(t *testing.T) {
	srv := testServer(t, withLongHeartbeats)
	waitForLeaderDuties(t, srv)
	reg := registerNodeRetry(t, srv, testNode("before-restore"))

	// A snapshot from elsewhere, far ahead of this server's log.
	other := testFSM(t)
	restored := testNode("from-snapshot")
	mustApply(t, other, reg.Index+1000, structs.NodeRegisterRequestType, &structs.NodeRegisterRequest{Node: restored})
	buf := snapshotBytes(t, other)

	type result struct {
		resp structs.NodeListResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = srv.RPC("Node.List", &structs.NodeListRequest{QueryOptions: structs.QueryOptions{
			MinQueryIndex: reg.Index,
			MaxQueryTime:  30 * time.Second,
		}}, &r.resp)
		done <- r
	}()

	// Restore straight into the server's FSM, as Raft does when it
	// installs a snapshot from the leader. (Should the restore win the race
	// with the query's first read, the query sees the new index at once;
	// TestFSM_RestoreWakesWatchersOnOldStore covers the wake-up itself.)
	must.NoError(t, srv.fsm.Restore(io.NopCloser(bytes.NewReader(buf))))

	select {
	case r := <-done:
		must.NoError(t, r.err)
		must.Eq(t, reg.Index+1000, r.resp.Index)
		must.Len(t, 1, r.resp.Nodes)
		must.Eq(t, restored.ID, r.resp.Nodes[0].ID)
	case <-time.After(10 * time.Second):
		t.Fatal("blocking query not woken by the restore")
	}
}

// Jobs, allocations and evaluations travel through a snapshot too.
func TestFSM_SnapshotRestoreWorkloads(t *testing.T) {
	src := testFSM(t)
	st := src.State()
	job := &structs.Job{
		ID: "web", Name: "web", Namespace: structs.DefaultNamespace, Type: structs.JobTypeService, Priority: 50,
		TaskGroups: []*structs.TaskGroup{{Name: "g", Count: 2, Tasks: []*structs.Task{{
			Name: "t", Driver: "raw_exec", Config: map[string]any{"command": "/bin/sleep", "args": []any{"60"}},
		}}}},
	}
	must.NoError(t, st.UpsertJob(5, job))
	alloc := &structs.Allocation{
		ID: "a1", Namespace: structs.DefaultNamespace, JobID: "web", Job: job, TaskGroup: "g", NodeID: "n1",
		Name: structs.AllocName("web", "g", 0), DesiredStatus: structs.AllocDesiredStatusRun,
		ClientStatus: structs.AllocClientStatusRunning,
		TaskStates:   map[string]*structs.TaskState{"t": {State: structs.TaskStateRunning, Restarts: 1}},
	}
	must.NoError(t, st.UpsertAllocs(6, []*structs.Allocation{alloc}))
	eval := &structs.Evaluation{ID: "e1", Namespace: structs.DefaultNamespace, JobID: "web",
		Status: structs.EvalStatusComplete, QueuedAllocations: map[string]int{"g": 0}}
	must.NoError(t, st.UpsertEvals(7, []*structs.Evaluation{eval}))

	dst := testFSM(t)
	must.NoError(t, dst.Restore(io.NopCloser(bytes.NewReader(snapshotBytes(t, src)))))

	gotJob, err := dst.State().JobByID(nil, structs.DefaultNamespace, "web")
	must.NoError(t, err)
	wantJob, err := st.JobByID(nil, structs.DefaultNamespace, "web")
	must.NoError(t, err)
	must.Eq(t, wantJob, gotJob)
	gotAlloc, err := dst.State().AllocByID(nil, "a1")
	must.NoError(t, err)
	wantAlloc, err := st.AllocByID(nil, "a1")
	must.NoError(t, err)
	must.Eq(t, wantAlloc, gotAlloc)
	byNode, err := dst.State().AllocsByNode(nil, "n1")
	must.NoError(t, err)
	must.Len(t, 1, byNode)
	gotEval, err := dst.State().EvalByID(nil, "e1")
	must.NoError(t, err)
	must.Eq(t, uint64(7), gotEval.ModifyIndex)
	must.Eq(t, map[string]int{"g": 0}, gotEval.QueuedAllocations)
	for _, table := range []string{state.TableJobs, state.TableAllocs, state.TableEvals} {
		idx, err := dst.State().Index(table)
		must.NoError(t, err)
		want, err := st.Index(table)
		must.NoError(t, err)
		must.Eq(t, want, idx, must.Sprint(table))
	}
}
