package nomad

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/rpc"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

const testPlugin = "ebs"

// ctrlNode is a node with the given status and, when healthy is non-nil, a
// controller instance of testPlugin.
func ctrlNode(id, status string, healthy *bool) *structs.Node {
	n := &structs.Node{
		ID:                    id,
		Status:                status,
		SchedulingEligibility: "eligible",
		CSIControllerPlugins:  map[string]*structs.CSIInfo{},
	}
	if healthy != nil {
		n.CSIControllerPlugins[testPlugin] = &structs.CSIInfo{PluginID: testPlugin, Healthy: *healthy}
	}
	return n
}

func nodeIDs(nodes []*structs.Node) []string {
	ids := make([]string, 0, len(nodes))
	for _, n := range nodes {
		if n == nil {
			ids = append(ids, "<nil>")
			continue
		}
		ids = append(ids, n.ID)
	}
	return ids
}

func TestControllerCandidates(t *testing.T) {
	yes, no := true, false
	ready, down, initing := structs.NodeStatusReady, structs.NodeStatusDown, structs.NodeStatusInit

	ineligible := ctrlNode("n-ineligible", ready, &yes)
	ineligible.SchedulingEligibility = "ineligible"
	draining := ctrlNode("n-draining", ready, &yes)
	draining.SchedulingEligibility = "ineligible"
	draining.DrainStrategy = &structs.DrainStrategy{}
	draining.Drain = true
	otherPlugin := ctrlNode("n-other", ready, nil)
	otherPlugin.CSIControllerPlugins["nfs"] = &structs.CSIInfo{PluginID: "nfs", Healthy: true}

	cases := []struct {
		name  string
		nodes []*structs.Node
		want  []string
	}{
		{name: "none", nodes: nil, want: []string{}},
		{
			name:  "unhealthy instance skipped",
			nodes: []*structs.Node{ctrlNode("a", ready, &no), ctrlNode("b", ready, &yes)},
			want:  []string{"b"},
		},
		{
			name:  "down and initializing nodes skipped",
			nodes: []*structs.Node{ctrlNode("a", down, &yes), ctrlNode("b", initing, &yes), ctrlNode("c", ready, &yes)},
			want:  []string{"c"},
		},
		{
			name:  "draining and ineligible nodes used",
			nodes: []*structs.Node{draining, ineligible},
			want:  []string{"n-draining", "n-ineligible"},
		},
		{
			name:  "other plugin and no plugin skipped",
			nodes: []*structs.Node{otherPlugin, ctrlNode("n-none", ready, nil), nil},
			want:  []string{},
		},
		{
			name: "lowest node ID first",
			nodes: []*structs.Node{
				ctrlNode("d", ready, &yes), ctrlNode("b", ready, &yes), ctrlNode("e", ready, &yes),
				ctrlNode("a", ready, &yes), ctrlNode("c", ready, &yes),
			},
			want: []string{"a", "b", "c", "d", "e"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := nodeIDs(tc.nodes)
			got := controllerCandidates(tc.nodes, testPlugin)
			must.Eq(t, tc.want, nodeIDs(got))
			// The input is left as it was.
			must.Eq(t, before, nodeIDs(tc.nodes))
		})
	}
}

func TestControllerCandidates_ShuffledInputSorted(t *testing.T) {
	yes := true
	var nodes []*structs.Node
	for i := 0; i < 50; i++ {
		nodes = append(nodes, ctrlNode(fmt.Sprintf("node-%02d", i), structs.NodeStatusReady, &yes))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 20; round++ {
		rng.Shuffle(len(nodes), func(i, j int) { nodes[i], nodes[j] = nodes[j], nodes[i] })
		got := controllerCandidates(nodes, testPlugin)
		must.Len(t, 50, got)
		must.Eq(t, "node-00", got[0].ID)
		for i := 1; i < len(got); i++ {
			must.True(t, got[i-1].ID < got[i].ID)
		}
	}
}

func TestCallController(t *testing.T) {
	yes := true
	nodes := []*structs.Node{
		ctrlNode("a", structs.NodeStatusReady, &yes),
		ctrlNode("b", structs.NodeStatusReady, &yes),
		ctrlNode("c", structs.NodeStatusReady, &yes),
	}
	pluginErr := fmt.Errorf("controller publish: %w", structs.ErrCSIFailedPrecondition)

	cases := []struct {
		name       string
		candidates []*structs.Node
		answers    map[string]error // by node ID; missing means success
		wantNode   string           // "" means nil
		wantCalled []string
		wantErr    error // nil means success
	}{
		{
			name:       "first candidate answers",
			candidates: nodes,
			wantNode:   "a",
			wantCalled: []string{"a"},
		},
		{
			name:       "session on another server moves to next candidate",
			candidates: nodes,
			answers: map[string]error{
				"a": fmt.Errorf("forward to server s2: session is on another server: %w", errControllerUnavailable),
			},
			wantNode:   "b",
			wantCalled: []string{"a", "b"},
		},
		{
			name:       "plugin missing and node not connected move on",
			candidates: nodes,
			answers: map[string]error{
				"a": fmt.Errorf("client a: %w", structs.ErrCSIPluginNotFound),
				// As it arrives over RPC, still in its wire form.
				"b": rpc.ServerError(structs.EncodeRPCError(fmt.Errorf("%w: node b", structs.ErrNodeNotConnected))),
			},
			wantNode:   "c",
			wantCalled: []string{"a", "b", "c"},
		},
		{
			name:       "plugin error returned, not retried elsewhere",
			candidates: nodes,
			answers: map[string]error{
				"a": fmt.Errorf("client a: %w", errControllerUnavailable),
				"b": pluginErr,
			},
			wantNode:   "b",
			wantCalled: []string{"a", "b"},
			wantErr:    structs.ErrCSIFailedPrecondition,
		},
		{
			name:       "leader going away returned with no node",
			candidates: nodes,
			answers: map[string]error{
				"a": fmt.Errorf("forwarding hop: %w", structs.ErrNoLeader),
			},
			wantCalled: []string{"a"},
			wantErr:    structs.ErrNoLeader,
		},
		{
			name:       "leader loss wins over unavailable",
			candidates: nodes,
			answers: map[string]error{
				"a": fmt.Errorf("%w: %w", errControllerUnavailable, structs.ErrShutdown),
			},
			wantCalled: []string{"a"},
			wantErr:    structs.ErrShutdown,
		},
		{
			name:       "all unavailable",
			candidates: nodes,
			answers: map[string]error{
				"a": errControllerUnavailable,
				"b": structs.ErrNodeNotConnected,
				"c": structs.ErrCSIPluginNotFound,
			},
			wantCalled: []string{"a", "b", "c"},
			wantErr:    errControllerUnavailable,
		},
		{
			name:       "no candidates",
			candidates: nil,
			wantErr:    errControllerUnavailable,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			called := []string{}
			node, err := callController(t.Context(), testPlugin, slices.Values(tc.candidates),
				func(_ context.Context, n *structs.Node) error {
					called = append(called, n.ID)
					return tc.answers[n.ID]
				})
			if tc.wantErr == nil {
				must.NoError(t, err)
			} else {
				must.ErrorIs(t, err, tc.wantErr)
			}
			if tc.wantNode == "" {
				must.Nil(t, node)
			} else {
				must.NotNil(t, node)
				must.Eq(t, tc.wantNode, node.ID)
			}
			if tc.wantCalled == nil {
				tc.wantCalled = []string{}
			}
			must.Eq(t, tc.wantCalled, called)
		})
	}
}

func TestCallController_NoCandidatesNamesPlugin(t *testing.T) {
	_, err := callController(t.Context(), "my-plugin", nil, func(context.Context, *structs.Node) error {
		return errors.New("called with no candidates")
	})
	must.ErrorIs(t, err, errControllerUnavailable)
	must.StrContains(t, err.Error(), `"my-plugin"`)
}

func TestCallController_StopsWhenContextEnds(t *testing.T) {
	yes := true
	nodes := []*structs.Node{
		ctrlNode("a", structs.NodeStatusReady, &yes),
		ctrlNode("b", structs.NodeStatusReady, &yes),
	}
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	called := []string{}
	node, err := callController(ctx, testPlugin, slices.Values(nodes), func(_ context.Context, n *structs.Node) error {
		called = append(called, n.ID)
		cancel()
		return errControllerUnavailable
	})
	must.Nil(t, node)
	must.ErrorIs(t, err, context.Canceled)
	must.Eq(t, []string{"a"}, called)
}

// benchNodes10000 is 10,000 ready nodes; about a third run a healthy
// controller of testPlugin and a third one of another plugin.
func benchNodes10000() (nodes []*structs.Node, healthy int) {
	rng := rand.New(rand.NewPCG(7, 11))
	nodes = make([]*structs.Node, 10000)
	for i := range nodes {
		n := &structs.Node{
			ID:                   uuid.NewString(),
			SecretID:             uuid.NewString(),
			Status:               structs.NodeStatusReady,
			CSIControllerPlugins: map[string]*structs.CSIInfo{},
		}
		switch rng.IntN(3) {
		case 0:
			n.CSIControllerPlugins[testPlugin] = &structs.CSIInfo{PluginID: testPlugin, Healthy: true}
			healthy++
		case 1:
			n.CSIControllerPlugins["other"] = &structs.CSIInfo{PluginID: "other", Healthy: true}
		}
		nodes[i] = n
	}
	return nodes, healthy
}

// The choice itself: filter and sort a node list.
func BenchmarkControllerCandidates_10000Nodes(b *testing.B) {
	nodes, healthy := benchNodes10000()
	b.ReportAllocs()
	for b.Loop() {
		if got := controllerCandidates(nodes, testPlugin); len(got) != healthy {
			b.Fatalf("got %d candidates, want %d", len(got), healthy)
		}
	}
}

// What the lane runs per destructive call: read the plugin's candidates
// from the state store's index and take the first, the one the usual call
// goes to. Its cost must not grow with the number of nodes.
func BenchmarkPluginControllers_10000Nodes(b *testing.B) {
	nodes, healthy := benchNodes10000()
	store := benchControllerStore(b, nodes)
	want := controllerCandidates(nodes, testPlugin)[0].ID
	b.ReportAllocs()
	for b.Loop() {
		seq, err := pluginControllers(store, testPlugin)
		if err != nil {
			b.Fatal(err)
		}
		for n := range seq {
			if n.ID != want {
				b.Fatalf("first candidate %s, want %s (of %d)", n.ID, want, healthy)
			}
			break
		}
	}
}

// Every candidate in order: what a call pays when every controller but
// the last is unreachable.
func BenchmarkPluginControllers_10000NodesAll(b *testing.B) {
	nodes, healthy := benchNodes10000()
	store := benchControllerStore(b, nodes)
	b.ReportAllocs()
	for b.Loop() {
		seq, err := pluginControllers(store, testPlugin)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for range seq {
			n++
		}
		if n != healthy {
			b.Fatalf("got %d candidates, want %d", n, healthy)
		}
	}
}

func benchControllerStore(b *testing.B, nodes []*structs.Node) *state.StateStore {
	store, err := state.NewStateStore()
	must.NoError(b, err)
	for i, n := range nodes {
		must.NoError(b, store.UpsertNode(uint64(i+1), n))
	}
	return store
}

// The state store's index of candidates follows the rule of
// controllerCandidates through registrations, a controller turning
// unhealthy, a node going down and coming back, and deregistration; and a
// sequence read before a change still shows the state it was read at.
func TestPluginControllers_IndexFollowsRule(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	store, err := state.NewStateStore()
	must.NoError(t, err)
	live := map[string]*structs.Node{}
	index := uint64(0)
	check := func(step int) {
		var all []*structs.Node
		for _, n := range live {
			all = append(all, n)
		}
		seq, err := pluginControllers(store, testPlugin)
		must.NoError(t, err)
		got := nodeIDs(slices.Collect(seq))
		must.Eq(t, nodeIDs(controllerCandidates(all, testPlugin)), got, must.Sprintf("step %d", step))
		must.Eq(t, got, nodeIDs(slices.Collect(seq)), must.Sprintf("step %d: a second walk reads the same", step))
	}
	for step := range 400 {
		index++
		id := fmt.Sprintf("node-%03d", rng.IntN(60))
		if _, ok := live[id]; ok && rng.IntN(10) == 0 {
			delete(live, id)
			must.NoError(t, store.DeleteNodes(index, []string{id}))
			check(step)
			continue
		}
		status := structs.NodeStatusReady
		if rng.IntN(4) == 0 {
			status = structs.NodeStatusDown
		}
		n := &structs.Node{ID: id, SecretID: id + "-secret", Status: status,
			CSIControllerPlugins: map[string]*structs.CSIInfo{}}
		switch rng.IntN(4) {
		case 0:
			n.CSIControllerPlugins[testPlugin] = &structs.CSIInfo{PluginID: testPlugin, Healthy: true}
		case 1:
			n.CSIControllerPlugins[testPlugin] = &structs.CSIInfo{PluginID: testPlugin, Healthy: false}
		case 2:
			n.CSIControllerPlugins["other"] = &structs.CSIInfo{PluginID: "other", Healthy: true}
		}
		must.NoError(t, store.UpsertNode(index, n))
		stored, err := store.NodeByID(nil, id)
		must.NoError(t, err)
		live[id] = stored
		check(step)
	}

	before, err := pluginControllers(store, testPlugin)
	must.NoError(t, err)
	want := nodeIDs(slices.Collect(before))
	for id := range live {
		index++
		must.NoError(t, store.DeleteNodes(index, []string{id}))
	}
	must.Eq(t, want, nodeIDs(slices.Collect(before)), must.Sprint("a sequence keeps the state it was read at"))
}

// After a call with an unknown outcome on a node, the plugin's calls stay
// on that node until one succeeds there or the earlier call's deadline has
// passed; without that node the caller is told to come back.
func TestControllerFence(t *testing.T) {
	l := newControllerLanes(context.Background(), time.Minute, nil)
	now := time.Unix(1000, 0)
	_, ok := l.fencedTo(testPlugin, now)
	must.False(t, ok)

	l.setFence(testPlugin, "b", now.Add(time.Minute))
	node, ok := l.fencedTo(testPlugin, now)
	must.True(t, ok)
	must.Eq(t, "b", node)
	_, ok = l.fencedTo("other", now)
	must.False(t, ok, must.Sprint("a fence is per plugin"))

	a, b := &structs.Node{ID: "a"}, &structs.Node{ID: "b"}
	got, err := fencedCandidates(testPlugin, slices.Values([]*structs.Node{a, b}), "b")
	must.NoError(t, err)
	must.Eq(t, []*structs.Node{b}, slices.Collect(got))
	_, err = fencedCandidates(testPlugin, slices.Values([]*structs.Node{a}), "b")
	must.ErrorIs(t, err, structs.ErrClaimInProgress)
	must.True(t, structs.IsRetryable(err))
	must.StrContains(t, err.Error(), "node b")

	l.liftFence(testPlugin, "a")
	_, ok = l.fencedTo(testPlugin, now)
	must.True(t, ok, must.Sprint("a success elsewhere does not lift the fence"))
	l.liftFence(testPlugin, "b")
	_, ok = l.fencedTo(testPlugin, now)
	must.False(t, ok)

	l.setFence(testPlugin, "b", now.Add(time.Minute))
	_, ok = l.fencedTo(testPlugin, now.Add(time.Minute))
	must.False(t, ok, must.Sprint("the fence lifts at its deadline"))
}
