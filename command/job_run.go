package command

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/roamhq/roam/api"
	"github.com/roamhq/roam/jobspec"
	"github.com/roamhq/roam/structs"
)

func init() {
	registerGroup("job", "Run, inspect and stop jobs")
	register("job run", &Command{Synopsis: "Register a job from a file and watch its placement", Run: runJobRun})
}

const jobRunUsage = `Usage: roam job run [options] <file>

  Registers the job in file: an HCL job file, or Nomad API JSON when the
  name ends in .json. Unless -detach is given, waits for the job's
  evaluation to finish and lists the allocations it placed.

  Exit codes: 0 when every allocation was placed, 2 when some could not be
  (the reasons are printed), 1 on any other error.
`

func runJobRun(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("job run", jobRunUsage, errOut)
	detach := fs.Bool("detach", false, "return once the job is registered, without waiting for its evaluation")
	verbose := fs.Bool("verbose", false, "show full IDs")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintln(errOut, "This command takes one argument: <file>")
		fs.Usage()
		return 1
	}
	job, err := readJobFile(pos[0])
	if err != nil {
		return fail(errOut, "reading job file", err)
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	resp, _, err := c.Jobs().Register(job, nil)
	if err != nil {
		return fail(errOut, "submitting job", err)
	}
	if f.json {
		if err := printJSON(out, resp); err != nil {
			return fail(errOut, "printing response", err)
		}
	}
	if resp.Warnings != "" {
		fmt.Fprintf(errOut, "Job Warnings:\n%s\n", resp.Warnings)
	}
	if *detach || f.json {
		if !f.json {
			fmt.Fprintf(out, "Job registration successful\nEvaluation ID: %s\n", resp.EvalID)
		}
		return 0
	}
	return monitorEval(c, resp.EvalID, *verbose, out, errOut)
}

// readJobFile parses an HCL or JSON job file with the same parser the
// servers use, so errors point into the file, and returns the job in API
// form.
func readJobFile(path string) (*api.Job, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var parsed *structs.Job
	if strings.EqualFold(filepath.Ext(path), ".json") {
		parsed, err = jobspec.ParseJSON(src)
	} else {
		parsed, err = jobspec.ParseHCL(path, src)
	}
	if err != nil {
		return nil, err
	}
	// The parsed job has Nomad's field names; its JSON is the API's.
	buf, err := json.Marshal(parsed)
	if err != nil {
		return nil, fmt.Errorf("encode job: %w", err)
	}
	var job api.Job
	if err := json.Unmarshal(buf, &job); err != nil {
		return nil, fmt.Errorf("decode job: %w", err)
	}
	return &job, nil
}

// evalPollWait bounds each blocking read of an evaluation being watched.
const evalPollWait = 5 * time.Second

// monitorEval waits for the evaluation to be processed (finished, or
// blocked waiting for capacity), then prints what it
// placed and why anything could not be placed. It returns the exit code:
// 0 all placed, 2 placement failures, 1 errors or a failed evaluation.
func monitorEval(c *api.Client, evalID string, verbose bool, out, errOut io.Writer) int {
	fmt.Fprintf(out, "==> Monitoring evaluation %s\n", evalID)
	var (
		eval  *api.Evaluation
		index uint64
	)
	for {
		e, qm, err := c.Evaluations().Info(evalID, &api.QueryOptions{WaitIndex: index, WaitTime: evalPollWait})
		if err != nil {
			return fail(errOut, "reading evaluation", err)
		}
		eval, index = e, qm.LastIndex
		// A blocked evaluation has been processed: it placed what it
		// could and waits for capacity for the rest.
		if eval.Terminal() || eval.Status == api.EvalStatusBlocked {
			break
		}
	}
	if eval.JobID != "" {
		allocs, _, err := c.Jobs().Allocations(eval.JobID, true, nil)
		if err != nil {
			return fail(errOut, "reading allocations", err)
		}
		sort.Slice(allocs, func(i, j int) bool { return allocs[i].Name < allocs[j].Name })
		for _, a := range allocs {
			if a.EvalID == eval.ID && a.DesiredStatus == api.AllocDesiredStatusRun {
				fmt.Fprintf(out, "    Allocation %s created: node %s, group %s\n",
					shortID(a.ID, verbose), shortID(a.NodeID, verbose), a.TaskGroup)
			}
		}
	}
	switch eval.Status {
	case api.EvalStatusBlocked:
		fmt.Fprintf(out, "==> Evaluation %s is blocked, waiting for capacity to place the rest\n", eval.ID)
	default:
		fmt.Fprintf(out, "==> Evaluation %s finished with status %s\n", eval.ID, eval.Status)
	}
	if eval.Status != api.EvalStatusComplete && eval.Status != api.EvalStatusBlocked {
		if eval.StatusDescription != "" {
			fmt.Fprintf(errOut, "Evaluation %s: %s\n", eval.ID, eval.StatusDescription)
		}
		return 1
	}
	if len(eval.FailedTGAllocs) == 0 {
		return 0
	}
	fmt.Fprintln(out, "==> Failed to place all allocations:")
	groups := make([]string, 0, len(eval.FailedTGAllocs))
	for g := range eval.FailedTGAllocs {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	for _, g := range groups {
		m := eval.FailedTGAllocs[g]
		failed := m.CoalescedFailures + 1
		if q, ok := eval.QueuedAllocations[g]; ok && q > failed {
			failed = q
		}
		fmt.Fprintf(out, "    Task Group %q (failed to place %d allocation(s)):\n", g, failed)
		for _, reason := range placementReasons(m) {
			fmt.Fprintf(out, "      * %s\n", reason)
		}
	}
	if eval.BlockedEval != "" {
		fmt.Fprintf(out, "    Evaluation %s waiting for additional capacity to place the remainder\n",
			shortID(eval.BlockedEval, verbose))
	}
	return 2
}

// placementReasons explains an allocation metric in sentences, most
// telling first.
func placementReasons(m *api.AllocationMetric) []string {
	var out []string
	if m.NodesEvaluated == 0 {
		out = append(out, "No nodes were eligible for evaluation")
	}
	for _, dc := range sortedIntKeys(m.NodesAvailable) {
		if m.NodesAvailable[dc] == 0 {
			out = append(out, fmt.Sprintf("No nodes are available in datacenter %q", dc))
		}
	}
	for _, class := range sortedIntKeys(m.ClassFiltered) {
		out = append(out, fmt.Sprintf("Class %q: %d nodes excluded by filter", class, m.ClassFiltered[class]))
	}
	for _, c := range sortedIntKeys(m.ConstraintFiltered) {
		out = append(out, fmt.Sprintf("Constraint %q: %d nodes excluded by filter", c, m.ConstraintFiltered[c]))
	}
	if m.NodesExhausted > 0 {
		out = append(out, fmt.Sprintf("Resources exhausted on %d nodes", m.NodesExhausted))
	}
	for _, d := range sortedIntKeys(m.DimensionExhausted) {
		out = append(out, fmt.Sprintf("Dimension %q exhausted on %d nodes", d, m.DimensionExhausted[d]))
	}
	if len(out) == 0 {
		out = append(out, fmt.Sprintf("%d nodes evaluated, %d filtered", m.NodesEvaluated, m.NodesFiltered))
	}
	return out
}

func sortedIntKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
