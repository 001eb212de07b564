package scheduler

import (
	"fmt"

	"github.com/roamhq/roam/structs"
)

// assignPorts picks the host ports of one allocation of tg on node n,
// given what n already holds (u): its static ports as asked, each dynamic
// port the lowest free one of the node's range. It is a pure function of
// its inputs, so the feasibility check and the placement agree. reason is
// set, in the words placement metrics use, when the node cannot take them.
func assignPorts(n *structs.Node, u *nodeUsage, tg *structs.TaskGroup) (ports []structs.AllocatedPortMapping, reason string) {
	if len(tg.Networks) == 0 {
		return nil, ""
	}
	ip := n.Attributes["unique.network.ip-address"]
	taken := func(p int) bool { return u.ports[p] > 0 }
	mine := map[int]bool{}
	for _, net := range tg.Networks {
		for _, p := range net.ReservedPorts {
			if taken(p.Value) || mine[p.Value] {
				return nil, structs.PortCollision(p.Label, p.Value)
			}
			mine[p.Value] = true
			ports = append(ports, structs.AllocatedPortMapping{Label: p.Label, Value: p.Value, To: max(p.To, 0), HostIP: ip})
		}
	}
	lo, hi := n.DynamicPortRange()
	next := lo
	for _, net := range tg.Networks {
		for _, p := range net.DynamicPorts {
			for next <= hi && (taken(next) || mine[next]) {
				next++
			}
			if next > hi {
				return nil, fmt.Sprintf("network: dynamic port selection failed: no free port in %d-%d", lo, hi)
			}
			mine[next] = true
			ports = append(ports, structs.AllocatedPortMapping{Label: p.Label, Value: next, To: max(p.To, 0), HostIP: ip})
		}
	}
	return ports, ""
}
