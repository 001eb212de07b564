package agent

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// A log on another node is read through the servers, over the node's own
// session, in pieces: never from the HTTP address the node reported (here
// one where nothing listens), and whole even when it is several pieces
// long.
func TestHTTP_AllocLogsRelayedOverSession(t *testing.T) {
	t.Parallel()
	srv := newTestAgent(t, func(c *Config) { c.Client.Enabled = false })
	waitForLeader(t, srv)
	cl := newTestAgent(t, func(c *Config) {
		c.Name = "relay-client"
		c.DevMode = false
		c.Server.Enabled = false
		c.Client.Servers = []string{srv.Server().Addr()}
		c.Advertise.HTTP = "127.0.0.1:1" // what the node reports; nothing answers there
	})
	waitForNodeReady(t, srv, cl.Client().NodeID())

	// seq 1 100000 is 588,895 bytes: three pieces of structs.MaxLogChunk.
	var want strings.Builder
	for i := 1; i <= 100000; i++ {
		want.WriteString(strconv.Itoa(i) + "\n")
	}
	must.Greater(t, 2*structs.MaxLogChunk, want.Len())
	job := []byte(`{"Job": {
		"ID": "long-log", "Type": "batch", "Datacenters": ["dc1"],
		"TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [{
			"Name": "t", "Driver": "raw_exec",
			"Config": {"command": "/bin/sh", "args": ["-c", "seq 1 100000"]},
			"Resources": {"CPU": 100, "MemoryMB": 32}
		}]}]
	}}`)
	res := send(t, srv, http.MethodPut, "/v1/jobs", job)
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("%s", res.body))
	var reg structs.JobRegisterResponse
	must.NoError(t, json.Unmarshal(res.body, &reg))
	must.EqOp(t, structs.EvalStatusComplete, waitEval(t, srv, reg.EvalID).Status)
	var allocs []*structs.AllocListStub
	get(t, srv, "/v1/job/long-log/allocations", &allocs)
	must.SliceLen(t, 1, allocs)
	must.EqOp(t, cl.Client().NodeID(), allocs[0].NodeID)

	var got string
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			res := do(t, srv, http.MethodGet, "/v1/client/fs/logs/"+allocs[0].ID+"?task=t&type=stdout")
			if res.code != http.StatusOK || len(res.body) < want.Len() {
				return fmt.Errorf("logs: %d, %d bytes", res.code, len(res.body))
			}
			got = string(res.body)
			return nil
		}),
		wait.Timeout(30*time.Second),
		wait.Gap(50*time.Millisecond),
	))
	must.EqOp(t, want.Len(), len(got))
	must.True(t, got == want.String(), must.Sprint("the relayed log differs from the task's output"))

	res = do(t, srv, http.MethodGet, "/v1/client/fs/logs/"+allocs[0].ID+"?task=t&origin=end&offset=13")
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("%s", res.body))
	must.EqOp(t, "99999\n100000\n", string(res.body))
	res = do(t, srv, http.MethodGet, "/v1/client/fs/logs/"+allocs[0].ID+"?task=nope")
	must.EqOp(t, http.StatusNotFound, res.code, must.Sprintf("%s", res.body))
}
