package command

import (
	"fmt"
	"io"
	"strconv"

	"github.com/roamhq/roam/api"
)

func init() {
	register("alloc fs", &Command{
		Synopsis: "List and read an allocation's files",
		Run:      runAllocFS,
	})
}

const allocFSUsage = `Usage: roam alloc fs [options] <alloc-id> [<path>]

  Lists the directory at path in the allocation's directory (its root by
  default), or prints the file there; -stat describes it instead. Tasks'
  secrets/ directories are not readable.
`

func runAllocFS(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("alloc fs", allocFSUsage, errOut)
	stat := fs.Bool("stat", false, "describe the file instead of reading it")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) < 1 || len(pos) > 2 {
		fmt.Fprintln(errOut, "This command takes one or two arguments: <alloc-id> [<path>]")
		fs.Usage()
		return 1
	}
	path := "/"
	if len(pos) == 2 {
		path = pos[1]
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	alloc, code, ok := lookupAlloc(c, pos[0], errOut)
	if !ok {
		return code
	}
	info, err := c.AllocFS().Stat(alloc.ID, path, nil)
	if err != nil {
		return fail(errOut, "reading "+path, err)
	}
	if f.json && *stat {
		return printOrFail(out, errOut, info)
	}
	switch {
	case *stat:
		fmt.Fprint(out, formatColumns([][]string{{"Mode", "Size", "Modified Time", "Name"}, fileRow(info)}))
	case info.IsDir:
		files, err := c.AllocFS().List(alloc.ID, path, nil)
		if err != nil {
			return fail(errOut, "listing "+path, err)
		}
		if f.json {
			return printOrFail(out, errOut, files)
		}
		rows := [][]string{{"Mode", "Size", "Modified Time", "Name"}}
		for _, fi := range files {
			rows = append(rows, fileRow(fi))
		}
		fmt.Fprint(out, formatColumns(rows))
	default:
		rc, err := c.AllocFS().Cat(alloc.ID, path, nil)
		if err != nil {
			return fail(errOut, "reading "+path, err)
		}
		defer rc.Close()
		if _, err := io.Copy(out, rc); err != nil {
			return fail(errOut, "reading "+path, err)
		}
	}
	return 0
}

func fileRow(fi *api.AllocFileInfo) []string {
	name := fi.Name
	if fi.IsDir {
		name += "/"
	}
	return []string{fi.FileMode, strconv.FormatInt(fi.Size, 10), fi.ModTime.UTC().Format("2006-01-02T15:04:05Z"), name}
}
