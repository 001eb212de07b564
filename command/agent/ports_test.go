package agent

import (
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// Two allocations of a group with a dynamic port, on one node, get
// different ports from the node's range, shown in Nomad's shape; each
// task answers HTTP on its own.
func TestNomadAPI_DynamicPortsServeHTTP(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	c := newNomadClient(t, a)
	self, err := os.Executable()
	must.NoError(t, err)

	job := nomadapi.NewServiceJob("web", "web", "global", 50)
	job.Datacenters = []string{"dc1"}
	tg := nomadapi.NewTaskGroup("g", 2)
	tg.Networks = []*nomadapi.NetworkResource{{DynamicPorts: []nomadapi.Port{{Label: "http"}}}}
	cpu, mem := 50, 32
	task := nomadapi.NewTask("srv", "raw_exec").
		SetConfig("command", self).
		Require(&nomadapi.Resources{CPU: &cpu, MemoryMB: &mem})
	task.Env = map[string]string{testHTTPServeEnv: "1"}
	tg.AddTask(task)
	job.AddTaskGroup(tg)
	job.Canonicalize()
	_, _, err = c.Jobs().Register(job, nil)
	must.NoError(t, err)

	var allocs []*nomadapi.Allocation
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool {
			stubs, _, err := c.Jobs().Allocations("web", false, nil)
			must.NoError(t, err)
			allocs = allocs[:0]
			for _, s := range stubs {
				if s.ClientStatus == nomadapi.AllocClientStatusRunning {
					full, _, err := c.Allocations().Info(s.ID, nil)
					must.NoError(t, err)
					allocs = append(allocs, full)
				}
			}
			return len(allocs) == 2
		}),
		wait.Timeout(30*time.Second),
		wait.Gap(50*time.Millisecond),
	))
	node, _, err := c.Nodes().Info(a.Client().NodeID(), nil)
	must.NoError(t, err)
	must.EqOp(t, 20000, node.NodeResources.MinDynamicPort)
	must.EqOp(t, 32000, node.NodeResources.MaxDynamicPort)

	seen := map[int]bool{}
	for _, al := range allocs {
		must.NotNil(t, al.AllocatedResources)
		ports := al.AllocatedResources.Shared.Ports
		must.SliceLen(t, 1, ports)
		p := ports[0]
		must.EqOp(t, "http", p.Label)
		must.Between(t, 20000, p.Value, 32000)
		must.False(t, seen[p.Value], must.Sprintf("port %d given twice", p.Value))
		seen[p.Value] = true
		addr := net.JoinHostPort(p.HostIP, strconv.Itoa(p.Value))
		var body string
		must.Wait(t, wait.InitialSuccess(
			wait.ErrorFunc(func() error {
				res, err := http.Get("http://" + addr + "/")
				if err != nil {
					return err
				}
				defer res.Body.Close()
				b, err := io.ReadAll(res.Body)
				body = string(b)
				return err
			}),
			wait.Timeout(20*time.Second),
			wait.Gap(50*time.Millisecond),
		))
		must.EqOp(t, al.ID, body, must.Sprintf("the task at %s", addr))

		// Nomad's client reads the running task's usage.
		u, err := c.Allocations().Stats(al, nil)
		must.NoError(t, err)
		tu := u.Tasks["srv"]
		must.NotNil(t, tu, must.Sprintf("stats %+v", u))
		must.Positive(t, tu.ResourceUsage.MemoryStats.RSS)
	}
	// A client route with an ID no allocation could have is a 400.
	res, err := http.Get("http://" + a.HTTPAddr() + "/v1/client/allocation/..%2f..%2fetc/stats")
	must.NoError(t, err)
	res.Body.Close()
	must.EqOp(t, http.StatusBadRequest, res.StatusCode)
}
