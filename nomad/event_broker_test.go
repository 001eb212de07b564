package nomad

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

func testEvents(index uint64, keys ...string) []structs.Event {
	out := make([]structs.Event, 0, len(keys))
	for _, k := range keys {
		out = append(out, structs.Event{Topic: structs.TopicNode, Type: "NodeRegistration", Key: k, Index: index})
	}
	return out
}

func TestEventBroker_OrderResumeAndBounds(t *testing.T) {
	b := newEventBroker(3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)

	b.publish(10, testEvents(10, "a"))
	b.publish(11, nil) // an index without events only moves the head
	b.publish(12, testEvents(12, "b", "c"))
	got, err := b.next(ctx, 0)
	must.NoError(t, err)
	must.SliceLen(t, 2, got)
	must.Eq(t, uint64(10), got[0].Index)
	must.Eq(t, uint64(12), got[1].Index)
	must.Eq(t, "c", got[1].Events[1].Key)
	must.Eq(t, uint64(12), b.head())

	// Resuming after the last index seen misses nothing and repeats
	// nothing.
	got, err = b.next(ctx, 10)
	must.NoError(t, err)
	must.SliceLen(t, 1, got)
	must.Eq(t, uint64(12), got[0].Index)

	// A waiting subscriber wakes on the next publish.
	done := make(chan []structs.EventBatch, 1)
	go func() {
		got, err := b.next(ctx, 12)
		if err == nil {
			done <- got
		}
		close(done)
	}()
	b.publish(13, testEvents(13, "d"))
	select {
	case got := <-done:
		must.SliceLen(t, 1, got)
		must.Eq(t, uint64(13), got[0].Index)
	case <-ctx.Done():
		t.Fatal("the waiting subscriber was not woken")
	}

	// Past the buffer's size the oldest batch goes, and a subscriber that
	// had not read it, or asks for it, is told instead of skipping it.
	b.publish(14, testEvents(14, "e"))
	_, err = b.next(ctx, 9)
	must.ErrorIs(t, err, structs.ErrEventsDropped)
	must.StrContains(t, err.Error(), "after index 10")
	must.ErrorIs(t, b.checkFrom(9), structs.ErrEventsDropped)
	must.NoError(t, b.checkFrom(10))
	got, err = b.next(ctx, 10)
	must.NoError(t, err)
	must.Eq(t, uint64(12), got[0].Index)

	// A snapshot restore is a gap for everyone before it.
	b.restored(20)
	must.ErrorIs(t, b.checkFrom(14), structs.ErrEventsDropped)
	must.NoError(t, b.checkFrom(20))
	must.Eq(t, uint64(20), b.head())

	// A waiter gives up with its context.
	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancelShort()
	_, err = b.next(short, 20)
	must.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestEventFilter(t *testing.T) {
	_, err := ParseEventTopics([]string{"Nope:x"})
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), `unknown event topic "Nope"`)
	many := make([]string, maxEventFilterTopics+1)
	for i := range many {
		many[i] = "Node"
	}
	_, err = ParseEventTopics(many)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)

	f, err := ParseEventTopics([]string{"CSIVolume:vol1", "Allocation:job-a", "Node"})
	must.NoError(t, err)
	for _, tc := range []struct {
		ev   structs.Event
		want bool
	}{
		{structs.Event{Topic: structs.TopicCSIVolume, Key: "vol1"}, true},
		{structs.Event{Topic: structs.TopicCSIVolume, Key: "vol2"}, false},
		{structs.Event{Topic: structs.TopicAllocation, Key: "a1", FilterKeys: []string{"job-a"}}, true},
		{structs.Event{Topic: structs.TopicAllocation, Key: "a2", FilterKeys: []string{"job-b"}}, false},
		{structs.Event{Topic: structs.TopicNode, Key: "any"}, true},
		{structs.Event{Topic: structs.TopicJob, Key: "j"}, false},
	} {
		must.Eq(t, tc.want, f.Match(&tc.ev), must.Sprintf("%+v", tc.ev))
	}
	all, err := ParseEventTopics([]string{"*"})
	must.NoError(t, err)
	must.True(t, all.Match(&structs.Event{Topic: structs.TopicJob, Key: "j"}))
	none, err := ParseEventTopics(nil)
	must.NoError(t, err)
	must.True(t, none.Match(&structs.Event{Topic: structs.TopicJob, Key: "j"}))
}

// TestEvents_FromStoreWrites: writes to the store become events of the
// right topic and type at the write's index, and no payload carries a
// secret.
func TestEvents_FromStoreWrites(t *testing.T) {
	st, err := state.NewStateStore()
	must.NoError(t, err)
	b := newEventBroker(16)
	st.SetChangeHook(b.storeHook)

	n := workNode("n1")
	n.SecretID = "node-secret"
	must.NoError(t, st.UpsertNode(5, n))
	vol := testVolume("v1")
	vol.Namespace = structs.DefaultNamespace
	vol.Secrets = map[string]string{"token": "vol-secret"}
	must.NoError(t, st.UpsertCSIVolumes(6, []*structs.CSIVolume{vol}))
	must.NoError(t, st.DeleteCSIVolumes(7, structs.DefaultNamespace, []string{"v1"}, false))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	got, err := b.next(ctx, 0)
	must.NoError(t, err)
	byIndex := map[uint64][]structs.Event{}
	for _, batch := range got {
		byIndex[batch.Index] = batch.Events
	}
	must.SliceNotEmpty(t, byIndex[5])
	var sawNode bool
	for _, ev := range byIndex[5] {
		if ev.Topic == structs.TopicNode {
			sawNode = true
			must.Eq(t, "NodeRegistration", ev.Type)
			must.Eq(t, "", ev.Payload.(*structs.Node).SecretID)
		}
	}
	must.True(t, sawNode)
	must.SliceLen(t, 1, byIndex[6])
	must.Eq(t, "CSIVolumeRegistered", byIndex[6][0].Type)
	must.MapEmpty(t, byIndex[6][0].Payload.(*structs.CSIVolume).Secrets)
	must.Eq(t, "CSIVolumeDeregistered", byIndex[7][0].Type)
	must.MapEmpty(t, byIndex[7][0].Payload.(*structs.CSIVolume).Secrets)
	// The store's own objects keep their secrets.
	n2, err := st.NodeByID(nil, n.ID)
	must.NoError(t, err)
	must.Eq(t, "node-secret", n2.SecretID)
}

// A plugin's event carries its counts and controllers but not its node
// instances, which the event buffer would otherwise keep one copy of per
// registration; the store's plugin keeps them.
func TestEvents_PluginPayloadLeavesNodeInstances(t *testing.T) {
	st, err := state.NewStateStore()
	must.NoError(t, err)
	b := newEventBroker(16)
	st.SetChangeHook(b.storeHook)
	for i := range 3 {
		n := workNode(fmt.Sprintf("n%d", i))
		n.CSINodePlugins = map[string]*structs.CSIInfo{"p": {PluginID: "p", Healthy: true}}
		if i == 0 {
			n.CSIControllerPlugins = map[string]*structs.CSIInfo{"p": {PluginID: "p", Healthy: true}}
		}
		must.NoError(t, st.UpsertNode(uint64(5+i), n))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	got, err := b.next(ctx, 0)
	must.NoError(t, err)
	var last *structs.CSIPlugin
	for _, batch := range got {
		for _, ev := range batch.Events {
			if ev.Topic == structs.TopicCSIPlugin {
				last = ev.Payload.(*structs.CSIPlugin)
			}
		}
	}
	must.NotNil(t, last)
	must.Eq(t, 3, last.NodesExpected)
	must.Eq(t, 3, last.NodesHealthy)
	must.MapEmpty(t, last.Nodes)
	must.MapLen(t, 1, last.Controllers)
	stored, err := st.CSIPluginByID(nil, "p")
	must.NoError(t, err)
	must.MapLen(t, 3, stored.Nodes)
}
