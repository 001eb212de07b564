package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/roamhq/roam/nomad"
	"github.com/roamhq/roam/structs"
)

// eventStreamPath is Nomad's event stream route.
const eventStreamPath = "/v1/event/stream"

// defaultEventHeartbeat is how often an idle event stream gets "{}".
const defaultEventHeartbeat = 10 * time.Second

// eventJSON is Nomad's api.Event.
type eventJSON struct {
	Topic      string
	Type       string
	Key        string
	Namespace  string
	FilterKeys []string
	Index      uint64
	Payload    map[string]any
}

// eventsFrameJSON is one line of the stream, Nomad's api.Events.
type eventsFrameJSON struct {
	Index  uint64
	Events []eventJSON
}

// eventPayload renders an event's object under the key Nomad's api.Event
// helpers (Node(), Allocation(), …) read it from, in the API's shapes,
// without secrets.
func eventPayload(ev *structs.Event) map[string]any {
	switch p := ev.Payload.(type) {
	case *structs.Node:
		return map[string]any{"Node": nodeView{Node: p}}
	case *structs.Job:
		return map[string]any{"Job": p}
	case *structs.Allocation:
		return map[string]any{"Allocation": p}
	case *structs.Evaluation:
		return map[string]any{"Evaluation": p}
	case *structs.CSIVolume:
		return map[string]any{"Volume": apiCSIVolume(p, nil)}
	case *structs.CSIPlugin:
		return map[string]any{"Plugin": p}
	}
	return map[string]any{}
}

// eventStream answers GET /v1/event/stream as Nomad does: newline
// delimited JSON frames {"Index": N, "Events": [...]}, one per Raft
// index with matching events, in index order, and "{}" as a heartbeat
// while idle.
//
// Query parameters: topic=Topic[:Key] (repeated; Key "*" or absent is
// any; Topic "*" is any), index=N to start at the events of index N
// (resume with the last index seen plus one; 0 or absent is from now on),
// namespace (only the default one exists). It is served by server agents
// from their own buffer of recent events. An index whose events are no
// longer all buffered is a 410 naming the oldest one held; a subscriber
// that falls behind the buffer gets a last line {"Error": "..."} and the
// stream ends, so no reader ever sees a silent gap.
func (s *HTTPServer) eventStream(w http.ResponseWriter, r *http.Request) (any, error) {
	srv := s.agent.server
	if srv == nil {
		return nil, &codedError{code: http.StatusNotImplemented,
			msg: "the event stream is served by server agents; ask a server's HTTP API"}
	}
	q := r.URL.Query()
	filter, err := nomad.ParseEventTopics(q["topic"])
	if err != nil {
		return nil, err
	}
	var from uint64
	if raw := q.Get("index"); raw != "" {
		if from, err = strconv.ParseUint(raw, 10, 64); err != nil {
			return nil, badRequest("Invalid index %q: must be a whole number", raw)
		}
	}
	switch ns := q.Get("namespace"); ns {
	case "", "*", structs.DefaultNamespace:
	default:
		return nil, badRequest("Unsupported namespace %q: only %q exists", ns, structs.DefaultNamespace)
	}
	sub, err := srv.SubscribeEvents(from, filter)
	if err != nil {
		return nil, err
	}
	heartbeat := time.Duration(s.eventHeartbeat.Load())
	if heartbeat <= 0 {
		heartbeat = defaultEventHeartbeat
	}

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		select {
		case <-s.shutdownCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	flush := func() {
		if flusher != nil {
			flusher.Flush()
		}
	}
	flush()
	for {
		nctx, ncancel := context.WithTimeout(ctx, heartbeat)
		batches, err := sub.Next(nctx)
		ncancel()
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return nil, nil // the reader left, or the agent stops
		case errors.Is(err, context.DeadlineExceeded):
			if _, err := w.Write([]byte("{}\n")); err != nil {
				return nil, nil
			}
			flush()
			continue
		default:
			s.logger.Debug("event stream ends", "last_index", sub.LastIndex(), "error", err)
			_ = enc.Encode(map[string]string{"Error": err.Error()})
			flush()
			return nil, nil
		}
		for _, b := range batches {
			frame := eventsFrameJSON{Index: b.Index, Events: make([]eventJSON, 0, len(b.Events))}
			for i := range b.Events {
				ev := &b.Events[i]
				fk := ev.FilterKeys
				if fk == nil {
					fk = []string{}
				}
				frame.Events = append(frame.Events, eventJSON{
					Topic: ev.Topic, Type: ev.Type, Key: ev.Key, Namespace: ev.Namespace,
					FilterKeys: fk, Index: ev.Index, Payload: eventPayload(ev),
				})
			}
			if err := enc.Encode(frame); err != nil {
				return nil, nil
			}
		}
		flush()
	}
}
