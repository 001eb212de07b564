package command

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/roamhq/roam/api"
)

func init() {
	register("node drain", &Command{Synopsis: "Start or stop draining a node, or watch a drain", Run: runNodeDrain})
	register("node eligibility", &Command{Synopsis: "Mark a node eligible or ineligible for placements", Run: runNodeEligibility})
}

// confirmInput is where confirmation prompts read their answer.
var confirmInput io.Reader = os.Stdin

const nodeDrainUsage = `Usage: roam node drain [options] <node-id>

  -enable marks the node ineligible and moves its allocations to other
  nodes, within each group's migrate max_parallel, until the deadline,
  when whatever is left is stopped. -disable stops the drain and makes the
  node eligible again (unless -keep-ineligible). -monitor watches the
  drain, after changing it or on its own, printing each allocation as it
  is marked for migration and as it stops, until the drain is done.
`

// drainPollWait bounds each blocking read while watching a drain, and so
// how late the end of a drain is noticed.
const drainPollWait = time.Second

func runNodeDrain(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("node drain", nodeDrainUsage, errOut)
	enable := fs.Bool("enable", false, "start draining the node")
	disable := fs.Bool("disable", false, "stop draining the node")
	deadline := fs.Duration("deadline", time.Hour, "with -enable: stop what is left after this long")
	noDeadline := fs.Bool("no-deadline", false, "with -enable: never stop allocations that have not moved")
	force := fs.Bool("force", false, "with -enable: stop every allocation at once")
	ignoreSystem := fs.Bool("ignore-system", false, "with -enable: leave system job allocations in place")
	keepIneligible := fs.Bool("keep-ineligible", false, "with -disable: leave the node ineligible")
	monitor := fs.Bool("monitor", false, "watch the drain until it is done")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	verbose := fs.Bool("verbose", false, "show full IDs")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	deadlineSet := flagSet(fs, "deadline")
	var problem string
	switch {
	case len(pos) != 1:
		problem = "This command takes one argument: <node-id>"
	case *enable && *disable:
		problem = "Give only one of -enable and -disable"
	case !*enable && !*disable && !*monitor:
		problem = "Give one of -enable, -disable or -monitor"
	case *enable && countTrue(*force, *noDeadline, deadlineSet) > 1:
		problem = "Give only one of -deadline, -no-deadline and -force"
	case !*enable && (*force || *noDeadline || *ignoreSystem || deadlineSet):
		problem = "-deadline, -no-deadline, -force and -ignore-system go with -enable"
	case *deadline <= 0 && !*noDeadline && !*force:
		problem = "-deadline must be positive; use -no-deadline or -force instead"
	}
	if problem != "" {
		fmt.Fprintln(errOut, problem)
		fs.Usage()
		return 1
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	nodeID, code, ok := resolveNode(c, pos[0], errOut)
	if !ok {
		return code
	}
	switch {
	case *enable:
		if !*yes && !confirm(out, fmt.Sprintf("Are you sure you want to enable drain mode for node %q? [y/N] ", nodeID)) {
			fmt.Fprintln(out, "Canceling drain")
			return 1
		}
		spec := &api.DrainSpec{Deadline: *deadline, IgnoreSystemJobs: *ignoreSystem}
		switch {
		case *force:
			spec.Deadline = -1
		case *noDeadline:
			spec.Deadline = 0
		}
		if _, _, err := c.Nodes().UpdateDrain(nodeID, spec, false, nil); err != nil {
			return fail(errOut, "updating drain", err)
		}
		fmt.Fprintf(out, "Node %q drain strategy set\n", nodeID)
	case *disable:
		if _, _, err := c.Nodes().UpdateDrain(nodeID, nil, !*keepIneligible, nil); err != nil {
			return fail(errOut, "updating drain", err)
		}
		fmt.Fprintf(out, "Node %q drain strategy unset\n", nodeID)
	}
	if !*monitor {
		return 0
	}
	return monitorDrain(c, nodeID, *verbose, out, errOut)
}

// monitorDrain prints each of the node's allocations as the drain marks
// it for migration and as it stops, until the node has no drain.
func monitorDrain(c *api.Client, nodeID string, verbose bool, out, errOut io.Writer) int {
	type seen struct{ migrating, stopped bool }
	allocs := map[string]*seen{}
	first := true
	var index uint64
	report := func(list []*api.Allocation) {
		sort.Slice(list, func(i, j int) bool { return list[i].CreateIndex < list[j].CreateIndex })
		for _, a := range list {
			st := allocs[a.ID]
			stopped := a.DesiredStatus != api.AllocDesiredStatusRun || clientTerminal(a.ClientStatus)
			if st == nil {
				// Allocations already stopped when the watch began are history.
				st = &seen{stopped: first && stopped && !a.DesiredTransition.ShouldMigrate()}
				allocs[a.ID] = st
			}
			if a.DesiredTransition.ShouldMigrate() && !st.migrating {
				st.migrating = true
				fmt.Fprintf(out, "Alloc %s marked for migration\n", shortID(a.ID, verbose))
			}
			if stopped && !st.stopped {
				st.stopped = true
				fmt.Fprintf(out, "Alloc %s stopped\n", shortID(a.ID, verbose))
			}
		}
		first = false
	}
	for {
		list, qm, err := c.Nodes().Allocations(nodeID, &api.QueryOptions{WaitIndex: index, WaitTime: drainPollWait})
		if err != nil {
			return fail(errOut, "reading node allocations", err)
		}
		index = qm.LastIndex
		report(list)
		node, _, err := c.Nodes().Info(nodeID, nil)
		if err != nil {
			return fail(errOut, "reading node", err)
		}
		if node.DrainStrategy != nil {
			continue
		}
		// The drain is over; report what changed on the way out.
		list, _, err = c.Nodes().Allocations(nodeID, nil)
		if err != nil {
			return fail(errOut, "reading node allocations", err)
		}
		report(list)
		fmt.Fprintf(out, "Drain complete for node %s\n", nodeID)
		return 0
	}
}

func clientTerminal(status string) bool {
	switch status {
	case api.AllocClientStatusComplete, api.AllocClientStatusFailed, api.AllocClientStatusLost:
		return true
	}
	return false
}

const nodeEligibilityUsage = `Usage: roam node eligibility [options] -enable|-disable <node-id>

  Marks the node eligible (-enable) or ineligible (-disable) for new
  placements. Allocations already on the node are left alone.
`

func runNodeEligibility(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("node eligibility", nodeEligibilityUsage, errOut)
	enable := fs.Bool("enable", false, "mark the node eligible")
	disable := fs.Bool("disable", false, "mark the node ineligible")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 || *enable == *disable {
		fmt.Fprintln(errOut, "This command takes one of -enable and -disable, and one argument: <node-id>")
		fs.Usage()
		return 1
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	nodeID, code, ok := resolveNode(c, pos[0], errOut)
	if !ok {
		return code
	}
	if _, _, err := c.Nodes().UpdateEligibility(nodeID, *enable, nil); err != nil {
		return fail(errOut, "updating scheduling eligibility", err)
	}
	state := "eligible"
	if *disable {
		state = "ineligible"
	}
	fmt.Fprintf(out, "Node %q scheduling eligibility set: %s for scheduling\n", nodeID, state)
	return 0
}

// resolveNode turns a node ID or unique prefix into a node ID. On failure
// it has printed why and returns the exit code.
func resolveNode(c *api.Client, id string, errOut io.Writer) (string, int, bool) {
	matches, _, err := c.Nodes().PrefixList(id)
	if err != nil {
		return "", fail(errOut, "looking up node", err), false
	}
	match, ok := pickByPrefix(errOut, "node", id, matches,
		func(n *api.NodeListStub) string { return n.ID },
		func(ns []*api.NodeListStub) string { return nodeTable(ns, true) })
	if !ok {
		return "", 1, false
	}
	return match.ID, 0, true
}

// confirm asks question and reports whether the answer was yes. No
// answer (end of input) is no.
func confirm(out io.Writer, question string) bool {
	fmt.Fprint(out, question)
	line, _ := bufio.NewReader(confirmInput).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	return false
}

func countTrue(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// flagSet reports whether the named flag was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			found = true
		}
	})
	return found
}
