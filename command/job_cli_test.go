package command

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/roamhq/roam/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// writeJob writes a job file into a temp dir and returns its path.
func writeJob(t *testing.T, name, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	must.NoError(t, os.WriteFile(path, []byte(src), 0o600))
	return path
}

func jobHCL(id, jobType, dc, script string) string {
	return fmt.Sprintf(`job %q {
  type        = %q
  datacenters = [%q]
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", %q]
      }
      resources {
        cpu    = 100
        memory = 32
      }
    }
  }
}
`, id, jobType, dc, script)
}

// waitAllocStatus polls until the job's only allocation has the status.
func waitAllocStatus(t *testing.T, c *api.Client, jobID, status string) *api.AllocationListStub {
	t.Helper()
	var alloc *api.AllocationListStub
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			allocs, _, err := c.Jobs().Allocations(jobID, true, nil)
			if err != nil {
				return err
			}
			if len(allocs) != 1 || allocs[0].ClientStatus != status {
				return fmt.Errorf("allocations of %s: %d, want one %s", jobID, len(allocs), status)
			}
			alloc = allocs[0]
			return nil
		}),
		wait.Timeout(30*time.Second),
		wait.Gap(50*time.Millisecond),
	))
	return alloc
}

func TestCLI_JobRunStatusLogsStop(t *testing.T) {
	t.Parallel()
	a, addr := newTestAgent(t)
	nodeID := a.Client().NodeID()
	c, err := api.NewClient(&api.Config{Address: addr})
	must.NoError(t, err)

	file := writeJob(t, "hello.hcl", jobHCL("hello", "batch", "dc1", "echo hello; echo oops >&2"))
	code, out, errOut := run("job", "run", "-address", addr, file)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.RegexMatch(t, regexp.MustCompile(`(?m)^==> Evaluation [0-9a-f-]{36} finished with status complete$`), out)
	must.RegexMatch(t, regexp.MustCompile(`(?m)^ *Allocation [0-9a-f]{8} created: node `+nodeID[:8]+`, group g$`), out)

	alloc := waitAllocStatus(t, c, "hello", api.AllocClientStatusComplete)

	t.Run("job status list", func(t *testing.T) {
		code, out, errOut := run("job", "status", "-address", addr)
		must.EqOp(t, 0, code, must.Sprint(errOut))
		got := lines(out)
		must.EqOp(t, "ID Type Priority Status Submit Date", got[0])
		must.StrHasPrefix(t, "hello batch 50 ", got[1])
	})

	t.Run("job status by prefix", func(t *testing.T) {
		code, out, errOut := run("job", "status", "-address", addr, "hel")
		must.EqOp(t, 0, code, must.Sprint(errOut))
		got := lines(out)
		must.SliceContains(t, got, "ID = hello")
		must.SliceContains(t, got, "Type = batch")
		must.SliceContains(t, got, "ID Node ID Task Group Desired Status Created")
		found := false
		for _, l := range got {
			found = found || strings.HasPrefix(l, alloc.ID[:8]+" "+nodeID[:8]+" g run complete ")
		}
		must.True(t, found, must.Sprint(out))
	})

	t.Run("alloc status", func(t *testing.T) {
		code, out, errOut := run("alloc", "status", "-address", addr, alloc.ID[:6])
		must.EqOp(t, 0, code, must.Sprint(errOut))
		got := lines(out)
		must.SliceContains(t, got, "ID = "+alloc.ID[:8])
		must.SliceContains(t, got, "Client Status = complete")
		must.SliceContains(t, got, "Job ID = hello")
		must.SliceContains(t, got, `Task "t" is "dead"`)
		must.SliceContains(t, got, "Recent Events:")
		must.StrContains(t, out, "Terminated")
	})

	t.Run("alloc logs", func(t *testing.T) {
		code, out, errOut := run("alloc", "logs", "-address", addr, alloc.ID[:8])
		must.EqOp(t, 0, code, must.Sprint(errOut))
		must.EqOp(t, "hello\n", out)
		code, out, errOut = run("alloc", "logs", "-address", addr, "-stderr", alloc.ID, "t")
		must.EqOp(t, 0, code, must.Sprint(errOut))
		must.EqOp(t, "oops\n", out)
		code, _, errOut = run("alloc", "logs", "-address", addr, alloc.ID, "nope")
		must.EqOp(t, 1, code)
		must.StrContains(t, errOut, "404")
	})

	t.Run("unknown IDs", func(t *testing.T) {
		for _, args := range [][]string{
			{"job", "status", "nope"},
			{"job", "stop", "nope"},
			{"alloc", "status", "ffffffff"},
			{"alloc", "logs", "ffffffff"},
			{"node", "drain", "-enable", "-yes", "ffffffff"},
			{"node", "eligibility", "-disable", "ffffffff"},
		} {
			code, out, errOut := run(append(args, "-address", addr)...)
			must.EqOp(t, 1, code, must.Sprintf("%v: %s", args, errOut))
			must.EqOp(t, "", out)
			must.StrContains(t, errOut, "No ")
		}
	})

	t.Run("job stop", func(t *testing.T) {
		code, out, errOut := run("job", "stop", "-purge", "-address", addr, "hello")
		must.EqOp(t, 0, code, must.Sprint(errOut))
		must.StrContains(t, out, "finished with status complete")
		_, _, err := c.Jobs().Info("hello", nil)
		must.ErrorContains(t, err, "404")
	})
}

func TestCLI_JobRunFailures(t *testing.T) {
	t.Parallel()
	_, addr := newTestAgent(t)

	t.Run("placement failure exits 2", func(t *testing.T) {
		file := writeJob(t, "far.hcl", jobHCL("far", "service", "dc9", "sleep 60"))
		code, out, errOut := run("job", "run", "-address", addr, file)
		must.EqOp(t, 2, code, must.Sprintf("out: %s\nerr: %s", out, errOut))
		must.StrContains(t, out, `Task Group "g" (failed to place 1 allocation(s))`)
	})

	t.Run("detach", func(t *testing.T) {
		file := writeJob(t, "d.hcl", jobHCL("detached", "batch", "dc1", "true"))
		code, out, errOut := run("job", "run", "-detach", "-address", addr, file)
		must.EqOp(t, 0, code, must.Sprint(errOut))
		must.StrContains(t, out, "Evaluation ID: ")
		must.StrNotContains(t, out, "==> Evaluation")
	})

	t.Run("json job file", func(t *testing.T) {
		file := writeJob(t, "j.json", `{"Job": {"ID": "fromjson", "Type": "batch", "Datacenters": ["dc1"],
			"TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec",
			"Config": {"command": "/bin/true"}}]}]}}`)
		code, out, errOut := run("job", "run", "-address", addr, file)
		must.EqOp(t, 0, code, must.Sprint(errOut))
		must.StrContains(t, out, "finished with status complete")
	})

	t.Run("bad job file", func(t *testing.T) {
		file := writeJob(t, "bad.hcl", `job "x" { group "g" { network { mode = "bridge" } } }`)
		code, out, errOut := run("job", "run", "-address", addr, file)
		must.EqOp(t, 1, code)
		must.EqOp(t, "", out)
		must.StrContains(t, errOut, "Error reading job file")
	})

	t.Run("missing file", func(t *testing.T) {
		code, _, errOut := run("job", "run", "-address", addr, filepath.Join(t.TempDir(), "none.hcl"))
		must.EqOp(t, 1, code)
		must.StrContains(t, errOut, "no such file")
	})
}

func TestCLI_NodeDrainAndEligibility(t *testing.T) {
	t.Parallel()
	a, addr := newTestAgent(t)
	nodeID := a.Client().NodeID()
	c, err := api.NewClient(&api.Config{Address: addr})
	must.NoError(t, err)

	code, out, errOut := run("node", "eligibility", "-disable", "-address", addr, nodeID[:6])
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.StrContains(t, out, "ineligible for scheduling")
	node, _, err := c.Nodes().Info(nodeID, nil)
	must.NoError(t, err)
	must.EqOp(t, "ineligible", node.SchedulingEligibility)
	code, _, errOut = run("node", "eligibility", "-enable", "-address", addr, nodeID)
	must.EqOp(t, 0, code, must.Sprint(errOut))

	code, _, errOut = run("node", "eligibility", "-address", addr, nodeID)
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "Usage: roam node eligibility")

	// A service job on the only node: a forced drain stops it.
	file := writeJob(t, "svc.hcl", jobHCL("svc", "service", "dc1", "sleep 300"))
	code, _, errOut = run("job", "run", "-address", addr, file)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	alloc := waitAllocStatus(t, c, "svc", api.AllocClientStatusRunning)

	code, out, errOut = run("node", "drain", "-enable", "-force", "-yes", "-monitor", "-address", addr, nodeID[:8])
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.StrContains(t, out, fmt.Sprintf("Node %q drain strategy set", nodeID))
	must.StrContains(t, out, "Alloc "+alloc.ID[:8]+" stopped")
	must.StrContains(t, out, "Drain complete for node "+nodeID)

	code, out, errOut = run("node", "drain", "-disable", "-address", addr, nodeID)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.StrContains(t, out, "drain strategy unset")
	node, _, err = c.Nodes().Info(nodeID, nil)
	must.NoError(t, err)
	must.EqOp(t, "eligible", node.SchedulingEligibility)

	code, _, errOut = run("node", "drain", "-enable", "-disable", "-address", addr, nodeID)
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "only one of -enable and -disable")
}

// alloc status lists the allocation's ports, as Nomad's "Allocation
// Addresses".
func TestCLI_AllocStatusAddresses(t *testing.T) {
	t.Parallel()
	_, addr := newTestAgent(t)
	c, err := api.NewClient(&api.Config{Address: addr})
	must.NoError(t, err)
	src := strings.Replace(jobHCL("ports", "batch", "dc1", "exit 0"), `  group "g" {`, `  group "g" {
    network {
      port "http" {}
      port "db" {
        static = 25433
      }
    }`, 1)
	code, _, errOut := run("job", "run", "-address", addr, writeJob(t, "ports.hcl", src))
	must.EqOp(t, 0, code, must.Sprint(errOut))
	alloc := waitAllocStatus(t, c, "ports", api.AllocClientStatusComplete)
	code, out, errOut := run("alloc", "status", "-address", addr, alloc.ID)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	got := lines(out)
	must.SliceContains(t, got, "Allocation Addresses:")
	must.SliceContains(t, got, "Label Dynamic Address")
	must.SliceContains(t, got, "db false 127.0.0.1:25433")
	must.SliceContains(t, got, "http true 127.0.0.1:20000")
}

// alloc status -stats measures each running task on its node.
func TestCLI_AllocStatusStats(t *testing.T) {
	t.Parallel()
	_, addr := newTestAgent(t)
	c, err := api.NewClient(&api.Config{Address: addr})
	must.NoError(t, err)
	code, _, errOut := run("job", "run", "-address", addr, writeJob(t, "svc.hcl", jobHCL("svc", "service", "dc1", "exec sleep 300")))
	must.EqOp(t, 0, code, must.Sprint(errOut))
	alloc := waitAllocStatus(t, c, "svc", api.AllocClientStatusRunning)
	code, out, errOut := run("alloc", "status", "-stats", "-address", addr, alloc.ID)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	got := lines(out)
	must.SliceContains(t, got, "Task Resources:")
	must.SliceContains(t, got, "CPU Memory Throttled")
	must.RegexMatch(t, regexp.MustCompile(`(?m)^\d+/100 MHz +\d+\.\d MiB/32 MiB +\d+ periods$`), out)
}
