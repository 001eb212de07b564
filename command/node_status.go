package command

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/roamhq/roam/api"
)

func init() {
	registerGroup("node", "Interact with client nodes")
	register("node status", &Command{Synopsis: "List client nodes, or show one node", Run: runNodeStatus})
}

const nodeStatusUsage = `Usage: roam node status [options] [node-id]

  Without an argument, lists every client node. With a node ID, or a prefix
  that matches one node, shows that node. IDs are shortened to 8 characters
  unless -verbose is given.
`

func runNodeStatus(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("node status", nodeStatusUsage, errOut)
	verbose := fs.Bool("verbose", false, "show full IDs and, for one node, its attributes, meta and drivers")
	id, hasID, code, ok := parseOptionalID(fs, args, errOut, "<node-id>")
	if !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	if !hasID {
		return listNodes(c, f, *verbose, out, errOut)
	}
	return showNode(c, f, id, *verbose, out, errOut)
}

func listNodes(c *api.Client, f *apiFlags, verbose bool, out, errOut io.Writer) int {
	nodes, _, err := c.Nodes().List(nil)
	if err != nil {
		return fail(errOut, "listing nodes", err)
	}
	if f.json {
		if err := printJSON(out, nodes); err != nil {
			return fail(errOut, "printing nodes", err)
		}
		return 0
	}
	if len(nodes) == 0 {
		fmt.Fprintln(out, "No nodes registered")
		return 0
	}
	fmt.Fprint(out, nodeTable(nodes, verbose))
	return 0
}

// nodeTable renders nodes as Nomad's node list does.
func nodeTable(nodes []*api.NodeListStub, verbose bool) string {
	header := []string{"ID", "DC", "Name", "Class", "Drain", "Eligibility", "Status"}
	if verbose {
		header = append(header[:6:6], "Address", "Version", "Status")
	}
	rows := [][]string{header}
	for _, n := range nodes {
		row := []string{
			shortID(n.ID, verbose), n.Datacenter, n.Name, orNone(n.NodeClass),
			strconv.FormatBool(n.Drain), n.SchedulingEligibility,
		}
		if verbose {
			row = append(row, n.Address, n.Version)
		}
		rows = append(rows, append(row, n.Status))
	}
	return formatColumns(rows)
}

func showNode(c *api.Client, f *apiFlags, id string, verbose bool, out, errOut io.Writer) int {
	matches, _, err := c.Nodes().PrefixList(id)
	if err != nil {
		return fail(errOut, "looking up node", err)
	}
	match, ok := pickByPrefix(errOut, "node", id, matches,
		func(n *api.NodeListStub) string { return n.ID },
		func(ns []*api.NodeListStub) string { return nodeTable(ns, true) })
	if !ok {
		return 1
	}

	node, _, err := c.Nodes().Info(match.ID, nil)
	if err != nil {
		return fail(errOut, "reading node", err)
	}
	if f.json {
		if err := printJSON(out, node); err != nil {
			return fail(errOut, "printing node", err)
		}
		return 0
	}
	pairs := [][2]string{
		{"ID", shortID(node.ID, verbose)},
		{"Name", node.Name},
		{"Class", orNone(node.NodeClass)},
		{"DC", node.Datacenter},
		{"Drain", strconv.FormatBool(node.Drain)},
		{"Eligibility", node.SchedulingEligibility},
		{"Status", node.Status},
	}
	if node.StatusDescription != "" {
		pairs = append(pairs, [2]string{"Status Description", node.StatusDescription})
	}
	if node.StatusUpdatedAt != 0 {
		pairs = append(pairs, [2]string{"Status Updated", time.Unix(node.StatusUpdatedAt, 0).UTC().Format(time.RFC3339)})
	}
	pairs = append(pairs,
		[2]string{"HTTP Addr", orNone(node.HTTPAddr)},
		[2]string{"Version", orNone(node.Attributes["roam.version"])},
		[2]string{"Drivers", orNone(driverList(node.Drivers))},
	)
	if ld := node.LastDrain; ld != nil {
		pairs = append(pairs, [2]string{"Last Drain", fmt.Sprintf("%s (started %s, updated %s)",
			ld.Status, ld.StartedAt.UTC().Format(time.RFC3339), ld.UpdatedAt.UTC().Format(time.RFC3339))})
	}
	fmt.Fprint(out, formatKV(pairs))
	if verbose {
		printMap(out, "Attributes", node.Attributes)
		printMap(out, "Meta", node.Meta)
		printNodeDrivers(out, node.Drivers)
		printNodeCSI(out, "CSI Controller Plugins", node.CSIControllerPlugins)
		printNodeCSI(out, "CSI Node Plugins", node.CSINodePlugins)
	}
	return 0
}

// printNodeDrivers prints every driver the node reported, detected or
// not, with why not.
func printNodeDrivers(out io.Writer, m map[string]*api.DriverInfo) {
	fmt.Fprintf(out, "\nDrivers\n")
	if len(m) == 0 {
		fmt.Fprintln(out, "<none>")
		return
	}
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	rows := [][]string{{"Driver", "Detected", "Healthy", "Message"}}
	for _, name := range names {
		if d := m[name]; d != nil {
			rows = append(rows, []string{name, strconv.FormatBool(d.Detected), strconv.FormatBool(d.Healthy), orNone(d.HealthDescription)})
		}
	}
	fmt.Fprint(out, formatColumns(rows))
}

// printNodeCSI prints a titled table of a node's CSI plugin instances.
func printNodeCSI(out io.Writer, title string, m map[string]*api.CSIInfo) {
	fmt.Fprintf(out, "\n%s\n", title)
	if len(m) == 0 {
		fmt.Fprintln(out, "<none>")
		return
	}
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	rows := [][]string{{"Plugin ID", "Healthy", "Alloc ID", "Topology", "Description"}}
	for _, id := range ids {
		info := m[id]
		if info == nil {
			continue
		}
		topo := ""
		if info.NodeInfo != nil && info.NodeInfo.AccessibleTopology != nil {
			keys := make([]string, 0, len(info.NodeInfo.AccessibleTopology.Segments))
			for k := range info.NodeInfo.AccessibleTopology.Segments {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for i, k := range keys {
				keys[i] = k + "=" + info.NodeInfo.AccessibleTopology.Segments[k]
			}
			topo = strings.Join(keys, ",")
		}
		rows = append(rows, []string{id, strconv.FormatBool(info.Healthy), orNone(info.AllocID), orNone(topo), orNone(info.HealthDescription)})
	}
	fmt.Fprint(out, formatColumns(rows))
}

// driverList names the healthy drivers, sorted, comma-separated.
func driverList(drivers map[string]*api.DriverInfo) string {
	var names []string
	for name, d := range drivers {
		if d != nil && d.Detected && d.Healthy {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	s := ""
	for i, n := range names {
		if i > 0 {
			s += ","
		}
		s += n
	}
	return s
}

// printMap prints a titled, sorted key = value section.
func printMap(out io.Writer, title string, m map[string]string) {
	fmt.Fprintf(out, "\n%s\n", title)
	if len(m) == 0 {
		fmt.Fprintln(out, "<none>")
		return
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	pairs := make([][2]string, 0, len(keys))
	for _, k := range keys {
		pairs = append(pairs, [2]string{k, m[k]})
	}
	fmt.Fprint(out, formatKV(pairs))
}
