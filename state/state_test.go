package state

import (
	"fmt"
	"sort"
	"testing"
	"time"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func testStore(t *testing.T) *StateStore {
	t.Helper()
	s, err := NewStateStore()
	must.NoError(t, err)
	return s
}

func mockNode(id string) *structs.Node {
	return &structs.Node{
		ID:         id,
		SecretID:   "secret-" + id,
		Name:       "node-" + id,
		Datacenter: "dc1",
		Status:     structs.NodeStatusReady,
		Attributes: map[string]string{"os.name": "linux"},
		Meta:       map[string]string{"rack": "r1"},
	}
}

// fired reports whether any channel in ws is closed. Memdb closes watch
// channels inside Commit, so right after a write this is deterministic.
func fired(ws memdb.WatchSet) bool {
	for ch := range ws {
		select {
		case <-ch:
			return true
		default:
		}
	}
	return false
}

func nodesIndex(t *testing.T, s *StateStore) uint64 {
	t.Helper()
	idx, err := s.Index(TableNodes)
	must.NoError(t, err)
	return idx
}

func TestStateStore_UpsertNode(t *testing.T) {
	cases := []struct {
		name string
		// existing, when set, is registered at index 10 first.
		existing *structs.Node
		node     *structs.Node
		index    uint64

		wantCreate      uint64
		wantEligibility string
		wantStatus      string
		wantTableIndex  uint64
	}{
		{
			name:            "new node defaults to eligible",
			node:            mockNode("a"),
			index:           5,
			wantCreate:      5,
			wantEligibility: structs.NodeSchedulingEligible,
			wantStatus:      structs.NodeStatusReady,
			wantTableIndex:  5,
		},
		{
			name: "new node keeps the eligibility it was given",
			node: func() *structs.Node {
				n := mockNode("a")
				n.SchedulingEligibility = structs.NodeSchedulingIneligible
				return n
			}(),
			index:           5,
			wantCreate:      5,
			wantEligibility: structs.NodeSchedulingIneligible,
			wantStatus:      structs.NodeStatusReady,
			wantTableIndex:  5,
		},
		{
			name: "empty status becomes initializing",
			node: func() *structs.Node {
				n := mockNode("a")
				n.Status = ""
				return n
			}(),
			index:           5,
			wantCreate:      5,
			wantEligibility: structs.NodeSchedulingEligible,
			wantStatus:      structs.NodeStatusInit,
			wantTableIndex:  5,
		},
		{
			name: "re-register keeps create index and eligibility",
			existing: func() *structs.Node {
				n := mockNode("a")
				n.SchedulingEligibility = structs.NodeSchedulingIneligible
				return n
			}(),
			node: func() *structs.Node {
				n := mockNode("a")
				n.Name = "renamed"
				n.SchedulingEligibility = structs.NodeSchedulingEligible
				n.CreateIndex = 999
				return n
			}(),
			index:           20,
			wantCreate:      10,
			wantEligibility: structs.NodeSchedulingIneligible,
			wantStatus:      structs.NodeStatusReady,
			wantTableIndex:  20,
		},
		{
			name:     "re-register with empty eligibility keeps the old one",
			existing: mockNode("a"),
			node: func() *structs.Node {
				n := mockNode("a")
				n.Status = structs.NodeStatusInit
				return n
			}(),
			index:           20,
			wantCreate:      10,
			wantEligibility: structs.NodeSchedulingEligible,
			wantStatus:      structs.NodeStatusInit,
			wantTableIndex:  20,
		},
		{
			name:            "a lower index does not move the table index back",
			existing:        mockNode("b"),
			node:            mockNode("a"),
			index:           3,
			wantCreate:      3,
			wantEligibility: structs.NodeSchedulingEligible,
			wantStatus:      structs.NodeStatusReady,
			wantTableIndex:  10,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := testStore(t)
			if tc.existing != nil {
				must.NoError(t, s.UpsertNode(10, tc.existing))
			}
			in := tc.node.Copy()
			must.NoError(t, s.UpsertNode(tc.index, in))
			// The caller's object is not taken over or changed.
			must.Eq(t, tc.node, in)

			got, err := s.NodeByID(nil, tc.node.ID)
			must.NoError(t, err)
			must.NotNil(t, got)
			must.Eq(t, tc.wantCreate, got.CreateIndex)
			must.Eq(t, tc.index, got.ModifyIndex)
			must.Eq(t, tc.wantEligibility, got.SchedulingEligibility)
			must.Eq(t, tc.wantStatus, got.Status)
			must.Eq(t, tc.node.Name, got.Name)
			must.Eq(t, tc.wantTableIndex, nodesIndex(t, s))

			bySecret, err := s.NodeBySecretID(nil, tc.node.SecretID)
			must.NoError(t, err)
			must.Eq(t, got, bySecret)
		})
	}
}

func TestStateStore_UpsertNode_ReadObjectsNotMutated(t *testing.T) {
	s := testStore(t)
	must.NoError(t, s.UpsertNode(1, mockNode("a")))
	before, err := s.NodeByID(nil, "a")
	must.NoError(t, err)
	saved := before.Copy()

	n := mockNode("a")
	n.Name = "changed"
	n.Meta["rack"] = "r2"
	must.NoError(t, s.UpsertNode(2, n))
	must.NoError(t, s.UpdateNodeStatus(3, "a", structs.NodeStatusDown, 42))

	// What a reader got earlier is unchanged by later writes.
	must.Eq(t, saved, before)
}

func TestStateStore_UpdateNodeStatus(t *testing.T) {
	cases := []struct {
		name      string
		nodeID    string
		status    string
		wantErr   error
		wantIndex uint64
	}{
		{name: "known node goes down", nodeID: "a", status: structs.NodeStatusDown, wantIndex: 7},
		{name: "known node back to ready", nodeID: "a", status: structs.NodeStatusReady, wantIndex: 7},
		{name: "unknown node", nodeID: "nope", status: structs.NodeStatusDown, wantErr: structs.ErrUnknownNode, wantIndex: 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := testStore(t)
			must.NoError(t, s.UpsertNode(5, mockNode("a")))
			before, err := s.NodeByID(nil, "a")
			must.NoError(t, err)

			err = s.UpdateNodeStatus(7, tc.nodeID, tc.status, 1234)
			must.Eq(t, tc.wantIndex, nodesIndex(t, s))
			if tc.wantErr != nil {
				must.ErrorIs(t, err, tc.wantErr)
				after, err := s.NodeByID(nil, "a")
				must.NoError(t, err)
				must.Eq(t, before, after)
				missing, err := s.NodeByID(nil, tc.nodeID)
				must.NoError(t, err)
				must.Nil(t, missing)
				return
			}
			must.NoError(t, err)
			got, err := s.NodeByID(nil, tc.nodeID)
			must.NoError(t, err)
			must.Eq(t, tc.status, got.Status)
			must.Eq(t, int64(1234), got.StatusUpdatedAt)
			must.Eq(t, uint64(7), got.ModifyIndex)
			must.Eq(t, uint64(5), got.CreateIndex)
			must.Eq(t, before.Name, got.Name)
			must.Eq(t, before.SchedulingEligibility, got.SchedulingEligibility)
		})
	}
}

func TestStateStore_DeleteNodes(t *testing.T) {
	cases := []struct {
		name      string
		delete    []string
		wantErr   error
		wantLeft  []string
		wantIndex uint64
	}{
		{name: "one", delete: []string{"b"}, wantLeft: []string{"a", "c"}, wantIndex: 9},
		{name: "several", delete: []string{"c", "a"}, wantLeft: []string{"b"}, wantIndex: 9},
		{name: "all", delete: []string{"a", "b", "c"}, wantLeft: nil, wantIndex: 9},
		{
			name:      "unknown alone",
			delete:    []string{"zzz"},
			wantErr:   structs.ErrUnknownNode,
			wantLeft:  []string{"a", "b", "c"},
			wantIndex: 3,
		},
		{
			name:      "unknown after known ones removes nothing",
			delete:    []string{"a", "b", "zzz"},
			wantErr:   structs.ErrUnknownNode,
			wantLeft:  []string{"a", "b", "c"},
			wantIndex: 3,
		},
		{
			name:      "same id twice fails the second time and removes nothing",
			delete:    []string{"a", "a"},
			wantErr:   structs.ErrUnknownNode,
			wantLeft:  []string{"a", "b", "c"},
			wantIndex: 3,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := testStore(t)
			for i, id := range []string{"a", "b", "c"} {
				must.NoError(t, s.UpsertNode(uint64(i+1), mockNode(id)))
			}
			err := s.DeleteNodes(9, tc.delete)
			if tc.wantErr != nil {
				must.ErrorIs(t, err, tc.wantErr)
			} else {
				must.NoError(t, err)
			}
			nodes, err := s.Nodes(nil)
			must.NoError(t, err)
			var left []string
			for _, n := range nodes {
				left = append(left, n.ID)
			}
			must.Eq(t, tc.wantLeft, left)
			must.Eq(t, tc.wantIndex, nodesIndex(t, s))
			for _, id := range tc.delete {
				if tc.wantErr != nil {
					break
				}
				// Deleted nodes are gone from the secret index too.
				n, err := s.NodeBySecretID(nil, "secret-"+id)
				must.NoError(t, err)
				must.Nil(t, n)
			}
		})
	}
}

func TestStateStore_NodesByIDPrefix(t *testing.T) {
	s := testStore(t)
	ids := []string{"bb02", "aa10", "ab00", "aa01", "c000", "aa00", "b000"}
	for i, id := range ids {
		must.NoError(t, s.UpsertNode(uint64(i+1), mockNode(id)))
	}
	cases := []struct {
		prefix string
		want   []string
	}{
		{prefix: "", want: []string{"aa00", "aa01", "aa10", "ab00", "b000", "bb02", "c000"}},
		{prefix: "a", want: []string{"aa00", "aa01", "aa10", "ab00"}},
		{prefix: "aa0", want: []string{"aa00", "aa01"}},
		{prefix: "b", want: []string{"b000", "bb02"}},
		{prefix: "c000", want: []string{"c000"}},
		{prefix: "d", want: nil},
		{prefix: "aa000", want: nil},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("prefix %q", tc.prefix), func(t *testing.T) {
			nodes, err := s.NodesByIDPrefix(nil, tc.prefix)
			must.NoError(t, err)
			var got []string
			for _, n := range nodes {
				got = append(got, n.ID)
			}
			must.Eq(t, tc.want, got)
			must.True(t, sort.StringsAreSorted(got))
		})
	}

	all, err := s.Nodes(nil)
	must.NoError(t, err)
	must.Len(t, len(ids), all)
}

func TestStateStore_WatchSets(t *testing.T) {
	type read func(s *StateStore, ws memdb.WatchSet)
	byID := func(id string) read {
		return func(s *StateStore, ws memdb.WatchSet) {
			_, err := s.NodeByID(ws, id)
			must.NoError(t, err)
		}
	}
	byPrefix := func(prefix string) read {
		return func(s *StateStore, ws memdb.WatchSet) {
			_, err := s.NodesByIDPrefix(ws, prefix)
			must.NoError(t, err)
		}
	}
	bySecret := func(secret string) read {
		return func(s *StateStore, ws memdb.WatchSet) {
			_, err := s.NodeBySecretID(ws, secret)
			must.NoError(t, err)
		}
	}

	cases := []struct {
		name      string
		read      read
		write     func(s *StateStore) error
		wantFired bool
	}{
		{
			name:      "node by id, that node re-registered",
			read:      byID("aaaa"),
			write:     func(s *StateStore) error { return s.UpsertNode(10, mockNode("aaaa")) },
			wantFired: true,
		},
		{
			name:      "node by id, status changed",
			read:      byID("aaaa"),
			write:     func(s *StateStore) error { return s.UpdateNodeStatus(10, "aaaa", structs.NodeStatusDown, 1) },
			wantFired: true,
		},
		{
			name:      "node by id, deleted",
			read:      byID("aaaa"),
			write:     func(s *StateStore) error { return s.DeleteNodes(10, []string{"aaaa"}) },
			wantFired: true,
		},
		{
			name:      "node by id, another node changed",
			read:      byID("aaaa"),
			write:     func(s *StateStore) error { return s.UpdateNodeStatus(10, "bbbb", structs.NodeStatusDown, 1) },
			wantFired: false,
		},
		{
			name:      "missing node by id, registered",
			read:      byID("cccc"),
			write:     func(s *StateStore) error { return s.UpsertNode(10, mockNode("cccc")) },
			wantFired: true,
		},
		{
			name:      "list, node added",
			read:      byPrefix(""),
			write:     func(s *StateStore) error { return s.UpsertNode(10, mockNode("cccc")) },
			wantFired: true,
		},
		{
			name:      "list, status changed",
			read:      byPrefix(""),
			write:     func(s *StateStore) error { return s.UpdateNodeStatus(10, "bbbb", structs.NodeStatusDown, 1) },
			wantFired: true,
		},
		{
			name:      "prefix, node under it deleted",
			read:      byPrefix("bb"),
			write:     func(s *StateStore) error { return s.DeleteNodes(10, []string{"bbbb"}) },
			wantFired: true,
		},
		{
			name:      "by secret, node changed",
			read:      bySecret("secret-aaaa"),
			write:     func(s *StateStore) error { return s.UpdateNodeStatus(10, "aaaa", structs.NodeStatusDown, 1) },
			wantFired: true,
		},
		{
			name:      "failed write fires nothing",
			read:      byPrefix(""),
			write:     func(s *StateStore) error { _ = s.DeleteNodes(10, []string{"aaaa", "zzzz"}); return nil },
			wantFired: false,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := testStore(t)
			must.NoError(t, s.UpsertNode(1, mockNode("aaaa")))
			must.NoError(t, s.UpsertNode(2, mockNode("bbbb")))

			ws := memdb.NewWatchSet()
			tc.read(s, ws)
			must.MapNotEmpty(t, ws)
			must.False(t, fired(ws), must.Sprint("fired before any write"))

			must.NoError(t, tc.write(s))
			must.Eq(t, tc.wantFired, fired(ws))
		})
	}

	t.Run("nil watch set is a no-op", func(t *testing.T) {
		s := testStore(t)
		must.NoError(t, s.UpsertNode(1, mockNode("aaaa")))
		n, err := s.NodeByID(nil, "aaaa")
		must.NoError(t, err)
		must.NotNil(t, n)
		_, err = s.NodesByIDPrefix(nil, "")
		must.NoError(t, err)
	})

	t.Run("abandon closes the abandon channel", func(t *testing.T) {
		s := testStore(t)
		ws := memdb.NewWatchSet()
		ws.Add(s.AbandonCh())
		must.False(t, fired(ws))
		s.Abandon()
		must.True(t, fired(ws))
	})
}

func TestStateStore_IndexTable(t *testing.T) {
	s := testStore(t)

	// Nothing written yet: every table is at 0.
	must.Eq(t, uint64(0), nodesIndex(t, s))
	idx, err := s.Index("no-such-table")
	must.NoError(t, err)
	must.Eq(t, uint64(0), idx)
	latest, err := s.LatestIndex()
	must.NoError(t, err)
	must.Eq(t, uint64(0), latest)
	entries, err := s.Indexes()
	must.NoError(t, err)
	must.SliceEmpty(t, entries)

	steps := []struct {
		name  string
		write func() error
		want  uint64
	}{
		{"register", func() error { return s.UpsertNode(4, mockNode("a")) }, 4},
		{"status", func() error { return s.UpdateNodeStatus(6, "a", structs.NodeStatusDown, 1) }, 6},
		{"older index ignored", func() error { return s.UpsertNode(5, mockNode("b")) }, 6},
		{"failed write ignored", func() error { _ = s.UpdateNodeStatus(8, "zzz", structs.NodeStatusDown, 1); return nil }, 6},
		{"delete", func() error { return s.DeleteNodes(9, []string{"b"}) }, 9},
	}
	for _, step := range steps {
		must.NoError(t, step.write(), must.Sprint(step.name))
		must.Eq(t, step.want, nodesIndex(t, s), must.Sprint(step.name))
		latest, err := s.LatestIndex()
		must.NoError(t, err)
		must.Eq(t, step.want, latest, must.Sprint(step.name))
	}

	entries, err = s.Indexes()
	must.NoError(t, err)
	must.Eq(t, []*IndexEntry{{Key: TableNodes, Value: 9}}, entries)
}

func TestStateStore_SnapshotIsolated(t *testing.T) {
	s := testStore(t)
	must.NoError(t, s.UpsertNode(1, mockNode("a")))
	snap := s.Snapshot()

	must.NoError(t, s.UpsertNode(2, mockNode("b")))
	must.NoError(t, s.UpdateNodeStatus(3, "a", structs.NodeStatusDown, 1))

	nodes, err := snap.Nodes(nil)
	must.NoError(t, err)
	must.Len(t, 1, nodes)
	must.Eq(t, structs.NodeStatusReady, nodes[0].Status)
	idx, err := snap.Index(TableNodes)
	must.NoError(t, err)
	must.Eq(t, uint64(1), idx)

	// The snapshot shares the store's abandon channel, so a query reading a
	// snapshot is woken by a restore too.
	must.Eq(t, s.AbandonCh(), snap.AbandonCh())
}

func TestStateStore_Restore(t *testing.T) {
	src := testStore(t)
	for i, id := range []string{"a", "b", "c"} {
		must.NoError(t, src.UpsertNode(uint64(i+1), mockNode(id)))
	}
	must.NoError(t, src.UpdateNodeStatus(7, "b", structs.NodeStatusDown, 99))
	nodes, err := src.Nodes(nil)
	must.NoError(t, err)
	indexes, err := src.Indexes()
	must.NoError(t, err)

	t.Run("commit", func(t *testing.T) {
		dst := testStore(t)
		r := dst.Restore()
		for _, n := range nodes {
			must.NoError(t, r.Node(n))
		}
		for _, e := range indexes {
			must.NoError(t, r.IndexEntry(e))
		}
		r.Commit()

		got, err := dst.Nodes(nil)
		must.NoError(t, err)
		must.Eq(t, nodes, got)
		gotIdx, err := dst.Indexes()
		must.NoError(t, err)
		must.Eq(t, indexes, gotIdx)
		n, err := dst.NodeBySecretID(nil, "secret-c")
		must.NoError(t, err)
		must.NotNil(t, n)
	})

	t.Run("abort leaves the store empty", func(t *testing.T) {
		dst := testStore(t)
		r := dst.Restore()
		for _, n := range nodes {
			must.NoError(t, r.Node(n))
		}
		r.Abort()
		got, err := dst.Nodes(nil)
		must.NoError(t, err)
		must.SliceEmpty(t, got)
		must.Eq(t, uint64(0), nodesIndex(t, dst))
	})
}

// The drainer reads the draining nodes alone, and is woken when a node
// starts or stops draining, not when another node changes.
func TestStateStore_DrainingNodes(t *testing.T) {
	s := testStore(t)
	for i, id := range []string{"a", "b", "c"} {
		must.NoError(t, s.UpsertNode(uint64(i+1), mockNode(id)))
	}
	drain := func(index uint64, id string, on bool) {
		t.Helper()
		var strategy *structs.DrainStrategy
		if on {
			strategy = &structs.DrainStrategy{}
		}
		must.NoError(t, s.UpdateNodeDrain(index, id, strategy, false, !on, 0, nil))
	}
	drain(4, "b", true)

	ws := memdb.NewWatchSet()
	nodes, err := s.DrainingNodes(ws)
	must.NoError(t, err)
	must.Eq(t, []string{"b"}, nodeIDsOf(nodes))

	// Another node's change does not wake the drainer.
	c := mockNode("c")
	c.Name = "renamed"
	must.NoError(t, s.UpsertNode(5, c))
	must.True(t, ws.Watch(time.After(50*time.Millisecond)), must.Sprint("a change to a node that does not drain woke the drainer"))

	// A node that starts draining does.
	drain(6, "a", true)
	must.False(t, ws.Watch(time.After(10*time.Second)), must.Sprint("a node that started draining did not wake the drainer"))
	ws = memdb.NewWatchSet()
	nodes, err = s.DrainingNodes(ws)
	must.NoError(t, err)
	must.Eq(t, []string{"a", "b"}, nodeIDsOf(nodes))

	// And one that stops.
	drain(7, "b", false)
	must.False(t, ws.Watch(time.After(10*time.Second)), must.Sprint("a node that stopped draining did not wake the drainer"))
	nodes, err = s.DrainingNodes(nil)
	must.NoError(t, err)
	must.Eq(t, []string{"a"}, nodeIDsOf(nodes))
}

func nodeIDsOf(nodes []*structs.Node) []string {
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.ID
	}
	return ids
}
