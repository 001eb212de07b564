package command

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"

	"github.com/roamhq/roam/api"
)

func init() {
	registerGroup("volume", "Register, inspect and deregister CSI volumes")
	register("volume register", &Command{Synopsis: "Register an existing CSI volume from a spec file", Run: runVolumeRegister})
}

const volumeRegisterUsage = `Usage: roam volume register [options] <file>

  Registers a volume that already exists in a storage provider, described by
  an HCL volume spec:

    id          = "web-data"
    name        = "web-data"            # defaults to id
    type        = "csi"
    plugin_id   = "hostpath"
    external_id = "vol-0123"
    capacity_min = "1GiB"               # optional, bytes or with a unit
    capacity_max = "10GiB"              # optional

    capability {                        # one or more
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }
    mount_options {                     # optional
      fs_type     = "ext4"
      mount_flags = ["noatime"]
    }
    secrets {}                          # optional string maps
    parameters {}
    context {}
`

func runVolumeRegister(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("volume register", volumeRegisterUsage, errOut)
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
	vol, err := parseVolumeSpec(pos[0], src)
	if err != nil {
		return fail(errOut, "parsing volume file", err)
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	if _, err := c.CSIVolumes().Register(vol, nil); err != nil {
		return fail(errOut, "registering volume", err)
	}
	fmt.Fprintf(out, "Volume %q registered\n", vol.ID)
	return 0
}

// volumeSpecHCL is the volume spec file. Anything not named here is
// reported by gohcl as an unsupported argument or block, with its position.
type volumeSpecHCL struct {
	ID           string                 `hcl:"id"`
	Name         string                 `hcl:"name,optional"`
	Type         *hcl.Attribute         `hcl:"type"`
	PluginID     string                 `hcl:"plugin_id"`
	ExternalID   string                 `hcl:"external_id"`
	CapacityMin  *hcl.Attribute         `hcl:"capacity_min,optional"`
	CapacityMax  *hcl.Attribute         `hcl:"capacity_max,optional"`
	SnapshotID   string                 `hcl:"snapshot_id,optional"`
	Topology     *topologyRequestHCL    `hcl:"topology_request,block"`
	CloneID      string                 `hcl:"clone_id,optional"`
	Capabilities []*volumeCapabilityHCL `hcl:"capability,block"`
	MountOptions *volumeMountHCL        `hcl:"mount_options,block"`
	Secrets      *stringMapHCL          `hcl:"secrets,block"`
	Parameters   *stringMapHCL          `hcl:"parameters,block"`
	Context      *stringMapHCL          `hcl:"context,block"`
}

// topologyRequestHCL is Nomad's topology_request block:
//
//	topology_request {
//	  required  { topology { segments = { "topology.hostpath.csi/zone" = "b" } } }
//	  preferred { topology { segments = { zone = "b" } } }
//	}
//
// segments is an attribute holding a map, so that keys with dots and
// slashes (as CSI topology keys have) can be quoted.
type topologyRequestHCL struct {
	Required  *topologyListHCL `hcl:"required,block"`
	Preferred *topologyListHCL `hcl:"preferred,block"`
}

type topologyListHCL struct {
	Topologies []*topologyHCL `hcl:"topology,block"`
}

type topologyHCL struct {
	Segments map[string]string `hcl:"segments"`
}

// decode reads the topologies of a required or preferred block.
func (l *topologyListHCL) decode() ([]*api.CSITopology, hcl.Diagnostics) {
	if l == nil {
		return nil, nil
	}
	var out []*api.CSITopology
	var diags hcl.Diagnostics
	for _, t := range l.Topologies {
		out = append(out, &api.CSITopology{Segments: t.Segments})
	}
	return out, diags
}

type volumeCapabilityHCL struct {
	AccessMode     string `hcl:"access_mode"`
	AttachmentMode string `hcl:"attachment_mode"`
}

type volumeMountHCL struct {
	FSType     string   `hcl:"fs_type,optional"`
	MountFlags []string `hcl:"mount_flags,optional"`
}

// stringMapHCL is a block of arbitrary string attributes.
type stringMapHCL struct {
	Body hcl.Body `hcl:",remain"`
}

// parseVolumeSpec parses an HCL volume spec. Errors name file:line,col.
func parseVolumeSpec(filename string, src []byte) (*api.CSIVolume, error) {
	file, diags := hclparse.NewParser().ParseHCL(src, filename)
	if diags.HasErrors() {
		return nil, volumeDiagError(diags)
	}
	var spec volumeSpecHCL
	if diags := gohcl.DecodeBody(file.Body, nil, &spec); diags.HasErrors() {
		return nil, volumeDiagError(diags)
	}
	vol := &api.CSIVolume{
		ID: spec.ID, Name: spec.Name, PluginID: spec.PluginID, ExternalID: spec.ExternalID,
		SnapshotID: spec.SnapshotID, CloneID: spec.CloneID,
	}
	if vol.Name == "" {
		vol.Name = vol.ID
	}
	if spec.Type == nil {
		return nil, fmt.Errorf("%s: type is required; set type = \"csi\"", filename)
	}
	var typ string
	errs := gohcl.DecodeExpression(spec.Type.Expr, nil, &typ)
	if !errs.HasErrors() && typ != "csi" {
		errs = append(errs, &hcl.Diagnostic{
			Severity: hcl.DiagError, Summary: "Unsupported volume type",
			Detail:  fmt.Sprintf("type is %q; only \"csi\" is supported", typ),
			Subject: spec.Type.Expr.Range().Ptr(),
		})
	}
	for _, c := range spec.Capabilities {
		vol.RequestedCapabilities = append(vol.RequestedCapabilities,
			&api.CSIVolumeCapability{AccessMode: c.AccessMode, AttachmentMode: c.AttachmentMode})
	}
	if m := spec.MountOptions; m != nil {
		vol.MountOptions = &api.CSIMountOptions{FSType: m.FSType, MountFlags: m.MountFlags}
	}
	var d hcl.Diagnostics
	vol.Secrets, d = spec.Secrets.decode()
	errs = append(errs, d...)
	vol.Parameters, d = spec.Parameters.decode()
	errs = append(errs, d...)
	vol.Context, d = spec.Context.decode()
	errs = append(errs, d...)
	if tr := spec.Topology; tr != nil {
		vol.RequestedTopologies = &api.CSITopologyRequest{}
		vol.RequestedTopologies.Required, d = tr.Required.decode()
		errs = append(errs, d...)
		vol.RequestedTopologies.Preferred, d = tr.Preferred.decode()
		errs = append(errs, d...)
	}
	vol.RequestedCapacityMin, d = decodeCapacity(spec.CapacityMin)
	errs = append(errs, d...)
	vol.RequestedCapacityMax, d = decodeCapacity(spec.CapacityMax)
	errs = append(errs, d...)
	if errs.HasErrors() {
		return nil, volumeDiagError(errs)
	}
	return vol, nil
}

// decode reads the block's attributes as strings; a nil block is a nil map.
func (b *stringMapHCL) decode() (map[string]string, hcl.Diagnostics) {
	if b == nil {
		return nil, nil
	}
	attrs, diags := b.Body.JustAttributes()
	if diags.HasErrors() {
		return nil, diags
	}
	out := make(map[string]string, len(attrs))
	for name, attr := range attrs {
		var s string
		if d := gohcl.DecodeExpression(attr.Expr, nil, &s); d.HasErrors() {
			diags = append(diags, d...)
			continue
		}
		out[name] = s
	}
	return out, diags
}

// byteUnits are the size suffixes a capacity may have.
var byteUnits = map[string]int64{
	"": 1, "b": 1,
	"kb": 1000, "mb": 1000 * 1000, "gb": 1000 * 1000 * 1000, "tb": 1000 * 1000 * 1000 * 1000,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}

// decodeCapacity reads a capacity: a number of bytes, or a string such as
// "10GiB" or "500MB". Absent is 0.
func decodeCapacity(attr *hcl.Attribute) (int64, hcl.Diagnostics) {
	if attr == nil {
		return 0, nil
	}
	// A number converts to its decimal string, so one parse reads both.
	var s string
	if diags := gohcl.DecodeExpression(attr.Expr, nil, &s); diags.HasErrors() {
		return 0, diags
	}
	n, detail := parseByteSize(s)
	if detail != "" {
		return 0, hcl.Diagnostics{{
			Severity: hcl.DiagError, Summary: "Invalid " + attr.Name,
			Detail: detail, Subject: attr.Expr.Range().Ptr(),
		}}
	}
	return n, nil
}

// parseByteSize reads a size: a number of bytes, or a number with a unit
// such as "10GiB" or "500MB". On failure it returns why, as a detail for
// an error, and 0.
func parseByteSize(s string) (int64, string) {
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := s, ""
	if i >= 0 {
		num, unit = s[:i], strings.ToLower(strings.TrimSpace(s[i:]))
	}
	notSize := fmt.Sprintf("%q is not a size such as 10GiB, 500MB or a number of bytes", s)
	tooBig := fmt.Sprintf("%q is more than %d bytes", s, int64(math.MaxInt64))
	mult, ok := byteUnits[unit]
	if !ok {
		return 0, notSize
	}
	// Whole numbers are read exactly; a float holds integers exactly only
	// up to 2^53.
	if n, err := strconv.ParseInt(num, 10, 64); err == nil {
		if n > math.MaxInt64/mult {
			return 0, tooBig
		}
		return n * mult, ""
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, tooBig
		}
		return 0, notSize
	}
	// Converting a float at or past 2^63 to int64 does not fail: on amd64
	// it gives math.MinInt64, a negative capacity.
	if v := f * float64(mult); v < 1<<63 {
		return int64(v), ""
	}
	return 0, tooBig
}

// volumeDiagError renders error diagnostics as "file:line,col: summary;
// detail", one per line.
func volumeDiagError(diags hcl.Diagnostics) error {
	var errs []error
	for _, diag := range diags {
		if diag.Severity != hcl.DiagError {
			continue
		}
		msg := diag.Summary
		if diag.Detail != "" {
			msg += "; " + diag.Detail
		}
		if r := diag.Subject; r != nil {
			msg = fmt.Sprintf("%s:%d,%d: %s", r.Filename, r.Start.Line, r.Start.Column, msg)
		}
		errs = append(errs, errors.New(msg))
	}
	return errors.Join(errs...)
}
