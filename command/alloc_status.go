package command

import (
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/roamhq/roam/api"
)

func init() {
	registerGroup("alloc", "Inspect allocations")
	register("alloc status", &Command{Synopsis: "Show an allocation and its tasks", Run: runAllocStatus})
	register("alloc logs", &Command{Synopsis: "Print a task's stdout or stderr", Run: runAllocLogs})
}

const allocStatusUsage = `Usage: roam alloc status [options] <alloc-id>

  Shows the allocation with that ID, or the one whose ID starts with it:
  its placement and statuses, then each task's state and recent events.
`

// maxTaskEvents is how many of a task's most recent events are shown.
const maxTaskEvents = 10

func runAllocStatus(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("alloc status", allocStatusUsage, errOut)
	verbose := fs.Bool("verbose", false, "show full IDs")
	stats := fs.Bool("stats", false, "measure each running task's CPU and memory on its node")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintln(errOut, "This command takes one argument: <alloc-id>")
		fs.Usage()
		return 1
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	alloc, code, ok := lookupAlloc(c, pos[0], errOut)
	if !ok {
		return code
	}
	if f.json {
		return printOrFail(out, errOut, alloc)
	}
	v := *verbose
	pairs := [][2]string{
		{"ID", shortID(alloc.ID, v)},
		{"Eval ID", shortID(alloc.EvalID, v)},
		{"Name", alloc.Name},
		{"Node ID", shortID(alloc.NodeID, v)},
		{"Node Name", alloc.NodeName},
		{"Job ID", alloc.JobID},
		{"Task Group", alloc.TaskGroup},
		{"Client Status", alloc.ClientStatus},
		{"Client Description", orNone(alloc.ClientDescription)},
		{"Desired Status", alloc.DesiredStatus},
		{"Desired Description", orNone(alloc.DesiredDescription)},
		{"Created", formatUnixNano(alloc.CreateTime)},
		{"Modified", formatUnixNano(alloc.ModifyTime)},
	}
	if alloc.DesiredTransition.ShouldMigrate() {
		pairs = append(pairs, [2]string{"Migrate", "true"})
	}
	if alloc.PreviousAllocation != "" {
		pairs = append(pairs, [2]string{"Replacement Of", shortID(alloc.PreviousAllocation, v)})
	}
	if alloc.NextAllocation != "" {
		pairs = append(pairs, [2]string{"Replaced By", shortID(alloc.NextAllocation, v)})
	}
	if alloc.RescheduleTracker != nil && len(alloc.RescheduleTracker.Events) > 0 {
		pairs = append(pairs, [2]string{"Reschedule Attempts", strconv.Itoa(len(alloc.RescheduleTracker.Events))})
	}
	if alloc.FollowupEvalID != "" {
		pairs = append(pairs, [2]string{"Follow-up Eval", shortID(alloc.FollowupEvalID, v)})
	}
	fmt.Fprint(out, formatKV(pairs))
	if ar := alloc.AllocatedResources; ar != nil && len(ar.Shared.Ports) > 0 {
		// As Nomad's "Allocation Addresses".
		rows := [][]string{{"Label", "Dynamic", "Address"}}
		static := staticPortLabels(alloc)
		for _, p := range ar.Shared.Ports {
			addr := net.JoinHostPort(p.HostIP, strconv.Itoa(p.Value))
			rows = append(rows, []string{p.Label, strconv.FormatBool(!static[p.Label]), addr})
		}
		fmt.Fprintln(out, "\nAllocation Addresses:")
		fmt.Fprint(out, formatColumns(rows))
	}

	var usage *api.AllocResourceUsage
	if *stats && alloc.ClientStatus == api.AllocClientStatusRunning {
		if usage, err = c.Allocations().Stats(alloc.ID, nil); err != nil {
			return fail(errOut, "reading allocation stats", err)
		}
	}

	tasks := make([]string, 0, len(alloc.TaskStates))
	for name := range alloc.TaskStates {
		tasks = append(tasks, name)
	}
	sort.Strings(tasks)
	for _, name := range tasks {
		st := alloc.TaskStates[name]
		fmt.Fprintf(out, "\nTask %q is %q\n", name, st.State)
		tp := [][2]string{{"Restarts", strconv.FormatUint(st.Restarts, 10)}}
		if !st.StartedAt.IsZero() {
			tp = append(tp, [2]string{"Started At", st.StartedAt.UTC().Format(time.RFC3339)})
		}
		if !st.FinishedAt.IsZero() {
			tp = append(tp, [2]string{"Finished At", st.FinishedAt.UTC().Format(time.RFC3339)})
		}
		if st.Failed {
			tp = append(tp, [2]string{"Failed", "true"})
		}
		fmt.Fprint(out, formatKV(tp))
		if usage != nil {
			printTaskUsage(out, alloc, name, usage.Tasks[name])
		}
		fmt.Fprintln(out, "\nRecent Events:")
		fmt.Fprint(out, taskEventTable(st.Events))
	}
	return 0
}

// printTaskUsage prints a task's measured CPU and memory beside what it
// asked for, as Nomad's "Task Resources".
func printTaskUsage(out io.Writer, alloc *api.Allocation, task string, u *api.TaskResourceUsage) {
	if u == nil || u.ResourceUsage == nil {
		return
	}
	askCPU, askMem := 0, 0
	if alloc.Job != nil {
		for _, tg := range alloc.Job.TaskGroups {
			if tg == nil || tg.Name != alloc.TaskGroup {
				continue
			}
			for _, t := range tg.Tasks {
				if t != nil && t.Name == task && t.Resources != nil {
					if t.Resources.CPU != nil {
						askCPU = *t.Resources.CPU
					}
					if t.Resources.MemoryMB != nil {
						askMem = *t.Resources.MemoryMB
					}
				}
			}
		}
	}
	rows := [][]string{{"CPU", "Memory", "Throttled"}}
	cpu, mem, thr := "-", "-", "-"
	if c := u.ResourceUsage.CpuStats; c != nil {
		cpu = fmt.Sprintf("%.0f/%d MHz", c.TotalTicks, askCPU)
		thr = fmt.Sprintf("%d periods", c.ThrottledPeriods)
	}
	if m := u.ResourceUsage.MemoryStats; m != nil {
		used := m.RSS
		if used == 0 {
			used = m.Usage
		}
		mem = fmt.Sprintf("%.1f MiB/%d MiB", float64(used)/(1<<20), askMem)
	}
	rows = append(rows, []string{cpu, mem, thr})
	fmt.Fprintln(out, "\nTask Resources:")
	fmt.Fprint(out, formatColumns(rows))
}

// staticPortLabels are the labels of the allocation's group's static
// ports.
func staticPortLabels(alloc *api.Allocation) map[string]bool {
	out := map[string]bool{}
	if alloc.Job == nil {
		return out
	}
	for _, tg := range alloc.Job.TaskGroups {
		if tg == nil || tg.Name != alloc.TaskGroup {
			continue
		}
		for _, n := range tg.Networks {
			if n == nil {
				continue
			}
			for _, p := range n.ReservedPorts {
				out[p.Label] = true
			}
		}
	}
	return out
}

// taskEventTable renders a task's most recent events, newest first.
func taskEventTable(events []*api.TaskEvent) string {
	evs := append([]*api.TaskEvent(nil), events...)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Time > evs[j].Time })
	if len(evs) > maxTaskEvents {
		evs = evs[:maxTaskEvents]
	}
	rows := [][]string{{"Time", "Type", "Description"}}
	for _, e := range evs {
		desc := e.DisplayMessage
		if desc == "" {
			desc = e.Message
		}
		if e.Type == "Terminated" && desc == "" {
			desc = fmt.Sprintf("Exit Code: %d", e.ExitCode)
			if e.Signal != 0 {
				desc += fmt.Sprintf(", Signal: %d", e.Signal)
			}
		}
		rows = append(rows, []string{formatUnixNano(e.Time), e.Type, desc})
	}
	return formatColumns(rows)
}

// lookupAlloc reads the allocation with an ID or unique prefix. On
// failure it has printed why and returns the exit code.
func lookupAlloc(c *api.Client, id string, errOut io.Writer) (*api.Allocation, int, bool) {
	matches, _, err := c.Allocations().PrefixList(id)
	if err != nil {
		return nil, fail(errOut, "looking up allocation", err), false
	}
	match, ok := pickByPrefix(errOut, "allocation", id, matches,
		func(a *api.AllocationListStub) string { return a.ID },
		func(as []*api.AllocationListStub) string { return allocTable(as, true) })
	if !ok {
		return nil, 1, false
	}
	alloc, _, err := c.Allocations().Info(match.ID, nil)
	if err != nil {
		return nil, fail(errOut, "reading allocation", err), false
	}
	return alloc, 0, true
}

const allocLogsUsage = `Usage: roam alloc logs [options] <alloc-id> [task]

  Prints a task's stdout (or stderr with -stderr). The task may be left out
  when the allocation's group has one task. Any agent can answer: one that
  does not run the allocation asks the agent that does.
`

func runAllocLogs(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("alloc logs", allocLogsUsage, errOut)
	stderr := fs.Bool("stderr", false, "print stderr instead of stdout")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) < 1 || len(pos) > 2 {
		fmt.Fprintln(errOut, "This command takes one or two arguments: <alloc-id> [task]")
		fs.Usage()
		return 1
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	alloc, code, ok := lookupAlloc(c, pos[0], errOut)
	if !ok {
		return code
	}
	var task string
	if len(pos) == 2 {
		task = pos[1]
	}
	if task == "" && alloc.Job != nil {
		if tg := alloc.Job.LookupTaskGroup(alloc.TaskGroup); tg != nil {
			if len(tg.Tasks) != 1 {
				names := make([]string, 0, len(tg.Tasks))
				for _, t := range tg.Tasks {
					names = append(names, t.Name)
				}
				fmt.Fprintf(errOut, "Allocation %s has %d tasks; name one of: %s\n",
					shortID(alloc.ID, false), len(names), strings.Join(names, ", "))
				return 1
			}
			task = tg.Tasks[0].Name
		}
	}
	stream := api.LogStdout
	if *stderr {
		stream = api.LogStderr
	}
	rc, err := c.AllocFS().Logs(alloc.ID, task, stream)
	if err != nil {
		return fail(errOut, "reading logs", err)
	}
	defer rc.Close()
	if _, err := io.Copy(out, rc); err != nil {
		return fail(errOut, "reading logs", err)
	}
	return 0
}
