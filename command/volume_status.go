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

  -type csi            the only volume type (accepted for Nomad's sake)
  -plugin ID           list only the volumes of that plugin
  -external            with -plugin: list what the plugin's storage provider
                       has, registered or not (CSI ListVolumes), a page at a
                       time; -per-page N and -page-token T page through it
`

func runVolumeStatus(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("volume status", volumeStatusUsage, errOut)
	verbose := fs.Bool("verbose", false, "show full IDs and, for one volume, its parameters and context")
	typ := fs.String("type", "csi", "volume type; only csi")
	pluginID := fs.String("plugin", "", "only the volumes of this plugin")
	external := fs.Bool("external", false, "list the provider's volumes (needs -plugin)")
	perPage := fs.Int("per-page", 0, "with -external: volumes per page (0: the provider's choice)")
	pageToken := fs.String("page-token", "", "with -external: the page to start at")
	id, hasID, code, ok := parseOptionalID(fs, args, errOut, "<volume-id>")
	if !ok {
		return code
	}
	if *typ != "csi" {
		fmt.Fprintf(errOut, "Unsupported volume type %q: only csi\n", *typ)
		return 1
	}
	if *external {
		if *pluginID == "" || hasID {
			fmt.Fprintln(errOut, "-external lists a plugin's provider volumes: give -plugin ID and no volume ID")
			return 1
		}
		if *perPage < 0 || *perPage > 1000 {
			fmt.Fprintln(errOut, "-per-page must be from 0 to 1000")
			return 1
		}
		c, err := f.client()
		if err != nil {
			return fail(errOut, "creating API client", err)
		}
		return listExternalVolumes(c, f, *pluginID, int32(*perPage), *pageToken, *verbose, out, errOut)
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	if !hasID {
		vols, _, err := c.CSIVolumes().List(*pluginID, nil)
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
	return showVolume(c, f, id, *verbose, out, errOut)
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
	match, ok := pickByPrefix(errOut, "volume", id, matches,
		func(v *api.CSIVolumeListStub) string { return v.ID }, volumeTable)
	if !ok {
		return 1
	}
	vol, _, err := c.CSIVolumes().Info(match.ID, nil)
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
		{"Capacity", capacityString(vol.Capacity)},
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

// capacityString renders a size in bytes with its binary unit; 0 is
// unknown (a registered volume no provider has sized).
func capacityString(n int64) string {
	if n == 0 {
		return "<unknown>"
	}
	return fmt.Sprintf("%d (%s)", n, humanBytes(n))
}

// listExternalVolumes prints one page of the provider's volumes, marking
// those registered in Roam with their volume ID.
func listExternalVolumes(c *api.Client, f *apiFlags, pluginID string, perPage int32, token string, verbose bool, out, errOut io.Writer) int {
	page, _, err := c.CSIVolumes().ListExternal(pluginID, perPage, token, nil)
	if err != nil {
		return fail(errOut, "listing the provider's volumes", err)
	}
	if f.json {
		if err := printJSON(out, page); err != nil {
			return fail(errOut, "printing volumes", err)
		}
		return 0
	}
	registered := map[string]string{}
	if vols, _, err := c.CSIVolumes().List(pluginID, nil); err == nil {
		for _, v := range vols {
			registered[v.ExternalID] = v.ID
		}
	}
	if len(page.Volumes) == 0 {
		fmt.Fprintf(out, "No volumes at the provider of plugin %q\n", pluginID)
	} else {
		rows := [][]string{{"External ID", "Capacity", "Registered As", "Source", "Published To"}}
		for _, v := range page.Volumes {
			src := "<none>"
			switch {
			case v.SnapshotID != "":
				src = "snapshot " + v.SnapshotID
			case v.CloneID != "":
				src = "clone of " + v.CloneID
			}
			nodes := make([]string, 0, len(v.PublishedExternalNodeIDs))
			for _, n := range v.PublishedExternalNodeIDs {
				nodes = append(nodes, shortID(n, verbose))
			}
			rows = append(rows, []string{v.ExternalID, capacityString(v.CapacityBytes), orNone(registered[v.ExternalID]),
				src, orNone(strings.Join(nodes, ","))})
		}
		fmt.Fprint(out, formatColumns(rows))
	}
	if page.NextToken != "" {
		fmt.Fprintf(out, "\nMore volumes: -page-token %s\n", page.NextToken)
	}
	return 0
}
