package command

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/roamhq/roam/api"
)

func init() {
	register("volume status", &Command{Synopsis: "List CSI volumes, or show one volume and its claims", Run: runVolumeStatus})
	register("volume deregister", &Command{Synopsis: "Remove a CSI volume's registration", Run: runVolumeDeregister})
}

const volumeStatusUsage = `Usage: roam volume status [options] [volume-id]

  Without an argument, lists every CSI volume. With a volume ID, or a prefix
  that matches one volume, shows that volume and its claims. Allocation and
  node IDs are shortened to 8 characters unless -verbose is given.
`

func runVolumeStatus(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("volume status", volumeStatusUsage, errOut)
	verbose := fs.Bool("verbose", false, "show full IDs and, for one volume, its parameters and context")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) > 1 {
		fmt.Fprintln(errOut, "This command takes either no argument or one: <volume-id>")
		fs.Usage()
		return 1
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	if len(pos) == 0 {
		vols, _, err := c.CSIVolumes().List("", nil)
		if err != nil {
			return fail(errOut, "listing volumes", err)
		}
		if f.json {
			if err := printJSON(out, vols); err != nil {
				return fail(errOut, "printing volumes", err)
			}
			return 0
		}
		if len(vols) == 0 {
			fmt.Fprintln(out, "No CSI volumes")
			return 0
		}
		fmt.Fprint(out, volumeTable(vols))
		return 0
	}
	return showVolume(c, f, pos[0], *verbose, out, errOut)
}

// volumeTable renders volume stubs as a list.
func volumeTable(vols []*api.CSIVolumeListStub) string {
	rows := [][]string{{"ID", "Name", "Plugin ID", "Schedulable", "Access Mode"}}
	for _, v := range vols {
		rows = append(rows, []string{v.ID, v.Name, v.PluginID, strconv.FormatBool(v.Schedulable), orNone(v.AccessMode)})
	}
	return formatColumns(rows)
}

func showVolume(c *api.Client, f *apiFlags, id string, verbose bool, out, errOut io.Writer) int {
	matches, _, err := c.CSIVolumes().List("", &api.QueryOptions{Prefix: id})
	if err != nil {
		return fail(errOut, "looking up volume", err)
	}
	for _, v := range matches {
		if v.ID == id { // an exact ID wins over longer IDs it prefixes
			matches = []*api.CSIVolumeListStub{v}
			break
		}
	}
	switch len(matches) {
	case 0:
		fmt.Fprintf(errOut, "No volume(s) with prefix or ID %q found\n", id)
		return 1
	case 1:
	default:
		fmt.Fprintf(errOut, "Prefix %q matched multiple volumes\n\n", id)
		fmt.Fprint(errOut, volumeTable(matches))
		return 1
	}
	vol, _, err := c.CSIVolumes().Info(matches[0].ID, nil)
	if err != nil {
		return fail(errOut, "reading volume", err)
	}
	if f.json {
		if err := printJSON(out, vol); err != nil {
			return fail(errOut, "printing volume", err)
		}
		return 0
	}
	caps := make([]string, 0, len(vol.RequestedCapabilities))
	for _, cp := range vol.RequestedCapabilities {
		caps = append(caps, cp.AccessMode+"/"+cp.AttachmentMode)
	}
	mount := ""
	if m := vol.MountOptions; m != nil {
		mount = strings.TrimSpace(fmt.Sprintf("fs_type=%s flags=%s", orNone(m.FSType), orNone(strings.Join(m.MountFlags, ","))))
	}
	pairs := [][2]string{
		{"ID", vol.ID},
		{"Name", vol.Name},
		{"External ID", vol.ExternalID},
		{"Plugin ID", vol.PluginID},
		{"Provider", orNone(vol.Provider)},
		{"Schedulable", strconv.FormatBool(vol.Schedulable)},
		{"Controllers Healthy", strconv.Itoa(vol.ControllersHealthy)},
		{"Controllers Expected", strconv.Itoa(vol.ControllersExpected)},
		{"Nodes Healthy", strconv.Itoa(vol.NodesHealthy)},
		{"Nodes Expected", strconv.Itoa(vol.NodesExpected)},
		{"Capabilities", orNone(strings.Join(caps, ", "))},
		{"Mount Options", orNone(mount)},
		{"Capacity Min", strconv.FormatInt(vol.RequestedCapacityMin, 10)},
		{"Capacity Max", strconv.FormatInt(vol.RequestedCapacityMax, 10)},
	}
	fmt.Fprint(out, formatKV(pairs))
	if verbose {
		printMap(out, "Parameters", vol.Parameters)
		printMap(out, "Context", vol.Context)
	}
	fmt.Fprintln(out, "\nClaims")
	if len(vol.Claims) == 0 {
		fmt.Fprintln(out, "No claims")
		return 0
	}
	claims := append([]*api.CSIVolumeClaim(nil), vol.Claims...)
	sort.Slice(claims, func(i, j int) bool { return claims[i].AllocationID < claims[j].AllocationID })
	rows := [][]string{{"Alloc ID", "Node ID", "Mode", "State"}}
	for _, cl := range claims {
		rows = append(rows, []string{shortID(cl.AllocationID, verbose), shortID(cl.NodeID, verbose), cl.Mode, cl.State})
	}
	fmt.Fprint(out, formatColumns(rows))
	return 0
}

const volumeDeregisterUsage = `Usage: roam volume deregister [options] <volume-id>

  Removes a volume's registration; the volume stays in the storage provider.
  A claimed volume is refused unless -force is given and every claiming
  allocation has stopped.
`

func runVolumeDeregister(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("volume deregister", volumeDeregisterUsage, errOut)
	force := fs.Bool("force", false, "deregister even if claims remain from stopped allocations")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintln(errOut, "This command takes one argument: <volume-id>")
		fs.Usage()
		return 1
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	if _, err := c.CSIVolumes().Deregister(pos[0], *force, nil); err != nil {
		return fail(errOut, "deregistering volume", err)
	}
	fmt.Fprintf(out, "Volume %q deregistered\n", pos[0])
	return 0
}
