package agent

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/rpc"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// writeIndexes are the Raft indexes of the tables a job write touches.
func writeIndexes(t *testing.T, a *Agent) [2]uint64 {
	t.Helper()
	var out [2]uint64
	for i, table := range []string{state.TableJobs, state.TableEvals} {
		idx, err := a.Server().State().Index(table)
		must.NoError(t, err)
		out[i] = idx
	}
	return out
}

// requireAlive checks that the agent still answers.
func requireAlive(t *testing.T, a *Agent) {
	t.Helper()
	res := do(t, a, http.MethodGet, "/v1/status/leader")
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("%s", res.body))
}

// rawExecJob is a register body for a service job whose one task is
// shaped by task (JSON fields) and whose group by group.
func rawExecJob(id, group, task string) []byte {
	return []byte(fmt.Sprintf(`{"Job": {"ID": %q, "Datacenters": ["dc1"],
		"TaskGroups": [{"Name": "g", %s "Tasks": [{"Name": "t", "Driver": "raw_exec", %s
			"Resources": {"CPU": 100, "MemoryMB": 32}}]}]}}`, id, group, task))
}

func parseBody(hcl string) []byte {
	b, _ := json.Marshal(map[string]string{"JobHCL": hcl})
	return b
}

// Every row of issue 9 that a job submission can reach, over HTTP: a 4xx
// naming the problem, nothing written, the agent still up.
func TestHTTP_JobInputRefused(t *testing.T) {
	// A parser that recursed without bound would crash the test binary at
	// 64 MB of stack rather than at 1 GB.
	old := debug.SetMaxStack(64 << 20)
	t.Cleanup(func() { debug.SetMaxStack(old) })

	a := newDevAgent(t)
	deep := `job "deep" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
        args    = ` + strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + `
      }
    }
  }
}`
	volumeJob := func(dest string) []byte {
		return rawExecJob("vm", `"Volumes": {"data": {"Type": "csi", "Source": "vol1"}},`,
			`"Config": {"command": "/bin/true"}, "VolumeMounts": [{"Volume": "data", "Destination": `+fmt.Sprintf("%q", dest)+`}],`)
	}
	cases := []struct {
		name, path string
		body       []byte
		code       int
		want       string
	}{
		{"100,000 nested brackets in a task config", "/v1/jobs/parse", parseBody(deep),
			http.StatusBadRequest, "input.hcl:7: nesting is deeper than job_max_depth = 64"},
		{"count 2^62 in an unknown datacenter", "/v1/jobs",
			[]byte(`{"Job": {"ID": "big", "Datacenters": ["nowhere"], "TaskGroups": [{"Name": "g", "Count": 4611686018427387904,
				"Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]}}`),
			http.StatusBadRequest, `group "g": count 4611686018427387904 is more than group_max_count = 10000`},
		{"count 2^63-1", "/v1/job/big",
			[]byte(`{"Job": {"ID": "big", "TaskGroups": [{"Name": "g", "Count": 9223372036854775807,
				"Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]}}`),
			http.StatusBadRequest, "group_max_count = 10000"},
		{"count past int64", "/v1/jobs",
			[]byte(`{"Job": {"ID": "big", "TaskGroups": [{"Name": "g", "Count": 9223372036854775808}]}}`),
			http.StatusBadRequest, "Count"},
		{"4 MB of empty task groups", "/v1/jobs",
			[]byte(`{"Job": {"ID": "big", "TaskGroups": [` + strings.Repeat("{},", 1_398_000) + `{}]}}`),
			http.StatusRequestEntityTooLarge, "Request body larger than job_max_bytes = 1048576"},
		{"a job file over job_max_bytes", "/v1/jobs/parse", parseBody(`job "x" {` + strings.Repeat(" ", 1<<20) + `}`),
			http.StatusRequestEntityTooLarge, "job_max_bytes = 1048576"},
		{"raw_exec with an empty command", "/v1/jobs", rawExecJob("empty", "", `"Config": {"command": ""},`),
			http.StatusBadRequest, `task "t": bad driver config: raw_exec: option "command" must be a non-empty string, got an empty string`},
		{"raw_exec without config", "/v1/jobs", rawExecJob("none", "", ""),
			http.StatusBadRequest, `task "t": bad driver config: raw_exec: option "command" must be a non-empty string, got nothing`},
		{"raw_exec args not strings", "/v1/jobs", rawExecJob("args", "", `"Config": {"command": "/bin/true", "args": [1]},`),
			http.StatusBadRequest, `task "t": bad driver config: raw_exec: args[0] must be a string, got a number`},
		{"volume_mount at /", "/v1/jobs", volumeJob("/"),
			http.StatusBadRequest, `task "t": volume_mount of "data": destination "/" must be relative to the task directory`},
		{"volume_mount at local", "/v1/jobs", volumeJob("local"),
			http.StatusBadRequest, `task "t": volume_mount of "data": destination "local" is reserved in the task directory`},
		{"volume_mount at ..", "/v1/jobs", volumeJob("../x"),
			http.StatusBadRequest, `task "t": volume_mount of "data": destination "../x" leaves the task directory`},
		{"volume_mount of an undeclared volume", "/v1/jobs",
			rawExecJob("vm", "", `"Config": {"command": "/bin/true"}, "VolumeMounts": [{"Volume": "data", "Destination": "data"}],`),
			http.StatusBadRequest, `task "t": volume_mount names volume "data", which the group does not request`},
		{"cpu near 2^63", "/v1/jobs", []byte(`{"Job": {"ID": "cpu", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t",
			"Driver": "raw_exec", "Config": {"command": "/bin/true"}, "Resources": {"CPU": 9223372036854775807}}]}]}}`),
			http.StatusBadRequest, `task "t": resources: cpu 9223372036854775807`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := writeIndexes(t, a)
			res := send(t, a, http.MethodPut, tc.path, tc.body)
			must.EqOp(t, tc.code, res.code, must.Sprintf("%.2000s", res.body))
			must.StrContains(t, string(res.body), tc.want)
			must.Less(t, 4096, len(res.body))
			must.Eq(t, before, writeIndexes(t, a), must.Sprint("a refused job was written"))
			requireAlive(t, a)
		})
	}
}

// A megabyte of JSON listing 350,000 empty task groups (the 4 MB version
// once cost 1.5 GB and a 35 MB answer) is refused by a scan, before it is
// decoded.
func TestHTTP_JobManyGroupsBounded(t *testing.T) {
	a := newDevAgent(t)
	groups := (1<<20 - 64) / 3
	body := []byte(`{"Job": {"ID": "big", "TaskGroups": [` + strings.Repeat("{},", groups-1) + `{}]}}`)
	must.LessEq(t, 1<<20, len(body))
	before := writeIndexes(t, a)

	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	res := send(t, a, http.MethodPut, "/v1/jobs", body)
	runtime.ReadMemStats(&m1)
	alloc := m1.TotalAlloc - m0.TotalAlloc
	t.Logf("%d groups in %d bytes: %d %q, %d bytes allocated", groups, len(body), res.code, res.body, alloc)
	must.EqOp(t, http.StatusBadRequest, res.code)
	must.StrContains(t, string(res.body), "more than job_max_groups = 100")
	must.Less(t, 256, len(res.body))
	// The body itself is read (1 MB, twice over for the client's copy and
	// the server's); nothing is decoded from it.
	must.Less(t, uint64(16<<20), alloc)
	must.Eq(t, before, writeIndexes(t, a))
	requireAlive(t, a)
}

// The limits block reaches both the HTTP API (depth, size) and the
// servers (counts, which they check whoever calls).
func TestHTTP_JobLimitsFromConfig(t *testing.T) {
	a := newTestAgent(t, func(c *Config) {
		c.Limits = c.Limits.merge(&Limits{JobMaxDepth: 8, GroupMaxCount: 5, JobMaxAllocs: 7, ErrorMaxProblems: 2})
	})
	waitForLeader(t, a)
	must.Eq(t, 5, a.Server().Config().JobLimits.GroupMaxCount)

	nested := func(n int) []byte {
		return parseBody(`job "d" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
        args    = ` + strings.Repeat("[", n) + `"x"` + strings.Repeat("]", n) + `
      }
    }
  }
}`)
	}
	// job, group, task, config, the string: five levels; three brackets
	// make eight.
	res := send(t, a, http.MethodPut, "/v1/jobs/parse", nested(3))
	must.StrContains(t, string(res.body), "args[0] must be a string, got a list")
	res = send(t, a, http.MethodPut, "/v1/jobs/parse", nested(4))
	must.EqOp(t, http.StatusBadRequest, res.code)
	must.StrContains(t, string(res.body), "nesting is deeper than job_max_depth = 8")

	res = send(t, a, http.MethodPut, "/v1/jobs", rawExecJob("six", `"Count": 6,`, `"Config": {"command": "/bin/true"},`))
	must.EqOp(t, http.StatusBadRequest, res.code)
	must.StrContains(t, string(res.body), "count 6 is more than group_max_count = 5")
	res = send(t, a, http.MethodPut, "/v1/jobs", rawExecJob("five", `"Count": 5,`, `"Config": {"command": "/bin/true"},`))
	must.EqOp(t, http.StatusOK, res.code, must.Sprintf("%s", res.body))

	// Two problems, then a count of the rest.
	res = send(t, a, http.MethodPut, "/v1/jobs", []byte(`{"Job": {"ID": "x", "Priority": 1000, "Type": "nope",
		"TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t"}]}]}}`))
	must.EqOp(t, http.StatusBadRequest, res.code)
	must.StrContains(t, string(res.body), "and 1 more problems")
}

// A storage provider's INVALID_ARGUMENT or OUT_OF_RANGE (a capacity of
// 2^63-1, say) is the caller's mistake: 400, not 500.
func TestHTTP_CSIInvalidArgumentIsBadRequest(t *testing.T) {
	err := fmt.Errorf("creating volume %q: %w", "v", fmt.Errorf("%w: size 9223372036854775807 exceeds the provider's capacity", structs.ErrCSIInvalidArgument))
	code, msg := errorStatus(err)
	must.EqOp(t, http.StatusBadRequest, code)
	must.StrContains(t, msg, "exceeds the provider's capacity")
	// As it comes back over RPC, in its coded form.
	wire := structs.FromRPCError(rpc.ServerError(structs.EncodeRPCError(err)))
	must.ErrorIs(t, wire, structs.ErrCSIInvalidArgument)
	code, _ = errorStatus(wire)
	must.EqOp(t, http.StatusBadRequest, code)
}

// A job body whose Content-Length is over job_max_bytes is refused before
// any of it is read: the agent answers 413 to the headers alone, long
// before the body read timeout would have cut the wait for the body.
func TestHTTP_JobBodyRefusedByContentLength(t *testing.T) {
	a := newDevAgent(t)
	for _, path := range []string{"/v1/jobs", "/v1/jobs/parse"} {
		t.Run(path, func(t *testing.T) {
			before := writeIndexes(t, a)
			conn, err := net.Dial("tcp", a.HTTPAddr())
			must.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close() })
			// The headers, and not a byte of the 4 MiB they promise.
			_, err = fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, 4<<20)
			must.NoError(t, err)
			// Far less than the default body read timeout (30 s): an agent
			// that waited for the body would not have answered.
			must.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			must.NoError(t, err, must.Sprint("no answer to the headers alone: the agent waited for the body"))
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			must.NoError(t, err)
			must.EqOp(t, http.StatusRequestEntityTooLarge, resp.StatusCode, must.Sprintf("%s", body))
			must.StrContains(t, string(body), "job_max_bytes = 1048576 (Content-Length 4194304)")
			must.True(t, resp.Close, must.Sprint("the connection is kept open with an unread body on it"))
			must.Eq(t, before, writeIndexes(t, a))
			requireAlive(t, a)
		})
	}
}
