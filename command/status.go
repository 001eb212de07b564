package command

import (
	"fmt"
	"io"
	"net"
	"strconv"

	"github.com/roamhq/roam/api"
)

func init() {
	register("status", &Command{Synopsis: "Summarize the cluster: leader, servers and nodes", Run: runStatus})
}

const statusUsage = `Usage: roam status [options]

  Summarizes the cluster: its leader, its servers and their liveness, and
  its client nodes by status, then lists the nodes.
`

// clusterStatus is what roam status -json prints.
type clusterStatus struct {
	Region  string
	Leader  string
	Peers   []string
	Servers []*api.AgentMember
	Nodes   []*api.NodeListStub
}

func runStatus(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("status", statusUsage, errOut)
	verbose := fs.Bool("verbose", false, "show full node IDs")
	if code, ok := parseNoArgs(fs, args, errOut); !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	var st clusterStatus
	if st.Leader, err = c.Status().Leader(); err != nil {
		return fail(errOut, "querying leader", err)
	}
	if st.Peers, err = c.Status().Peers(); err != nil {
		return fail(errOut, "querying peers", err)
	}
	members, err := c.Agent().Members()
	if err != nil {
		return fail(errOut, "querying servers", err)
	}
	st.Region, st.Servers = members.ServerRegion, members.Members
	if st.Nodes, _, err = c.Nodes().List(nil); err != nil {
		return fail(errOut, "listing nodes", err)
	}
	if f.json {
		if err := printJSON(out, st); err != nil {
			return fail(errOut, "printing status", err)
		}
		return 0
	}

	leader := "<none>"
	if st.Leader != "" {
		leader = st.Leader
		for _, m := range st.Servers {
			if net.JoinHostPort(m.Addr, strconv.Itoa(int(m.Port))) == st.Leader {
				leader = fmt.Sprintf("%s (%s)", m.Name, st.Leader)
			}
		}
	}
	servers := map[string]int{}
	for _, m := range st.Servers {
		servers[m.Status]++
	}
	nodes := map[string]int{}
	for _, n := range st.Nodes {
		nodes[n.Status]++
	}
	fmt.Fprint(out, formatKV([][2]string{
		{"Region", st.Region},
		{"Leader", leader},
		{"Raft Peers", strconv.Itoa(len(st.Peers))},
		{"Servers", fmt.Sprintf("%d (%d alive, %d failed)", len(st.Servers), servers["alive"], len(st.Servers)-servers["alive"])},
		{"Nodes", fmt.Sprintf("%d (%d ready, %d down, %d initializing)", len(st.Nodes),
			nodes[api.NodeStatusReady], nodes[api.NodeStatusDown], nodes[api.NodeStatusInit])},
	}))
	if len(st.Nodes) > 0 {
		fmt.Fprintln(out)
		fmt.Fprint(out, nodeTable(st.Nodes, *verbose))
	}
	return 0
}
