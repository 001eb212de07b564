package scheduler

import (
	"fmt"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// withPorts gives the job's group a host-mode network block.
func withPorts(job *structs.Job, static map[string]int, dynamic ...string) *structs.Job {
	n := &structs.NetworkResource{Mode: structs.NetworkModeHost}
	for label, v := range static {
		n.ReservedPorts = append(n.ReservedPorts, structs.Port{Label: label, Value: v})
	}
	for _, label := range dynamic {
		n.DynamicPorts = append(n.DynamicPorts, structs.Port{Label: label})
	}
	job.TaskGroups[0].Networks = []*structs.NetworkResource{n}
	return job
}

func holding(a *structs.Allocation, ports ...int) *structs.Allocation {
	a.AllocatedResources = &structs.AllocatedResources{}
	for i, p := range ports {
		a.AllocatedResources.Shared.Ports = append(a.AllocatedResources.Shared.Ports,
			structs.AllocatedPortMapping{Label: fmt.Sprintf("p%d", i), Value: p})
	}
	return a
}

func portValues(a *structs.Allocation) map[string]int {
	out := map[string]int{}
	for _, p := range a.Ports() {
		out[p.Label] = p.Value
	}
	return out
}

// assignPorts as a table: what the node holds × what the group asks.
func TestAssignPorts(t *testing.T) {
	small := func(n *structs.Node) {
		n.NodeResources = &structs.NodeResources{MinDynamicPort: 30000, MaxDynamicPort: 30002}
	}
	cases := []struct {
		name    string
		node    nodeOpt
		held    []int
		static  map[string]int
		dynamic []string
		want    map[string]int
		reason  string
	}{
		{name: "no network", want: map[string]int{}},
		{name: "static on a free node", static: map[string]int{"db": 5432}, want: map[string]int{"db": 5432}},
		{name: "static held", held: []int{5432}, static: map[string]int{"db": 5432}, reason: structs.PortCollision("db", 5432)},
		{name: "dynamic takes the lowest free", held: []int{20000, 20002}, dynamic: []string{"a", "b"},
			want: map[string]int{"a": 20001, "b": 20003}},
		{name: "dynamic skips the group's own static", static: map[string]int{"s": 20000}, dynamic: []string{"d"},
			want: map[string]int{"s": 20000, "d": 20001}},
		{name: "node range", node: small, held: []int{30000}, dynamic: []string{"a", "b"}, want: map[string]int{"a": 30001, "b": 30002}},
		{name: "range exhausted", node: small, held: []int{30000, 30001}, dynamic: []string{"a", "b"},
			reason: "network: dynamic port selection failed: no free port in 30000-30002"},
		{name: "static outside the range unaffected", node: small, held: []int{30000, 30001, 30002}, static: map[string]int{"http": 8080},
			want: map[string]int{"http": 8080}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var opts []nodeOpt
			if tc.node != nil {
				opts = append(opts, tc.node)
			}
			n := mkNode("n1", opts...)
			n.Attributes["unique.network.ip-address"] = "10.0.0.7"
			u := newNodeUsage(n)
			job := mkJob("web", structs.JobTypeService, 1)
			u.add(holding(mkAlloc("old", job, 0, "n1", structs.AllocClientStatusRunning), tc.held...))
			if tc.static != nil || tc.dynamic != nil {
				withPorts(job, tc.static, tc.dynamic...)
			}
			ports, reason := assignPorts(n, u, job.TaskGroups[0])
			must.Eq(t, tc.reason, reason)
			if tc.reason != "" {
				must.SliceEmpty(t, ports)
				return
			}
			got := map[string]int{}
			for _, p := range ports {
				got[p.Label] = p.Value
				must.Eq(t, "10.0.0.7", p.HostIP)
			}
			must.Eq(t, tc.want, got)
		})
	}
}

// Two allocations of one group on one node get different dynamic ports;
// a group whose static port is held elsewhere is placed on a free node,
// and with none left it is blocked with the collision in its metrics.
func TestPlacement_PortsAreAResource(t *testing.T) {
	job := withPorts(mkJob("web", structs.JobTypeService, 2), nil, "http")
	st := &fakeState{nodes: []*structs.Node{mkNode("n1")}, jobs: []*structs.Job{job}}
	plan, res := run(t, st, job)
	placed := placements(st, plan)
	must.Len(t, 2, placed)
	must.False(t, res.Blocked)
	must.Eq(t, map[string]int{"http": 20000}, portValues(placed[0]))
	must.Eq(t, map[string]int{"http": 20001}, portValues(placed[1]))

	db := withPorts(mkJob("db", structs.JobTypeService, 2), map[string]int{"pg": 5432})
	other := mkJob("other", structs.JobTypeService, 1)
	st = &fakeState{nodes: []*structs.Node{mkNode("n1"), mkNode("n2"), mkNode("n3")}, jobs: []*structs.Job{db},
		allocs: []*structs.Allocation{holding(mkAlloc("holder", other, 0, "n1", structs.AllocClientStatusRunning), 5432)}}
	plan, res = run(t, st, db)
	placed = placements(st, plan)
	must.Eq(t, []string{"n2", "n3"}, nodeIDs(placed))
	must.False(t, res.Blocked)

	db.TaskGroups[0].Count = 3
	plan, res = run(t, st, db)
	must.Len(t, 2, placements(st, plan), must.Sprint("the third finds no node"))
	must.True(t, res.Blocked)
	must.Eq(t, 3, res.FailedTGAllocs["web"].ConstraintFiltered[structs.PortCollision("pg", 5432)],
		must.Sprintf("metric %+v", res.FailedTGAllocs["web"]))
	// A stopped holder frees its port.
	st.allocs[0].DesiredStatus = structs.AllocDesiredStatusStop
	st.allocs[0].ClientStatus = structs.AllocClientStatusComplete
	plan, res = run(t, st, db)
	must.Len(t, 3, placements(st, plan))
	must.False(t, res.Blocked)
}

// The plan applier refuses a placement whose port the node already holds
// or that another placement of the plan takes: two schedulers may pick
// the same lowest free port at once.
func TestNodeFits_PortCollision(t *testing.T) {
	n := mkNode("n1")
	job := mkJob("web", structs.JobTypeService, 1)
	held := holding(mkAlloc("held", job, 0, "n1", structs.AllocClientStatusRunning), 20000)
	fresh := func(id string, port int) *structs.Allocation {
		return holding(mkAlloc(id, job, 1, "n1", structs.AllocClientStatusPending), port)
	}
	cases := []struct {
		name     string
		existing []*structs.Allocation
		stopping map[string]bool
		placing  []*structs.Allocation
		reason   string
	}{
		{name: "free", existing: []*structs.Allocation{held}, placing: []*structs.Allocation{fresh("a", 20001)}},
		{name: "held", existing: []*structs.Allocation{held}, placing: []*structs.Allocation{fresh("a", 20000)}, reason: structs.PortCollision("p0", 20000)},
		{name: "held by one stopping", existing: []*structs.Allocation{held}, stopping: map[string]bool{"held": true}, placing: []*structs.Allocation{fresh("a", 20000)}},
		{name: "twice in one plan", placing: []*structs.Allocation{fresh("a", 20005), fresh("b", 20005)}, reason: structs.PortCollision("p0", 20005)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ok, reason := NodeFits(n, tc.existing, tc.stopping, tc.placing)
			must.Eq(t, tc.reason, reason)
			must.Eq(t, tc.reason == "", ok)
		})
	}
}
