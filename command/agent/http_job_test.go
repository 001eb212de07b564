package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// send sends a request with a body to a's HTTP API.
func send(t testing.TB, a *Agent, method, path string, body []byte) httpResult {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+a.HTTPAddr()+path, bytes.NewReader(body))
	must.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	return httpResult{code: resp.StatusCode, header: resp.Header, body: out}
}

// batchJobJSON is a register body for a batch job with one task that
// prints to stdout and stderr and exits.
func batchJobJSON(id string) []byte {
	return []byte(fmt.Sprintf(`{"Job": {
		"ID": %q, "Type": "batch", "Datacenters": ["dc1"],
		"TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [{
			"Name": "t", "Driver": "raw_exec",
			"Config": {"command": "/bin/sh", "args": ["-c", "echo hello; echo oops >&2"]},
			"Resources": {"CPU": 100, "MemoryMB": 32}
		}]}]
	}}`, id))
}

// waitEval polls the evaluation until it is terminal and returns it.
func waitEval(t testing.TB, a *Agent, id string) *structs.Evaluation {
	t.Helper()
	var eval structs.Evaluation
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			res := do(t, a, http.MethodGet, "/v1/evaluation/"+id)
			if res.code != http.StatusOK {
				return fmt.Errorf("GET eval: %d %s", res.code, res.body)
			}
			eval = structs.Evaluation{}
			if err := json.Unmarshal(res.body, &eval); err != nil {
				return err
			}
			if !eval.TerminalStatus() {
				return fmt.Errorf("eval %s is %s", id, eval.Status)
			}
			return nil
		}),
		wait.Timeout(30*time.Second),
		wait.Gap(50*time.Millisecond),
	))
	return &eval
}

func TestHTTP_JobLifecycle(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	res := send(t, a, http.MethodPut, "/v1/jobs", batchJobJSON("hello"))
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("%s", res.body))
	var reg structs.JobRegisterResponse
	must.NoError(t, json.Unmarshal(res.body, &reg))
	must.NotEq(t, "", reg.EvalID)
	must.NotEq(t, "", res.header.Get("X-Nomad-Index"))

	eval := waitEval(t, a, reg.EvalID)
	must.EqOp(t, structs.EvalStatusComplete, eval.Status)
	must.MapEmpty(t, eval.FailedTGAllocs)
	// An eval prefix answers too.
	var byPrefix structs.Evaluation
	get(t, a, "/v1/evaluation/"+reg.EvalID[:6], &byPrefix)
	must.EqOp(t, reg.EvalID, byPrefix.ID)

	var jobs []*structs.JobListStub
	requireReadHeaders(t, get(t, a, "/v1/jobs?prefix=hel", &jobs).header)
	must.SliceLen(t, 1, jobs)
	must.EqOp(t, "hello", jobs[0].ID)

	var job structs.Job
	requireReadHeaders(t, get(t, a, "/v1/job/hello", &job).header)
	must.EqOp(t, "batch", job.Type)
	must.EqOp(t, "t", job.TaskGroups[0].Tasks[0].Name)

	var evals []*structs.Evaluation
	get(t, a, "/v1/job/hello/evaluations", &evals)
	must.SliceNotEmpty(t, evals)

	var allocs []*structs.AllocListStub
	get(t, a, "/v1/job/hello/allocations?all=true", &allocs)
	must.SliceLen(t, 1, allocs)
	allocID := allocs[0].ID
	must.EqOp(t, a.Client().NodeID(), allocs[0].NodeID)

	var all []*structs.AllocListStub
	get(t, a, "/v1/allocations?prefix="+allocID[:4], &all)
	must.SliceLen(t, 1, all)
	var alloc structs.Allocation
	requireReadHeaders(t, get(t, a, "/v1/allocation/"+allocID[:8], &alloc).header)
	must.EqOp(t, allocID, alloc.ID)
	must.NotNil(t, alloc.Job)

	var nodeAllocs []*structs.Allocation
	get(t, a, "/v1/node/"+a.Client().NodeID()+"/allocations", &nodeAllocs)
	must.SliceLen(t, 1, nodeAllocs)

	// Logs, once the task has run; the task name may be left out.
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			res := do(t, a, http.MethodGet, "/v1/client/fs/logs/"+allocID+"?plain=true")
			if res.code != http.StatusOK || string(res.body) != "hello\n" {
				return fmt.Errorf("logs: %d %q", res.code, res.body)
			}
			return nil
		}),
		wait.Timeout(30*time.Second),
		wait.Gap(50*time.Millisecond),
	))
	res = do(t, a, http.MethodGet, "/v1/client/fs/logs/"+allocID+"?task=t&type=stderr")
	must.EqOp(t, http.StatusOK, res.code)
	must.EqOp(t, "oops\n", string(res.body))
	res = do(t, a, http.MethodGet, "/v1/client/fs/logs/"+allocID+"?task=t&origin=end&offset=2")
	must.EqOp(t, "o\n", string(res.body))
	res = do(t, a, http.MethodGet, "/v1/client/fs/logs/"+allocID+"?task=nope")
	must.EqOp(t, http.StatusNotFound, res.code)
	res = do(t, a, http.MethodGet, "/v1/client/fs/logs/"+allocID+"?type=stdin")
	must.EqOp(t, http.StatusBadRequest, res.code)

	res = send(t, a, http.MethodDelete, "/v1/job/hello?purge=true", nil)
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("%s", res.body))
	var dereg structs.JobDeregisterResponse
	must.NoError(t, json.Unmarshal(res.body, &dereg))
	must.NotEq(t, "", dereg.EvalID)
	must.EqOp(t, http.StatusNotFound, do(t, a, http.MethodGet, "/v1/job/hello").code)
}

func TestHTTP_JobRegisterInvalid(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)

	cases := []struct {
		name, body, want string
	}{
		{"not json", `{`, "Failed to decode"},
		{"no job", `{"EnforceIndex": true}`, "Job must be specified"},
		{"unsupported field", `{"Job": {"ID": "bad", "TaskGroups": [{"Name": "g", "Services": [{"Name": "web"}],
			"Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]}}`, "Services is not supported"},
		{"bridge network", `{"Job": {"ID": "bad", "TaskGroups": [{"Name": "g", "Networks": [{"Mode": "bridge"}],
			"Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]}}`,
			`group "g": network: mode "bridge" is not supported yet`},
		{"port label twice", `{"Job": {"ID": "bad", "TaskGroups": [{"Name": "g", "Networks": [{"DynamicPorts": [{"Label": "http"}],
			"ReservedPorts": [{"Label": "http", "Value": 80}]}],
			"Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]}}`,
			`network: port label "http" is used twice`},
		{"unsupported wrapper field", `{"PolicyOverride": true, "Job": {"ID": "bad", "TaskGroups": [{"Name": "g",
			"Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]}}`, "PolicyOverride"},
		{"invalid job", `{"Job": {"ID": "bad job", "TaskGroups": []}}`, "bad job"},
		{"negative count", `{"Job": {"ID": "neg", "TaskGroups": [{"Name": "g", "Count": -2,
			"Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]}}`, "count -2 must not be negative"},
		{"unknown driver", `{"Job": {"ID": "drv", "TaskGroups": [{"Name": "g",
			"Tasks": [{"Name": "t", "Driver": "docker"}]}]}}`, `driver "docker" is not supported`},
		{"unknown attribute", `{"Job": {"ID": "typo", "Colour": "blue", "TaskGroups": [{"Name": "g",
			"Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]}}`, "Job.Colour is not supported"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := send(t, a, http.MethodPut, "/v1/jobs", []byte(tc.body))
			must.EqOp(t, http.StatusBadRequest, res.code, must.Sprintf("%s", res.body))
			must.StrContains(t, string(res.body), tc.want)
		})
	}
	// Nothing was written.
	var jobs []*structs.JobListStub
	get(t, a, "/v1/jobs", &jobs)
	must.SliceEmpty(t, jobs)

	// The path's ID must be the job's.
	res := send(t, a, http.MethodPost, "/v1/job/other", batchJobJSON("hello"))
	must.EqOp(t, http.StatusBadRequest, res.code)
	must.StrContains(t, string(res.body), "does not match")
	res = send(t, a, http.MethodPost, "/v1/job/hello", batchJobJSON("hello"))
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("%s", res.body))

	// EnforceIndex from the wrapper reaches the server.
	body := strings.Replace(string(batchJobJSON("hello")), `{"Job"`, `{"EnforceIndex": true, "JobModifyIndex": 1, "Job"`, 1)
	res = send(t, a, http.MethodPut, "/v1/jobs", []byte(body))
	must.EqOp(t, http.StatusBadRequest, res.code, must.Sprintf("%s", res.body))
	must.StrContains(t, string(res.body), "job modify index")
}

func TestHTTP_JobsParse(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	hcl := `job "p" {
  type = "batch"
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "/bin/true" }
    }
  }
}`
	body, err := json.Marshal(map[string]any{"JobHCL": hcl, "Canonicalize": true})
	must.NoError(t, err)
	res := send(t, a, http.MethodPost, "/v1/jobs/parse", body)
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("%s", res.body))
	var job structs.Job
	must.NoError(t, json.Unmarshal(res.body, &job))
	must.EqOp(t, "p", job.ID)
	must.EqOp(t, 1, job.TaskGroups[0].Count)
	must.EqOp(t, structs.JobDefaultPriority, job.Priority)

	res = send(t, a, http.MethodPost, "/v1/jobs/parse", []byte(`{"JobHCL": "job \"x\" {"}`))
	must.EqOp(t, http.StatusBadRequest, res.code)
	// Parsing writes nothing.
	must.EqOp(t, http.StatusNotFound, do(t, a, http.MethodGet, "/v1/job/p").code)
}

func TestHTTP_WorkloadNotFound(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	for _, path := range []string{
		"/v1/job/nope",
		"/v1/allocation/ffffffff-0000-0000-0000-000000000000",
		"/v1/evaluation/ffffffff-0000-0000-0000-000000000000",
		"/v1/client/fs/logs/ffffffff-0000-0000-0000-000000000000",
	} {
		res := do(t, a, http.MethodGet, path)
		must.EqOp(t, http.StatusNotFound, res.code, must.Sprintf("GET %s: %s", path, res.body))
		must.StrContains(t, string(res.body), "not found")
	}
	res := send(t, a, http.MethodDelete, "/v1/job/nope", nil)
	must.EqOp(t, http.StatusNotFound, res.code, must.Sprintf("%s", res.body))

	unknown := "ffffffff-0000-0000-0000-000000000000"
	res = send(t, a, http.MethodPut, "/v1/node/"+unknown+"/drain",
		[]byte(`{"DrainSpec": {"Deadline": 60000000000}}`))
	must.EqOp(t, http.StatusNotFound, res.code, must.Sprintf("%s", res.body))
	res = send(t, a, http.MethodPut, "/v1/node/"+unknown+"/eligibility", []byte(`{"Eligibility": "ineligible"}`))
	must.EqOp(t, http.StatusNotFound, res.code, must.Sprintf("%s", res.body))

	// Routes with sub-resources are only the known ones.
	must.EqOp(t, http.StatusNotFound, do(t, a, http.MethodGet, "/v1/job/x/nope").code)
	must.EqOp(t, http.StatusNotFound, do(t, a, http.MethodGet, "/v1/job/x/allocations/y").code)
	must.EqOp(t, http.StatusMethodNotAllowed, do(t, a, http.MethodDelete, "/v1/job/x/allocations").code)
}

func TestHTTP_NodeDrainAndEligibility(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	nodeID := a.Client().NodeID()

	res := send(t, a, http.MethodPut, "/v1/node/"+nodeID+"/eligibility", []byte(`{"Eligibility": "maybe"}`))
	must.EqOp(t, http.StatusBadRequest, res.code)
	res = send(t, a, http.MethodPut, "/v1/node/"+nodeID+"/eligibility", []byte(`{"Eligibility": "ineligible"}`))
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("%s", res.body))
	var node nodeView
	get(t, a, "/v1/node/"+nodeID, &node)
	must.EqOp(t, structs.NodeSchedulingIneligible, node.SchedulingEligibility)
	res = send(t, a, http.MethodPost, "/v1/node/"+nodeID+"/eligibility", []byte(`{"NodeID": "`+nodeID+`", "Eligibility": "eligible"}`))
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("%s", res.body))

	before := time.Now()
	res = send(t, a, http.MethodPut, "/v1/node/"+nodeID+"/drain",
		[]byte(`{"NodeID": "`+nodeID+`", "DrainSpec": {"Deadline": 3600000000000, "IgnoreSystemJobs": true}}`))
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("%s", res.body))
	var upd nodeUpdateResponse
	must.NoError(t, json.Unmarshal(res.body, &upd))
	must.Positive(t, upd.NodeModifyIndex)
	node = nodeView{}
	get(t, a, "/v1/node/"+nodeID, &node)
	must.EqOp(t, structs.NodeSchedulingIneligible, node.SchedulingEligibility)
	// A node with nothing to move may finish its drain at once.
	if d := node.DrainStrategy; d != nil {
		must.True(t, d.IgnoreSystemJobs)
		must.EqOp(t, time.Hour, d.Deadline)
		must.False(t, d.ForceDeadline.Before(before.Add(time.Hour)))
	}

	res = send(t, a, http.MethodPut, "/v1/node/"+nodeID+"/drain", []byte(`{"DrainSpec": null, "MarkEligible": true}`))
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("%s", res.body))
	node = nodeView{}
	get(t, a, "/v1/node/"+nodeID, &node)
	must.Nil(t, node.DrainStrategy)
	must.EqOp(t, structs.NodeSchedulingEligible, node.SchedulingEligibility)

	res = send(t, a, http.MethodPut, "/v1/node/other/drain", []byte(`{"NodeID": "`+nodeID+`"}`))
	must.EqOp(t, http.StatusBadRequest, res.code)
}

func TestDrainStrategy(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		name     string
		deadline time.Duration
		force    time.Time
	}{
		{"deadline", time.Minute, now.Add(time.Minute)},
		{"no deadline", 0, time.Time{}},
		{"force", -1, time.Time{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := drainStrategy(drainSpecBody{Deadline: tc.deadline, IgnoreSystemJobs: true}, now)
			must.EqOp(t, tc.deadline, d.Deadline)
			must.True(t, d.IgnoreSystemJobs)
			must.EqOp(t, now, d.StartedAt)
			must.EqOp(t, tc.force, d.ForceDeadline)
		})
	}
}

func TestHTTP_AllocLogsProxied(t *testing.T) {
	t.Parallel()
	srv := newTestAgent(t, func(c *Config) { c.Client.Enabled = false })
	waitForLeader(t, srv)
	cl := newTestAgent(t, func(c *Config) {
		c.Name = "logs-client"
		c.DevMode = false
		c.Server.Enabled = false
		c.Client.Servers = []string{srv.Server().Addr()}
	})
	waitForNodeReady(t, srv, cl.Client().NodeID())

	res := send(t, srv, http.MethodPut, "/v1/jobs", batchJobJSON("remote"))
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("%s", res.body))
	var reg structs.JobRegisterResponse
	must.NoError(t, json.Unmarshal(res.body, &reg))
	must.EqOp(t, structs.EvalStatusComplete, waitEval(t, srv, reg.EvalID).Status)
	var allocs []*structs.AllocListStub
	get(t, srv, "/v1/job/remote/allocations", &allocs)
	must.SliceLen(t, 1, allocs)
	must.EqOp(t, cl.Client().NodeID(), allocs[0].NodeID)

	// The server-only agent passes the request on to the client's agent.
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			res := do(t, srv, http.MethodGet, "/v1/client/fs/logs/"+allocs[0].ID+"?task=t&type=stderr&plain=true")
			if res.code != http.StatusOK || string(res.body) != "oops\n" {
				return fmt.Errorf("logs: %d %q", res.code, res.body)
			}
			return nil
		}),
		wait.Timeout(30*time.Second),
		wait.Gap(50*time.Millisecond),
	))
	// Errors from the other agent come back with their status.
	res = do(t, srv, http.MethodGet, "/v1/client/fs/logs/"+allocs[0].ID+"?task=nope")
	must.EqOp(t, http.StatusNotFound, res.code, must.Sprintf("%s", res.body))
}
