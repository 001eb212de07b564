package command

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/roamhq/roam/api"
)

func init() {
	register("job status", &Command{Synopsis: "List jobs, or show one job and its allocations", Run: runJobStatus})
	register("job stop", &Command{Synopsis: "Stop a job", Run: runJobStop})
}

const jobStatusUsage = `Usage: roam job status [options] [job-id]

  Without an argument, lists every job. With a job ID, or a prefix that
  matches one job, shows that job and its allocations.
`

func runJobStatus(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("job status", jobStatusUsage, errOut)
	verbose := fs.Bool("verbose", false, "show full IDs")
	all := fs.Bool("all-allocs", true, "include allocations that will not run again")
	id, hasID, code, ok := parseOptionalID(fs, args, errOut, "<job-id>")
	if !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	if !hasID {
		jobs, _, err := c.Jobs().List(nil)
		if err != nil {
			return fail(errOut, "listing jobs", err)
		}
		if f.json {
			return printOrFail(out, errOut, jobs)
		}
		if len(jobs) == 0 {
			fmt.Fprintln(out, "No running jobs")
			return 0
		}
		rows := [][]string{{"ID", "Type", "Priority", "Status", "Submit Date"}}
		for _, j := range jobs {
			rows = append(rows, []string{j.ID, j.Type, strconv.Itoa(j.Priority), j.Status, formatUnixNano(j.SubmitTime)})
		}
		fmt.Fprint(out, formatColumns(rows))
		return 0
	}

	jobID, code, ok := resolveJob(c, id, errOut)
	if !ok {
		return code
	}
	job, _, err := c.Jobs().Info(jobID, nil)
	if err != nil {
		return fail(errOut, "reading job", err)
	}
	allocs, _, err := c.Jobs().Allocations(jobID, *all, nil)
	if err != nil {
		return fail(errOut, "reading job allocations", err)
	}
	if f.json {
		return printOrFail(out, errOut, job)
	}
	fmt.Fprint(out, formatKV([][2]string{
		{"ID", job.ID},
		{"Name", job.Name},
		{"Submit Date", formatUnixNano(job.SubmitTime)},
		{"Type", job.Type},
		{"Priority", strconv.Itoa(job.Priority)},
		{"Datacenters", strings.Join(job.Datacenters, ",")},
		{"Status", job.Status},
	}))
	fmt.Fprintln(out, "\nAllocations")
	if len(allocs) == 0 {
		fmt.Fprintln(out, "No allocations placed")
		return 0
	}
	fmt.Fprint(out, allocTable(allocs, *verbose))
	return 0
}

// allocTable renders allocation stubs, newest first.
func allocTable(allocs []*api.AllocationListStub, verbose bool) string {
	sort.SliceStable(allocs, func(i, j int) bool { return allocs[i].CreateIndex > allocs[j].CreateIndex })
	rows := [][]string{{"ID", "Node ID", "Task Group", "Desired", "Status", "Created"}}
	for _, a := range allocs {
		rows = append(rows, []string{
			shortID(a.ID, verbose), shortID(a.NodeID, verbose), a.TaskGroup,
			a.DesiredStatus, a.ClientStatus, formatAge(a.CreateTime),
		})
	}
	return formatColumns(rows)
}

// resolveJob turns an ID or unique prefix into a job ID. On failure it
// has printed why and returns the exit code.
func resolveJob(c *api.Client, id string, errOut io.Writer) (string, int, bool) {
	if _, _, err := c.Jobs().Info(id, nil); err == nil {
		return id, 0, true
	} else if !isStatus(err, http.StatusNotFound) {
		return "", fail(errOut, "looking up job", err), false
	}
	matches, _, err := c.Jobs().PrefixList(id)
	if err != nil {
		return "", fail(errOut, "looking up job", err), false
	}
	match, ok := pickByPrefix(errOut, "job", id, matches,
		func(j *api.JobListStub) string { return j.ID },
		func(js []*api.JobListStub) string {
			rows := [][]string{{"ID", "Type", "Status"}}
			for _, j := range js {
				rows = append(rows, []string{j.ID, j.Type, j.Status})
			}
			return formatColumns(rows)
		})
	if !ok {
		return "", 1, false
	}
	return match.ID, 0, true
}

const jobStopUsage = `Usage: roam job stop [options] <job-id>

  Stops the job's allocations. With -purge the job is also removed. Unless
  -detach is given, waits for the evaluation that stops the allocations.
`

func runJobStop(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("job stop", jobStopUsage, errOut)
	purge := fs.Bool("purge", false, "remove the job, not only stop it")
	detach := fs.Bool("detach", false, "return at once instead of waiting for the evaluation")
	verbose := fs.Bool("verbose", false, "show full IDs")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintln(errOut, "This command takes one argument: <job-id>")
		fs.Usage()
		return 1
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	jobID, code, ok := resolveJob(c, pos[0], errOut)
	if !ok {
		return code
	}
	resp, _, err := c.Jobs().Deregister(jobID, *purge, nil)
	if err != nil {
		return fail(errOut, "deregistering job", err)
	}
	if f.json {
		return printOrFail(out, errOut, resp)
	}
	if *detach || resp.EvalID == "" {
		fmt.Fprintf(out, "Job %q stopped\n", jobID)
		if resp.EvalID != "" {
			fmt.Fprintf(out, "Evaluation ID: %s\n", resp.EvalID)
		}
		return 0
	}
	return monitorEval(c, resp.EvalID, *verbose, out, errOut)
}

// isStatus reports whether err is an API answer with the given status.
func isStatus(err error, code int) bool {
	var ue *api.UnexpectedResponseError
	return errors.As(err, &ue) && ue.StatusCode() == code
}

// printOrFail prints v as JSON and returns the exit code.
func printOrFail(out, errOut io.Writer, v any) int {
	if err := printJSON(out, v); err != nil {
		return fail(errOut, "printing result", err)
	}
	return 0
}

// formatUnixNano renders a Unix-nanosecond time in RFC 3339, UTC.
func formatUnixNano(ns int64) string {
	if ns == 0 {
		return "<none>"
	}
	return time.Unix(0, ns).UTC().Format(time.RFC3339)
}

// formatAge renders how long ago a Unix-nanosecond time was.
func formatAge(ns int64) string {
	if ns == 0 {
		return "<none>"
	}
	d := time.Since(time.Unix(0, ns))
	switch {
	case d < time.Second:
		return "now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds ago", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm ago", int(d.Hours()), int(d.Minutes())%60)
	}
	return time.Unix(0, ns).UTC().Format(time.RFC3339)
}
