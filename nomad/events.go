package nomad

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// storeHook is the state store's change hook: it turns a committed
// write's changes into events and publishes them. It runs on the FSM's
// goroutine and never waits for a subscriber.
func (b *eventBroker) storeHook(index uint64, changes []state.Change) {
	b.publish(index, eventsFromChanges(index, changes))
}

// eventsFromChanges turns the objects one write changed into events, in
// the order written. Secrets are stripped from every payload here, so the
// buffer never holds one.
func eventsFromChanges(index uint64, changes []state.Change) []structs.Event {
	var out []structs.Event
	for _, c := range changes {
		if ev, ok := eventFromChange(c); ok {
			ev.Index = index
			out = append(out, ev)
		}
	}
	return out
}

func eventFromChange(c state.Change) (structs.Event, bool) {
	obj, deleted := c.After, c.After == nil
	if deleted {
		obj = c.Before
	}
	switch c.Table {
	case state.TableNodes:
		n, _ := obj.(*structs.Node)
		if n == nil {
			return structs.Event{}, false
		}
		typ := "NodeRegistration"
		if before, _ := c.Before.(*structs.Node); deleted {
			typ = "NodeDeregistration"
		} else if before != nil {
			switch {
			case (before.DrainStrategy == nil) != (n.DrainStrategy == nil):
				typ = "NodeDrain"
			case before.SchedulingEligibility != n.SchedulingEligibility:
				typ = "NodeEligibility"
			case before.Status != n.Status:
				typ = "NodeStatusUpdate"
			default:
				typ = "NodeEvent"
			}
		}
		return structs.Event{Topic: structs.TopicNode, Type: typ, Key: n.ID, Payload: n.Sanitize()}, true
	case state.TableJobs:
		j, _ := obj.(*structs.Job)
		if j == nil {
			return structs.Event{}, false
		}
		typ := "JobRegistered"
		if deleted || j.Stop {
			typ = "JobDeregistered"
		}
		return structs.Event{Topic: structs.TopicJob, Type: typ, Key: j.ID, Namespace: j.Namespace, Payload: j}, true
	case state.TableAllocs:
		a, _ := obj.(*structs.Allocation)
		if a == nil {
			return structs.Event{}, false
		}
		typ := "AllocationUpdated"
		if before, _ := c.Before.(*structs.Allocation); before != nil && !deleted &&
			before.DesiredStatus != a.DesiredStatus {
			typ = "AllocationUpdateDesiredStatus"
		}
		return structs.Event{Topic: structs.TopicAllocation, Type: typ, Key: a.ID, Namespace: a.Namespace,
			FilterKeys: []string{a.JobID, a.NodeID}, Payload: a}, true
	case state.TableEvals:
		e, _ := obj.(*structs.Evaluation)
		if e == nil {
			return structs.Event{}, false
		}
		return structs.Event{Topic: structs.TopicEvaluation, Type: "EvaluationUpdated", Key: e.ID, Namespace: e.Namespace,
			FilterKeys: []string{e.JobID}, Payload: e}, true
	case state.TableCSIVolumes:
		v, _ := obj.(*structs.CSIVolume)
		if v == nil {
			return structs.Event{}, false
		}
		typ := "CSIVolumeRegistered"
		before, _ := c.Before.(*structs.CSIVolume)
		switch {
		case deleted:
			typ = "CSIVolumeDeregistered"
		case before != nil && !claimsEqual(before.Claims, v.Claims):
			typ = "CSIVolumeClaim"
		}
		return structs.Event{Topic: structs.TopicCSIVolume, Type: typ, Key: v.ID, Namespace: v.Namespace,
			FilterKeys: []string{v.PluginID}, Payload: v.Sanitize()}, true
	case state.TableCSIPlugins:
		p, _ := obj.(*structs.CSIPlugin)
		if p == nil {
			return structs.Event{}, false
		}
		typ := "CSIPluginUpdated"
		if deleted {
			typ = "CSIPluginDeregistered"
		}
		return structs.Event{Topic: structs.TopicCSIPlugin, Type: typ, Key: p.ID, Payload: pluginEventPayload(p)}, true
	}
	return structs.Event{}, false
}

// pluginEventPayload is the plugin without its node instances, of which
// the counts stay. Every node registration writes a new plugin, each
// holding a map of one instance per node, and the buffer keeps
// DefaultEventBufferSize writes' events: right after 5,000 nodes
// registered it held about 300 MiB of such maps (BenchmarkScaleStateHeap).
// A subscriber that wants the instances reads the plugin.
func pluginEventPayload(p *structs.CSIPlugin) *structs.CSIPlugin {
	c := *p
	c.Nodes = nil
	return &c
}

// claimsEqual compares two volumes' claims by allocation, state and mode.
func claimsEqual(a, b map[string]*structs.CSIVolumeClaim) bool {
	if len(a) != len(b) {
		return false
	}
	for id, ca := range a {
		cb, ok := b[id]
		if !ok || ca.State != cb.State || ca.Mode != cb.Mode || ca.NodeID != cb.NodeID {
			return false
		}
	}
	return true
}

// EventFilter is what a subscriber wants: by topic, keys to match an
// event's Key or one of its FilterKeys ("*" matches any). An empty filter
// wants everything.
type EventFilter map[string][]string

// maxEventFilterTopics bounds the topic:key pairs of one subscription.
const maxEventFilterTopics = 64

// ParseEventTopics reads Nomad's topic query values, "Topic" or
// "Topic:Key", Topic one of structs.EventTopics or "*". Unknown topics
// are refused by name.
func ParseEventTopics(values []string) (EventFilter, error) {
	if len(values) > maxEventFilterTopics {
		return nil, fmt.Errorf("%w: %d topic filters; at most %d", structs.ErrInvalidRequest, len(values), maxEventFilterTopics)
	}
	f := EventFilter{}
	for _, v := range values {
		topic, key, hasKey := strings.Cut(v, ":")
		if !hasKey || key == "" {
			key = "*"
		}
		if topic != structs.TopicAll && !slices.Contains(structs.EventTopics, topic) {
			return nil, fmt.Errorf("%w: unknown event topic %q; topics are %s and *",
				structs.ErrInvalidRequest, topic, strings.Join(structs.EventTopics, ", "))
		}
		if len(key) > structs.MaxIDBytes*2 {
			return nil, fmt.Errorf("%w: event topic %q: key is %d bytes long", structs.ErrInvalidRequest, topic, len(key))
		}
		f[topic] = append(f[topic], key)
	}
	return f, nil
}

// Match says whether the filter wants ev.
func (f EventFilter) Match(ev *structs.Event) bool {
	if len(f) == 0 {
		return true
	}
	for _, topic := range []string{ev.Topic, structs.TopicAll} {
		for _, key := range f[topic] {
			if key == "*" || key == ev.Key || slices.Contains(ev.FilterKeys, key) {
				return true
			}
		}
	}
	return false
}

// EventSubscription reads one subscriber's events from a server's buffer.
type EventSubscription struct {
	b      *eventBroker
	filter EventFilter
	// after is the index of the last batch handed out (or skipped).
	after uint64
}

// SubscribeEvents subscribes to the events with an index at or above
// fromIndex; 0 means from now on. An index whose events are no longer
// all buffered is refused with structs.ErrEventsDropped.
func (s *Server) SubscribeEvents(fromIndex uint64, filter EventFilter) (*EventSubscription, error) {
	after := s.events.head()
	if fromIndex > 0 {
		after = fromIndex - 1
	}
	if err := s.events.checkFrom(after); err != nil {
		return nil, err
	}
	return &EventSubscription{b: s.events, filter: filter, after: after}, nil
}

// Next waits for the next batches that hold events the filter wants and
// returns them, filtered, in index order. It returns
// structs.ErrEventsDropped once the subscriber has fallen behind the
// buffer, and ctx's error when ctx ends.
func (sub *EventSubscription) Next(ctx context.Context) ([]structs.EventBatch, error) {
	for {
		batches, err := sub.b.next(ctx, sub.after)
		if err != nil {
			return nil, fmt.Errorf("event stream after index %d: %w", sub.after, err)
		}
		var out []structs.EventBatch
		for _, batch := range batches {
			sub.after = batch.Index
			var evs []structs.Event
			for i := range batch.Events {
				if sub.filter.Match(&batch.Events[i]) {
					evs = append(evs, batch.Events[i])
				}
			}
			if len(evs) > 0 {
				out = append(out, structs.EventBatch{Index: batch.Index, Events: evs})
			}
		}
		if len(out) > 0 {
			return out, nil
		}
	}
}

// LastIndex is the index of the last batch Next handed out or skipped.
func (sub *EventSubscription) LastIndex() uint64 { return sub.after }
