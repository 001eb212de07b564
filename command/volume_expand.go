package command

import (
	"fmt"
	"io"
)

func init() {
	register("volume expand", &Command{Synopsis: "Grow a CSI volume, on its nodes too while it is mounted", Run: runVolumeExpand})
}

const volumeExpandUsage = `Usage: roam volume expand [options] <volume id> <size>

  Grows a volume to at least <size> (bytes, or with a unit: 10GiB, 500MB)
  through its plugin's controller and then, while it stays mounted, on
  every node where an allocation has it, so that a running task sees the
  new size without a restart. A size below the volume's capacity is
  refused: volumes never shrink. The same happens when a volume is
  registered or created again with a larger capacity_min.

  -max <size>   the largest size the provider may make it (optional)
`

func runVolumeExpand(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("volume expand", volumeExpandUsage, errOut)
	maxFlag := fs.String("max", "", "largest size the provider may make it")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 2 {
		fmt.Fprintln(errOut, "This command takes two arguments: <volume id> <size>")
		fs.Usage()
		return 1
	}
	size, detail := parseByteSize(pos[1])
	if detail != "" {
		fmt.Fprintf(errOut, "Invalid size: %s\n", detail)
		return 1
	}
	if size <= 0 {
		fmt.Fprintln(errOut, "Invalid size: it must be above 0")
		return 1
	}
	var limit int64
	if *maxFlag != "" {
		if limit, detail = parseByteSize(*maxFlag); detail != "" {
			fmt.Fprintf(errOut, "Invalid -max: %s\n", detail)
			return 1
		}
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	vol, _, err := c.CSIVolumes().Expand(pos[0], size, limit, nil)
	if err != nil {
		return fail(errOut, "expanding volume", err)
	}
	if f.json {
		if err := printJSON(out, vol); err != nil {
			return fail(errOut, "printing", err)
		}
		return 0
	}
	fmt.Fprintf(out, "Volume %q expanded to %d bytes (%s)\n", vol.ID, vol.Capacity, humanBytes(vol.Capacity))
	return 0
}

// humanBytes renders n bytes with the largest binary unit that keeps it
// at or above 1.
func humanBytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	f := float64(n)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f %s", f, units[i])
}
