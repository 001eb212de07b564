package command

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/roamhq/roam/api"
)

func init() {
	register("volume create", &Command{Synopsis: "Create a CSI volume in its storage provider and register it", Run: runVolumeCreate})
	register("volume delete", &Command{Synopsis: "Delete a CSI volume in its storage provider and deregister it", Run: runVolumeDelete})
	register("volume detach", &Command{Synopsis: "Release a CSI volume's claims on a node whose allocations stopped", Run: runVolumeDetach})
	registerGroup("volume snapshot", "Create, delete and list CSI volume snapshots")
	register("volume snapshot create", &Command{Synopsis: "Snapshot a CSI volume", Run: runSnapshotCreate})
	register("volume snapshot delete", &Command{Synopsis: "Delete a CSI snapshot", Run: runSnapshotDelete})
	register("volume snapshot list", &Command{Synopsis: "List a CSI plugin's snapshots", Run: runSnapshotList})
}

const volumeCreateUsage = `Usage: roam volume create [options] <file>

  Creates a volume in its storage provider, through the plugin's
  controller, and registers it. The spec is the one of "roam volume
  register", without external_id: the provider assigns it, and with
  at most one content source:

    snapshot_id = "snap-0123"   # restore a snapshot of the plugin's
    clone_id    = "vol-0456"    # copy a volume (its external ID)

  The plugin's controller must advertise CREATE_DELETE_SNAPSHOT or
  CLONE_VOLUME for them. Creating a registered ID again updates it; a
  larger capacity_min then expands the volume.
`

func runVolumeCreate(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("volume create", volumeCreateUsage, errOut)
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintln(errOut, "This command takes one argument: <file>")
		fs.Usage()
		return 1
	}
	src, err := os.ReadFile(pos[0])
	if err != nil {
		return fail(errOut, "reading volume file", err)
	}
	vol, err := parseVolumeCreateSpec(pos[0], src)
	if err != nil {
		return fail(errOut, "parsing volume file", err)
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	vols, _, err := c.CSIVolumes().Create(vol, nil)
	if err != nil {
		return fail(errOut, "creating volume", err)
	}
	if f.json {
		if err := printJSON(out, vols); err != nil {
			return fail(errOut, "printing", err)
		}
		return 0
	}
	for _, v := range vols {
		fmt.Fprintf(out, "Created external volume %s with ID %s\n", v.ExternalID, v.ID)
	}
	return 0
}

// parseVolumeCreateSpec parses a volume spec as parseVolumeSpec does,
// except that external_id may be left out. A spec without one gets an
// empty one appended, after every line of the file, so the positions in
// any error stay those of the file.
func parseVolumeCreateSpec(filename string, src []byte) (*api.CSIVolume, error) {
	file, diags := hclparse.NewParser().ParseHCL(src, filename)
	if !diags.HasErrors() {
		if body, ok := file.Body.(*hclsyntax.Body); ok {
			if _, has := body.Attributes["external_id"]; !has {
				src = append(append(append([]byte{}, src...), '\n'), []byte("external_id = \"\"\n")...)
			}
		}
	}
	return parseVolumeSpec(filename, src)
}

const volumeDeleteUsage = `Usage: roam volume delete [options] <volume id>

  Deletes a volume in its storage provider and removes its registration.
  A volume with claims is refused.
`

func runVolumeDelete(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("volume delete", volumeDeleteUsage, errOut)
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintln(errOut, "This command takes one argument: <volume id>")
		fs.Usage()
		return 1
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	if _, err := c.CSIVolumes().Delete(pos[0], nil); err != nil {
		return fail(errOut, "deleting volume", err)
	}
	fmt.Fprintf(out, "Successfully deleted volume %q!\n", pos[0])
	return 0
}

const volumeDetachUsage = `Usage: roam volume detach [options] <volume id> <node id>

  Releases the volume's claims held on the node: the node and then the
  controller detach it. Every claiming allocation on the node must have
  stopped.
`

func runVolumeDetach(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("volume detach", volumeDetachUsage, errOut)
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 2 {
		fmt.Fprintln(errOut, "This command takes two arguments: <volume id> <node id>")
		fs.Usage()
		return 1
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	if _, err := c.CSIVolumes().Detach(pos[0], pos[1], nil); err != nil {
		return fail(errOut, "detaching volume", err)
	}
	fmt.Fprintf(out, "Successfully detached volume %q from node %q\n", pos[0], pos[1])
	return 0
}

const snapshotCreateUsage = `Usage: roam volume snapshot create [options] <volume id> [snapshot name]

  Snapshots a registered volume through its plugin's controller. Without a
  name the server makes one from the volume ID and the time.
`

func runSnapshotCreate(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("volume snapshot create", snapshotCreateUsage, errOut)
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 && len(pos) != 2 {
		fmt.Fprintln(errOut, "This command takes one or two arguments: <volume id> [snapshot name]")
		fs.Usage()
		return 1
	}
	snap := &api.CSISnapshot{SourceVolumeID: pos[0]}
	if len(pos) == 2 {
		snap.Name = pos[1]
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	resp, _, err := c.CSIVolumes().CreateSnapshot(snap, nil)
	if err != nil {
		return fail(errOut, "creating snapshot", err)
	}
	if f.json {
		if err := printJSON(out, resp.Snapshots); err != nil {
			return fail(errOut, "printing", err)
		}
		return 0
	}
	printSnapshots(out, resp.Snapshots)
	return 0
}

const snapshotDeleteUsage = `Usage: roam volume snapshot delete [options] <plugin id> <snapshot id>

  Deletes a snapshot through the plugin's controller. Deleting an unknown
  snapshot succeeds.
`

func runSnapshotDelete(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("volume snapshot delete", snapshotDeleteUsage, errOut)
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 2 {
		fmt.Fprintln(errOut, "This command takes two arguments: <plugin id> <snapshot id>")
		fs.Usage()
		return 1
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	if _, err := c.CSIVolumes().DeleteSnapshot(pos[0], pos[1], nil); err != nil {
		return fail(errOut, "deleting snapshot", err)
	}
	fmt.Fprintf(out, "Deleted snapshot %s\n", pos[1])
	return 0
}

const snapshotListUsage = `Usage: roam volume snapshot list [options] -plugin <plugin id>

  Lists the plugin's snapshots, as its controller reports them.
`

func runSnapshotList(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("volume snapshot list", snapshotListUsage, errOut)
	var pluginID string
	fs.StringVar(&pluginID, "plugin", "", "ID of the plugin whose snapshots to list (required)")
	code, ok := parseNoArgs(fs, args, errOut)
	if !ok {
		return code
	}
	if pluginID == "" {
		fmt.Fprintln(errOut, "The -plugin flag is required")
		fs.Usage()
		return 1
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	var all []*api.CSISnapshot
	token := ""
	for {
		resp, _, err := c.CSIVolumes().ListSnapshots(pluginID, token, nil)
		if err != nil {
			return fail(errOut, "listing snapshots", err)
		}
		all = append(all, resp.Snapshots...)
		if resp.NextToken == "" || resp.NextToken == token {
			break
		}
		token = resp.NextToken
	}
	if f.json {
		if err := printJSON(out, all); err != nil {
			return fail(errOut, "printing", err)
		}
		return 0
	}
	if len(all) == 0 {
		fmt.Fprintln(out, "No snapshots found")
		return 0
	}
	printSnapshots(out, all)
	return 0
}

// printSnapshots writes snapshots as a table.
func printSnapshots(out io.Writer, snaps []*api.CSISnapshot) {
	rows := [][]string{{"Snapshot ID", "External ID", "Size", "Creation Time", "Ready?"}}
	for _, s := range snaps {
		rows = append(rows, []string{s.ID, s.ExternalSourceVolumeID, fmt.Sprintf("%d", s.SizeBytes),
			formatUnixNano(s.CreateTime * int64(time.Second)), fmt.Sprintf("%t", s.IsReady)})
	}
	fmt.Fprint(out, formatColumns(rows))
}
