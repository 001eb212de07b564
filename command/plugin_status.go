package command

import (
	"fmt"
	"io"
	"sort"
	"strconv"

	"github.com/roamhq/roam/api"
)

func init() {
	registerGroup("plugin", "Run and inspect CSI plugins")
	register("plugin status", &Command{Synopsis: "List CSI plugins, or show one plugin", Run: runPluginStatus})
}

const pluginStatusUsage = `Usage: roam plugin status [options] [plugin-id]

  Without an argument, lists the CSI plugins the cluster's nodes report.
  With a plugin ID, or a prefix that matches one plugin, shows that plugin
  and its controller and node instances. Node IDs are shortened to 8
  characters unless -verbose is given.
`

func runPluginStatus(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("plugin status", pluginStatusUsage, errOut)
	verbose := fs.Bool("verbose", false, "show full node IDs")
	id, hasID, code, ok := parseOptionalID(fs, args, errOut, "<plugin-id>")
	if !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	if !hasID {
		plugins, _, err := c.CSIPlugins().List(nil)
		if err != nil {
			return fail(errOut, "listing plugins", err)
		}
		if f.json {
			if err := printJSON(out, plugins); err != nil {
				return fail(errOut, "printing plugins", err)
			}
			return 0
		}
		if len(plugins) == 0 {
			fmt.Fprintln(out, "No CSI plugins")
			return 0
		}
		fmt.Fprint(out, pluginTable(plugins))
		return 0
	}
	return showPlugin(c, f, id, *verbose, out, errOut)
}

// pluginTable renders plugin stubs as a list.
func pluginTable(plugins []*api.CSIPluginListStub) string {
	rows := [][]string{{"ID", "Provider", "Controllers Healthy/Expected", "Nodes Healthy/Expected"}}
	for _, p := range plugins {
		rows = append(rows, []string{
			p.ID, orNone(p.Provider),
			fmt.Sprintf("%d/%d", p.ControllersHealthy, p.ControllersExpected),
			fmt.Sprintf("%d/%d", p.NodesHealthy, p.NodesExpected),
		})
	}
	return formatColumns(rows)
}

func showPlugin(c *api.Client, f *apiFlags, id string, verbose bool, out, errOut io.Writer) int {
	matches, _, err := c.CSIPlugins().List(&api.QueryOptions{Prefix: id})
	if err != nil {
		return fail(errOut, "looking up plugin", err)
	}
	match, ok := pickByPrefix(errOut, "plugin", id, matches,
		func(p *api.CSIPluginListStub) string { return p.ID }, pluginTable)
	if !ok {
		return 1
	}
	p, _, err := c.CSIPlugins().Info(match.ID, nil)
	if err != nil {
		return fail(errOut, "reading plugin", err)
	}
	if f.json {
		if err := printJSON(out, p); err != nil {
			return fail(errOut, "printing plugin", err)
		}
		return 0
	}
	fmt.Fprint(out, formatKV([][2]string{
		{"ID", p.ID},
		{"Provider", orNone(p.Provider)},
		{"Version", orNone(p.Version)},
		{"Controllers Healthy", strconv.Itoa(p.ControllersHealthy)},
		{"Controllers Expected", strconv.Itoa(p.ControllersExpected)},
		{"Controller Concurrency", strconv.Itoa(p.ControllerConcurrency)},
		{"Nodes Healthy", strconv.Itoa(p.NodesHealthy)},
		{"Nodes Expected", strconv.Itoa(p.NodesExpected)},
	}))
	if p.ControllerConcurrencyWarning != "" {
		fmt.Fprintf(out, "\nWarning: %s\n", p.ControllerConcurrencyWarning)
	}
	printInstances(out, "Controllers", p.Controllers, verbose)
	printInstances(out, "Nodes", p.Nodes, verbose)
	fmt.Fprintln(out, "\nAllocations")
	if len(p.Allocations) == 0 {
		fmt.Fprintln(out, "No allocations (the plugin runs outside Roam, or has no tasks)")
		return 0
	}
	rows := [][]string{{"ID", "Node ID", "Job", "Task Group", "Desired", "Status"}}
	for _, a := range p.Allocations {
		rows = append(rows, []string{shortID(a.ID, verbose), shortID(a.NodeID, verbose), a.JobID, a.TaskGroup, a.DesiredStatus, a.ClientStatus})
	}
	fmt.Fprint(out, formatColumns(rows))
	return 0
}

// printInstances prints a titled table of a plugin's instances by node.
func printInstances(out io.Writer, title string, m map[string]*api.CSIInfo, verbose bool) {
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
	rows := [][]string{{"Node ID", "Healthy", "Description"}}
	for _, id := range ids {
		info := m[id]
		if info == nil {
			info = &api.CSIInfo{}
		}
		rows = append(rows, []string{shortID(id, verbose), strconv.FormatBool(info.Healthy), orNone(info.HealthDescription)})
	}
	fmt.Fprint(out, formatColumns(rows))
}
