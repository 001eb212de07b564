package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
)

// TestNomadAPI_EventStream drives /v1/event/stream with Nomad's client:
// a volume's registration and deregistration come as CSIVolume events in
// index order, filtered by key, without the volume's secrets, and a
// stream resumed from the last index seen plus one starts exactly after
// it.
func TestNomadAPI_EventStream(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	c := newNomadClient(t, a)
	registerCSINode(t, a)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := c.EventStream().Stream(ctx, map[nomadapi.Topic][]string{"CSIVolume": {"web"}}, 0, nil)
	must.NoError(t, err)

	vol := &nomadapi.CSIVolume{
		ID: "web", ExternalID: "ext-web", PluginID: "hostpath",
		RequestedCapabilities: []*nomadapi.CSIVolumeCapability{{
			AccessMode: nomadapi.CSIVolumeAccessModeMultiNodeMultiWriter, AttachmentMode: nomadapi.CSIVolumeAttachmentModeFilesystem,
		}},
		Secrets: nomadapi.CSISecrets{"k": "very-secret-value"},
	}
	other := *vol
	other.ID, other.ExternalID = "other", "ext-other"
	_, err = c.CSIVolumes().Register(&other, nil)
	must.NoError(t, err)
	_, err = c.CSIVolumes().Register(vol, nil)
	must.NoError(t, err)
	must.NoError(t, c.CSIVolumes().Deregister("web", false, nil))

	var types []string
	var indexes []uint64
	for len(types) < 2 {
		select {
		case evs := <-stream:
			must.NotNil(t, evs)
			must.NoError(t, evs.Err)
			for _, ev := range evs.Events {
				must.EqOp(t, "CSIVolume", string(ev.Topic))
				must.EqOp(t, "web", ev.Key, must.Sprint("the key filter lets only web through"))
				must.EqOp(t, evs.Index, ev.Index)
				types = append(types, ev.Type)
				indexes = append(indexes, ev.Index)
				raw, err := json.Marshal(ev.Payload)
				must.NoError(t, err)
				must.StrNotContains(t, string(raw), "very-secret-value")
				must.MapContainsKey(t, ev.Payload, "Volume")
			}
		case <-ctx.Done():
			t.Fatalf("events so far: %v", types)
		}
	}
	must.Eq(t, []string{"CSIVolumeRegistered", "CSIVolumeDeregistered"}, types)
	must.Less(t, indexes[1], indexes[0])

	// Resuming from the first event's index plus one gives the second
	// event first: nothing repeated, nothing missed.
	resumed, err := c.EventStream().Stream(ctx, map[nomadapi.Topic][]string{"CSIVolume": {"*"}}, indexes[0]+1, nil)
	must.NoError(t, err)
	select {
	case evs := <-resumed:
		must.NoError(t, evs.Err)
		must.EqOp(t, indexes[1], evs.Index)
		must.EqOp(t, "CSIVolumeDeregistered", evs.Events[0].Type)
	case <-ctx.Done():
		t.Fatal("no event after resuming")
	}

	// Node events come too, and the node's secret never does.
	nodes, err := c.EventStream().Stream(ctx, map[nomadapi.Topic][]string{"Node": {"*"}}, 1, nil)
	must.NoError(t, err)
	select {
	case evs := <-nodes:
		must.NoError(t, evs.Err)
		n, err := evs.Events[0].Node()
		must.NoError(t, err)
		must.NotEq(t, "", n.ID)
		raw, err := json.Marshal(evs.Events[0].Payload)
		must.NoError(t, err)
		must.StrNotContains(t, string(raw), "SecretID")
	case <-ctx.Done():
		t.Fatal("no node event")
	}
}

// TestHTTP_EventStream checks the raw stream: bad input is a 400 that
// names it, heartbeats are "{}", and an index older than the buffer is a
// 410 rather than a stream with a gap.
func TestHTTP_EventStream(t *testing.T) {
	t.Parallel()
	a := newTestAgent(t, func(c *Config) { c.Server.EventBufferSize = 2 })
	waitForLeader(t, a)
	waitForNodeReady(t, a, a.Client().NodeID())
	a.http.eventHeartbeat.Store(int64(50 * time.Millisecond))
	// More writes than the buffer holds, so index 1 is gone from it.
	for range 3 {
		registerCSINode(t, a)
	}

	for path, want := range map[string]string{
		"/v1/event/stream?topic=Nope":               `unknown event topic "Nope"`,
		"/v1/event/stream?index=x":                  "Invalid index",
		"/v1/event/stream?namespace=other":          "Unsupported namespace",
		"/v1/event/stream?index=1&topic=Node%3Aabc": "buffer",
	} {
		res := do(t, a, http.MethodGet, path)
		if want == "buffer" {
			must.EqOp(t, http.StatusGone, res.code, must.Sprintf("%s: %s", path, res.body))
		} else {
			must.EqOp(t, http.StatusBadRequest, res.code, must.Sprintf("%s: %s", path, res.body))
		}
		must.StrContains(t, string(res.body), want)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.HTTPAddr()+"/v1/event/stream?topic=Job", nil)
	must.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	must.EqOp(t, http.StatusOK, resp.StatusCode)
	sc := bufio.NewScanner(resp.Body)
	must.True(t, sc.Scan(), must.Sprintf("no line: %v", sc.Err()))
	must.EqOp(t, "{}", strings.TrimSpace(sc.Text()))
}
