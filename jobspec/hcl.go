package jobspec

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/zclconf/go-cty/cty"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/structs"
)

// The hcl* types mirror the blocks and attributes Roam reads. Anything not
// named here is reported by gohcl as an unsupported argument or block, with
// its position, rather than dropped. Optional scalars are pointers so that
// an absent attribute can take its default; durations are kept as
// attributes so that a bad one is reported where it is written.

type hclJob struct {
	Name        *string     `hcl:"name,optional"`
	Type        *string     `hcl:"type,optional"`
	Region      *string     `hcl:"region,optional"`
	Namespace   *string     `hcl:"namespace,optional"`
	Priority    *int        `hcl:"priority,optional"`
	AllAtOnce   *bool       `hcl:"all_at_once,optional"`
	Datacenters []string    `hcl:"datacenters,optional"`
	Meta        *hclAttrs   `hcl:"meta,block"`
	Groups      []*hclGroup `hcl:"group,block"`
}

type hclGroup struct {
	Name       string         `hcl:"name,label"`
	Count      *int           `hcl:"count,optional"`
	Meta       *hclAttrs      `hcl:"meta,block"`
	Restart    *hclRestart    `hcl:"restart,block"`
	Reschedule *hclReschedule `hcl:"reschedule,block"`
	Migrate    *hclMigrate    `hcl:"migrate,block"`
	Volumes    []*hclVolume   `hcl:"volume,block"`
	Networks   []*hclNetwork  `hcl:"network,block"`
	Tasks      []*hclTask     `hcl:"task,block"`
}

// hclNetwork is a group's network block; a port with static is reserved,
// one without is dynamic, as in Nomad.
type hclNetwork struct {
	Mode  string     `hcl:"mode,optional"`
	Ports []*hclPort `hcl:"port,block"`
}

type hclPort struct {
	Label       string `hcl:"label,label"`
	Static      *int   `hcl:"static,optional"`
	To          int    `hcl:"to,optional"`
	HostNetwork string `hcl:"host_network,optional"`
}

type hclRestart struct {
	Attempts *int           `hcl:"attempts,optional"`
	Interval *hcl.Attribute `hcl:"interval,optional"`
	Delay    *hcl.Attribute `hcl:"delay,optional"`
	Mode     *string        `hcl:"mode,optional"`
}

type hclReschedule struct {
	Attempts      *int           `hcl:"attempts,optional"`
	Interval      *hcl.Attribute `hcl:"interval,optional"`
	Delay         *hcl.Attribute `hcl:"delay,optional"`
	DelayFunction *string        `hcl:"delay_function,optional"`
	MaxDelay      *hcl.Attribute `hcl:"max_delay,optional"`
	Unlimited     *bool          `hcl:"unlimited,optional"`
}

type hclMigrate struct {
	MaxParallel     *int           `hcl:"max_parallel,optional"`
	HealthCheck     *string        `hcl:"health_check,optional"`
	MinHealthyTime  *hcl.Attribute `hcl:"min_healthy_time,optional"`
	HealthyDeadline *hcl.Attribute `hcl:"healthy_deadline,optional"`
}

type hclVolume struct {
	Name           string           `hcl:"name,label"`
	Type           string           `hcl:"type,optional"`
	Source         string           `hcl:"source,optional"`
	ReadOnly       bool             `hcl:"read_only,optional"`
	AccessMode     string           `hcl:"access_mode,optional"`
	AttachmentMode string           `hcl:"attachment_mode,optional"`
	PerAlloc       bool             `hcl:"per_alloc,optional"`
	MountOptions   *hclMountOptions `hcl:"mount_options,block"`
	Body           hcl.Body         `hcl:",body"`
}

type hclMountOptions struct {
	FSType     string   `hcl:"fs_type,optional"`
	MountFlags []string `hcl:"mount_flags,optional"`
}

type hclTask struct {
	Name         string            `hcl:"name,label"`
	Driver       string            `hcl:"driver,optional"`
	Config       *hclAttrs         `hcl:"config,block"`
	Env          *hclAttrs         `hcl:"env,block"`
	Resources    *hclResources     `hcl:"resources,block"`
	KillTimeout  *hcl.Attribute    `hcl:"kill_timeout,optional"`
	KillSignal   string            `hcl:"kill_signal,optional"`
	User         string            `hcl:"user,optional"`
	Meta         *hclAttrs         `hcl:"meta,block"`
	VolumeMounts []*hclVolumeMount `hcl:"volume_mount,block"`
	CSIPlugin    *hclCSIPlugin     `hcl:"csi_plugin,block"`
	Lifecycle    *hclLifecycle     `hcl:"lifecycle,block"`
	Templates    []*hclTemplate    `hcl:"template,block"`
	Artifacts    []*hclArtifact    `hcl:"artifact,block"`
}

type hclArtifact struct {
	Source      *hcl.Attribute `hcl:"source,optional"`
	Destination *hcl.Attribute `hcl:"destination,optional"`
	Mode        string         `hcl:"mode,optional"`
	Options     *hclAttrs      `hcl:"options,block"`
}

type hclTemplate struct {
	Data          *hcl.Attribute `hcl:"data,optional"`
	Source        *hcl.Attribute `hcl:"source,optional"`
	Destination   *hcl.Attribute `hcl:"destination,optional"`
	ChangeMode    string         `hcl:"change_mode,optional"`
	ChangeSignal  string         `hcl:"change_signal,optional"`
	Splay         *hcl.Attribute `hcl:"splay,optional"`
	Perms         string         `hcl:"perms,optional"`
	LeftDelimiter string         `hcl:"left_delimiter,optional"`
	RightDelim    string         `hcl:"right_delimiter,optional"`
	Env           bool           `hcl:"env,optional"`
}

type hclLifecycle struct {
	Hook    string `hcl:"hook,optional"`
	Sidecar bool   `hcl:"sidecar,optional"`
}

type hclCSIPlugin struct {
	ID                    string         `hcl:"id,optional"`
	Type                  string         `hcl:"type,optional"`
	MountDir              string         `hcl:"mount_dir,optional"`
	ControllerConcurrency *hcl.Attribute `hcl:"controller_concurrency,optional"`
}

type hclResources struct {
	CPU         *int `hcl:"cpu,optional"`
	MemoryMB    *int `hcl:"memory,optional"`
	MemoryMaxMB *int `hcl:"memory_max,optional"`
}

type hclVolumeMount struct {
	Volume      string `hcl:"volume,optional"`
	Destination string `hcl:"destination,optional"`
	ReadOnly    bool   `hcl:"read_only,optional"`
}

// hclAttrs is a block of free-form attributes: meta, env, driver config.
type hclAttrs struct {
	Body hcl.Body `hcl:",remain"`
}

var fileSchema = &hcl.BodySchema{
	Blocks: []hcl.BlockHeaderSchema{{Type: "job", LabelNames: []string{"id"}}},
}

// ParseHCL parses a Nomad-style HCL job file holding exactly one job
// block, defaults it and validates it under the default limits. filename
// is used in error messages, which read "file:line,col: summary; detail".
// Attributes and blocks that Roam does not support are errors.
func ParseHCL(filename string, src []byte) (*structs.Job, error) {
	return ParseHCLWithLimits(filename, src, structs.DefaultJobLimits())
}

// ParseHCLWithLimits is ParseHCL under l: a file larger than l.MaxBytes,
// nested deeper than l.MaxDepth or with more group or task blocks than l
// allows is refused before the parser sees it, and the job must be within
// l's count limits.
func ParseHCLWithLimits(filename string, src []byte, l structs.JobLimits) (*structs.Job, error) {
	if err := checkSize(filename, src, l); err != nil {
		return nil, err
	}
	if err := hclScan(filename, src, l); err != nil {
		return nil, err
	}
	file, diags := hclparse.NewParser().ParseHCL(src, filename)
	if diags.HasErrors() {
		return nil, diagError(diags, l)
	}
	content, diags := file.Body.Content(fileSchema)
	if diags.HasErrors() {
		return nil, diagError(diags, l)
	}
	switch len(content.Blocks) {
	case 0:
		return nil, invalid("%s: no job block", filename)
	case 1:
	default:
		r := content.Blocks[1].DefRange
		return nil, invalid("%s:%d,%d: a job file holds one job block; found %d",
			r.Filename, r.Start.Line, r.Start.Column, len(content.Blocks))
	}
	block := content.Blocks[0]
	var hj hclJob
	if diags := gohcl.DecodeBody(block.Body, nil, &hj); diags.HasErrors() {
		return nil, diagError(diags, l)
	}
	d := &decoder{}
	job := d.job(block.Labels[0], &hj)
	if d.diags.HasErrors() {
		return nil, diagError(d.diags, l)
	}
	return finish(job, l)
}

// decoder collects diagnostics while it converts, so that one run reports
// every bad duration or meta value.
type decoder struct {
	diags hcl.Diagnostics
}

func (d *decoder) job(id string, hj *hclJob) *structs.Job {
	job := &structs.Job{
		ID:          id,
		Datacenters: hj.Datacenters,
		Meta:        d.strings(hj.Meta),
	}
	set(&job.Name, hj.Name)
	set(&job.Type, hj.Type)
	set(&job.Region, hj.Region)
	set(&job.Namespace, hj.Namespace)
	set(&job.Priority, hj.Priority)
	set(&job.AllAtOnce, hj.AllAtOnce)
	jobType := job.Type
	for _, hg := range hj.Groups {
		job.TaskGroups = append(job.TaskGroups, d.group(jobType, hg))
	}
	return job
}

func (d *decoder) group(jobType string, hg *hclGroup) *structs.TaskGroup {
	tg := &structs.TaskGroup{Name: hg.Name, Count: 1, Meta: d.strings(hg.Meta)}
	set(&tg.Count, hg.Count)
	if r := hg.Restart; r != nil {
		tg.RestartPolicy = (&restartSpec{
			Attempts: r.Attempts,
			Interval: d.duration(r.Interval),
			Delay:    d.duration(r.Delay),
			Mode:     r.Mode,
		}).build(jobType)
	}
	if r := hg.Reschedule; r != nil {
		tg.ReschedulePolicy = (&rescheduleSpec{
			Attempts:      r.Attempts,
			Interval:      d.duration(r.Interval),
			Delay:         d.duration(r.Delay),
			DelayFunction: r.DelayFunction,
			MaxDelay:      d.duration(r.MaxDelay),
			Unlimited:     r.Unlimited,
		}).build(jobType)
	}
	if m := hg.Migrate; m != nil {
		tg.Migrate = (&migrateSpec{
			MaxParallel:     m.MaxParallel,
			HealthCheck:     m.HealthCheck,
			MinHealthyTime:  d.duration(m.MinHealthyTime),
			HealthyDeadline: d.duration(m.HealthyDeadline),
		}).build()
	}
	for _, hv := range hg.Volumes {
		if tg.Volumes == nil {
			tg.Volumes = make(map[string]*structs.VolumeRequest)
		}
		if _, dup := tg.Volumes[hv.Name]; dup {
			d.diags = append(d.diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Duplicate volume block",
				Detail:   fmt.Sprintf("Group %q already has a volume named %q.", hg.Name, hv.Name),
				Subject:  hv.Body.MissingItemRange().Ptr(),
			})
			continue
		}
		v := &structs.VolumeRequest{
			Name:           hv.Name,
			Type:           hv.Type,
			Source:         hv.Source,
			ReadOnly:       hv.ReadOnly,
			AccessMode:     hv.AccessMode,
			AttachmentMode: hv.AttachmentMode,
			PerAlloc:       hv.PerAlloc,
		}
		if mo := hv.MountOptions; mo != nil {
			v.MountOptions = &structs.CSIMountOptions{FSType: mo.FSType, MountFlags: mo.MountFlags}
		}
		tg.Volumes[hv.Name] = v
	}
	for _, hn := range hg.Networks {
		n := &structs.NetworkResource{Mode: hn.Mode}
		for _, hp := range hn.Ports {
			p := structs.Port{Label: hp.Label, To: hp.To, HostNetwork: hp.HostNetwork}
			if hp.Static != nil {
				p.Value = *hp.Static
				n.ReservedPorts = append(n.ReservedPorts, p)
			} else {
				n.DynamicPorts = append(n.DynamicPorts, p)
			}
		}
		tg.Networks = append(tg.Networks, n)
	}
	for _, ht := range hg.Tasks {
		tg.Tasks = append(tg.Tasks, d.task(ht))
	}
	return tg
}

func (d *decoder) task(ht *hclTask) *structs.Task {
	t := &structs.Task{
		Name:       ht.Name,
		Driver:     ht.Driver,
		Config:     d.config(ht.Config),
		Env:        d.strings(ht.Env),
		KillSignal: ht.KillSignal,
		User:       ht.User,
		Meta:       d.strings(ht.Meta),
	}
	set(&t.KillTimeout, d.duration(ht.KillTimeout))
	if r := ht.Resources; r != nil {
		t.Resources = (&resourcesSpec{CPU: r.CPU, MemoryMB: r.MemoryMB, MemoryMaxMB: r.MemoryMaxMB}).build()
	}
	for _, vm := range ht.VolumeMounts {
		t.VolumeMounts = append(t.VolumeMounts, &structs.VolumeMount{
			Volume:      vm.Volume,
			Destination: vm.Destination,
			ReadOnly:    vm.ReadOnly,
		})
	}
	if p := ht.CSIPlugin; p != nil {
		t.CSIPluginConfig = &structs.TaskCSIPluginConfig{ID: p.ID, Type: p.Type, MountDir: p.MountDir,
			ControllerConcurrency: d.concurrency(p.ControllerConcurrency)}
	}
	if lc := ht.Lifecycle; lc != nil {
		t.Lifecycle = &structs.TaskLifecycleConfig{Hook: lc.Hook, Sidecar: lc.Sidecar}
	}
	for _, tp := range ht.Templates {
		tmpl := &structs.Template{
			SourcePath: d.runtimeString(tp.Source), DestPath: d.runtimeString(tp.Destination), EmbeddedTmpl: d.runtimeString(tp.Data),
			ChangeMode: tp.ChangeMode, ChangeSignal: tp.ChangeSignal, Perms: tp.Perms,
			LeftDelim: tp.LeftDelimiter, RightDelim: tp.RightDelim, Envvars: tp.Env,
		}
		set(&tmpl.Splay, d.duration(tp.Splay))
		t.Templates = append(t.Templates, tmpl)
	}
	for _, ha := range ht.Artifacts {
		t.Artifacts = append(t.Artifacts, &structs.TaskArtifact{
			GetterSource: d.runtimeString(ha.Source), RelativeDest: d.runtimeString(ha.Destination),
			GetterMode: ha.Mode, GetterOptions: d.strings(ha.Options),
		})
	}
	return t
}

// concurrency reads a csi_plugin's controller_concurrency: 0 when absent.
// Written, it must be a whole number from laneadmit.MinLimit to MaxLimit
// (a written 0 is refused here, since 0 in the job means "not set").
func (d *decoder) concurrency(attr *hcl.Attribute) int {
	if attr == nil {
		return 0
	}
	var n int
	if diags := gohcl.DecodeExpression(attr.Expr, nil, &n); diags.HasErrors() {
		d.diags = append(d.diags, diags...)
		return 0
	}
	if !laneadmit.Valid(n) {
		d.diags = append(d.diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Invalid controller_concurrency",
			Detail:   fmt.Sprintf("controller_concurrency = %d: must be from %d to %d.", n, laneadmit.MinLimit, laneadmit.MaxLimit),
			Subject:  attr.Expr.Range().Ptr(),
		})
		return 0
	}
	return n
}

// duration reads a duration string such as "30s"; nil when absent.
func (d *decoder) duration(attr *hcl.Attribute) *time.Duration {
	if attr == nil {
		return nil
	}
	var s string
	if diags := gohcl.DecodeExpression(attr.Expr, nil, &s); diags.HasErrors() {
		d.diags = append(d.diags, diags...)
		return nil
	}
	dur, err := time.ParseDuration(s)
	if err != nil {
		d.diags = append(d.diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Invalid duration",
			Detail:   fmt.Sprintf("%s: %v.", attr.Name, err),
			Subject:  attr.Expr.Range().Ptr(),
		})
		return nil
	}
	return &dur
}

// strings reads a meta or env block; every value must convert to a string.
func (d *decoder) strings(b *hclAttrs) map[string]string {
	if b == nil {
		return nil
	}
	attrs, diags := b.Body.JustAttributes()
	d.diags = append(d.diags, diags...)
	out := make(map[string]string, len(attrs))
	for name, attr := range attrs {
		ctx, cdiags := runtimeContext(attr.Expr)
		if cdiags.HasErrors() {
			d.diags = append(d.diags, cdiags...)
			continue
		}
		var s string
		if diags := gohcl.DecodeExpression(attr.Expr, ctx, &s); diags.HasErrors() {
			d.diags = append(d.diags, diags...)
			continue
		}
		out[name] = s
	}
	return out
}

// runtimeString reads a string attribute whose ${...} references are left
// for the client (see runtimeContext); "" when absent.
func (d *decoder) runtimeString(attr *hcl.Attribute) string {
	if attr == nil {
		return ""
	}
	ctx, diags := runtimeContext(attr.Expr)
	if diags.HasErrors() {
		d.diags = append(d.diags, diags...)
		return ""
	}
	var s string
	if diags := gohcl.DecodeExpression(attr.Expr, ctx, &s); diags.HasErrors() {
		d.diags = append(d.diags, diags...)
	}
	return s
}

// config reads a driver config block into plain Go values.
func (d *decoder) config(b *hclAttrs) map[string]any {
	if b == nil {
		return nil
	}
	attrs, diags := b.Body.JustAttributes()
	d.diags = append(d.diags, diags...)
	out := make(map[string]any, len(attrs))
	for name, attr := range attrs {
		ctx, cdiags := runtimeContext(attr.Expr)
		if cdiags.HasErrors() {
			d.diags = append(d.diags, cdiags...)
			continue
		}
		v, diags := attr.Expr.Value(ctx)
		if diags.HasErrors() {
			d.diags = append(d.diags, diags...)
			continue
		}
		gv, err := ctyToGo(v)
		if err != nil {
			d.diags = append(d.diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Invalid driver config value",
				Detail:   fmt.Sprintf("%s: %v.", name, err),
				Subject:  attr.Expr.Range().Ptr(),
			})
			continue
		}
		out[name] = gv
	}
	return out
}

// ctyToGo converts a cty value to strings, int64 (whole numbers), float64,
// bools, []any and map[string]any.
func ctyToGo(v cty.Value) (any, error) {
	if v.IsNull() {
		return nil, nil
	}
	if !v.IsWhollyKnown() {
		return nil, errors.New("value is not known")
	}
	ty := v.Type()
	switch {
	case ty == cty.String:
		return v.AsString(), nil
	case ty == cty.Bool:
		return v.True(), nil
	case ty == cty.Number:
		bf := v.AsBigFloat()
		if bf.IsInt() {
			if i, acc := bf.Int64(); acc == big.Exact {
				return i, nil
			}
		}
		f, _ := bf.Float64()
		if math.IsInf(f, 0) {
			return nil, errors.New("number is out of range")
		}
		return f, nil
	case ty.IsListType(), ty.IsTupleType(), ty.IsSetType():
		out := make([]any, 0, v.LengthInt())
		for it := v.ElementIterator(); it.Next(); {
			_, ev := it.Element()
			gv, err := ctyToGo(ev)
			if err != nil {
				return nil, err
			}
			out = append(out, gv)
		}
		return out, nil
	case ty.IsMapType(), ty.IsObjectType():
		out := make(map[string]any, v.LengthInt())
		for it := v.ElementIterator(); it.Next(); {
			k, ev := it.Element()
			gv, err := ctyToGo(ev)
			if err != nil {
				return nil, err
			}
			out[k.AsString()] = gv
		}
		return out, nil
	}
	return nil, fmt.Errorf("values of type %s are not supported", ty.FriendlyName())
}

// diagError renders the error diagnostics as "file:line,col: summary;
// detail", one per line, at most l.ErrorMaxProblems of them.
func diagError(diags hcl.Diagnostics, l structs.JobLimits) error {
	p := &structs.Problems{Max: l.ErrorMaxProblems}
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
		p.Add(errors.New(msg))
	}
	return fmt.Errorf("%w: %w", structs.ErrInvalidRequest, p.Err())
}
