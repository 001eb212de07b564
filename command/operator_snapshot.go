package command

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"

	"github.com/roamhq/roam/internal/fsutil"
	"github.com/roamhq/roam/nomad"
)

func init() {
	registerGroup("operator snapshot", "Save, restore and inspect snapshots of server state")
	register("operator snapshot save", &Command{Synopsis: "Save a snapshot of all server state to a file", Run: runSnapshotSave})
	register("operator snapshot restore", &Command{Synopsis: "Replace all server state with a snapshot file", Run: runSnapshotRestore})
	register("operator snapshot inspect", &Command{Synopsis: "Check a snapshot file and print what it holds", Run: runSnapshotInspect})
}

const snapshotSaveUsage = `Usage: roam operator snapshot save [options] FILE

  Saves a point-in-time snapshot of all server state (jobs, allocations,
  nodes, volumes and their claims, plugins) to FILE, with its Raft index,
  term and a checksum. The leader takes the snapshot; any agent may be
  asked. FILE is written only once the whole snapshot arrived and checked.
`

func runSnapshotSave(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("operator snapshot save", snapshotSaveUsage, errOut)
	path, code, ok := oneFileArg(fs, args, errOut)
	if !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	rc, err := c.Operator().Snapshot(nil)
	if err != nil {
		return fail(errOut, "saving snapshot", err)
	}
	defer rc.Close()
	file, err := io.ReadAll(io.LimitReader(rc, nomad.DefaultSnapshotMaxBytes+1))
	if err != nil {
		return fail(errOut, "reading snapshot", err)
	}
	// Checked before it is written: a copy cut short in transit must not
	// sit on disk looking like a backup.
	hdr, _, err := nomad.ReadSnapshotFile(bytes.NewReader(file), nomad.DefaultSnapshotMaxBytes)
	if err != nil {
		return fail(errOut, "checking the received snapshot", err)
	}
	if err := fsutil.WriteFileAtomic(path, file, 0o600); err != nil {
		return fail(errOut, "writing snapshot", err)
	}
	if f.json {
		if err := printJSON(out, hdr); err != nil {
			return fail(errOut, "printing result", err)
		}
		return 0
	}
	fmt.Fprintf(out, "State file written to %s (index %d, term %d, %d bytes)\n", path, hdr.Index, hdr.Term, len(file))
	return 0
}

const snapshotRestoreUsage = `Usage: roam operator snapshot restore [options] FILE

  Replaces all server state with the snapshot in FILE, through Raft, so
  every server installs it. The file is checked (checksum, size, and that
  every object decodes) here and again on the leader; a damaged file is
  refused and changes nothing.
`

func runSnapshotRestore(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("operator snapshot restore", snapshotRestoreUsage, errOut)
	path, code, ok := oneFileArg(fs, args, errOut)
	if !ok {
		return code
	}
	file, hdr, err := readSnapshotPath(path)
	if err != nil {
		return fail(errOut, "reading snapshot", err)
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	res, _, err := c.Operator().SnapshotRestoreResult(bytes.NewReader(file), nil)
	if err != nil {
		return fail(errOut, "restoring snapshot", err)
	}
	if f.json {
		if err := printJSON(out, res); err != nil {
			return fail(errOut, "printing result", err)
		}
		return 0
	}
	fmt.Fprintf(out, "Snapshot restored: index %d, term %d (written at index %d), %s\n",
		hdr.Index, hdr.Term, res.RestoredIndex, countsLine(hdr.Counts))
	return 0
}

const snapshotInspectUsage = `Usage: roam operator snapshot inspect [options] FILE

  Checks the snapshot in FILE (checksum, size, and that every object
  decodes) and prints its index, term, size and the objects per table.
  Needs no cluster. Exits 1 if the file is damaged.
`

func runSnapshotInspect(args []string, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("operator snapshot inspect", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		fmt.Fprint(errOut, snapshotInspectUsage)
		fmt.Fprintln(errOut, "\nOptions:")
		fs.PrintDefaults()
	}
	asJSON := fs.Bool("json", false, "print the header as JSON")
	path, code, ok := oneFileArg(fs, args, errOut)
	if !ok {
		return code
	}
	file, hdr, err := readSnapshotPath(path)
	if err != nil {
		return fail(errOut, "inspecting snapshot", err)
	}
	if *asJSON {
		if err := printJSON(out, hdr); err != nil {
			return fail(errOut, "printing result", err)
		}
		return 0
	}
	fmt.Fprint(out, formatKV([][2]string{
		{"Index", strconv.FormatUint(hdr.Index, 10)},
		{"Term", strconv.FormatUint(hdr.Term, 10)},
		{"Region", hdr.Region},
		{"Created", hdr.CreatedAt.Format("2006-01-02T15:04:05Z07:00")},
		{"Size", strconv.Itoa(len(file))},
		{"SHA256", hdr.SHA256},
		{"Version", strconv.Itoa(hdr.Version)},
	}))
	fmt.Fprintln(out)
	tables := make([]string, 0, len(hdr.Counts))
	for t := range hdr.Counts {
		tables = append(tables, t)
	}
	sort.Strings(tables)
	rows := [][]string{{"Table", "Count"}}
	for _, t := range tables {
		rows = append(rows, []string{t, strconv.Itoa(hdr.Counts[t])})
	}
	fmt.Fprint(out, formatColumns(rows))
	return 0
}

// oneFileArg parses args, which must name exactly one file.
func oneFileArg(fs *flag.FlagSet, args []string, errOut io.Writer) (string, int, bool) {
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return "", code, false
	}
	if len(pos) != 1 || pos[0] == "" {
		fmt.Fprintln(errOut, "This command takes one argument: the snapshot file")
		fs.Usage()
		return "", 1, false
	}
	return pos[0], 0, true
}

// readSnapshotPath reads and checks the snapshot file at path.
func readSnapshotPath(path string) ([]byte, *nomad.SnapshotHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	file, err := io.ReadAll(io.LimitReader(f, nomad.DefaultSnapshotMaxBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", path, err)
	}
	hdr, _, err := nomad.ReadSnapshotFile(bytes.NewReader(file), nomad.DefaultSnapshotMaxBytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return file, hdr, nil
}

// countsLine renders table counts on one line, tables in order.
func countsLine(counts map[string]int) string {
	tables := make([]string, 0, len(counts))
	for t := range counts {
		tables = append(tables, t)
	}
	sort.Strings(tables)
	s := ""
	for i, t := range tables {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%d %s", counts[t], t)
	}
	return s
}
