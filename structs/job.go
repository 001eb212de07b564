package structs

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/roamhq/roam/internal/laneadmit"
)

// Job types.
const (
	JobTypeService = "service"
	JobTypeBatch   = "batch"
	JobTypeSystem  = "system"
)

// Job statuses.
const (
	JobStatusPending = "pending"
	JobStatusRunning = "running"
	JobStatusDead    = "dead"
)

// SupportedDrivers are the task drivers clients can run.
var SupportedDrivers = map[string]bool{"raw_exec": true, "exec": true}

// DefaultNamespace is the only namespace Roam has.
const DefaultNamespace = "default"

// Job defaults, as in Nomad.
const (
	JobDefaultPriority = 50
	JobMinPriority     = 1
	JobMaxPriority     = 100
	DefaultKillTimeout = 5 * time.Second
	// MaxTaskResource bounds a task's cpu (MHz) and memory (MB).
	MaxTaskResource = 1 << 24
	// MinTaskMemoryMB is the least memory a task may ask for, as in Nomad.
	MinTaskMemoryMB = 10
)

// Job is a workload specification: groups of tasks to keep running.
type Job struct {
	Region      string
	Namespace   string
	ID          string
	Name        string
	Type        string
	Priority    int
	AllAtOnce   bool
	Datacenters []string
	TaskGroups  []*TaskGroup
	Meta        map[string]string

	// Stop marks a job the user stopped; its allocations are stopped but
	// the job is kept until purged.
	Stop              bool
	Status            string
	StatusDescription string
	// Version increments with every change to the specification.
	Version        uint64
	SubmitTime     int64
	CreateIndex    uint64
	ModifyIndex    uint64
	JobModifyIndex uint64
}

// TaskGroup is a set of tasks placed together on one node, Count times.
type TaskGroup struct {
	Name             string
	Count            int
	Tasks            []*Task
	RestartPolicy    *RestartPolicy
	ReschedulePolicy *ReschedulePolicy
	Migrate          *MigrateStrategy
	// Volumes are the CSI volumes the group claims, by the name tasks use
	// in their volume_mount blocks.
	Volumes map[string]*VolumeRequest
	// Networks is the group's network block (at most one): the ports its
	// tasks listen on, shared by the group.
	Networks []*NetworkResource `json:",omitempty"`
	Meta     map[string]string
}

// Task is one process.
type Task struct {
	Name   string
	Driver string
	// Config is the driver's own configuration (raw_exec: command, args).
	Config      map[string]any
	Env         map[string]string
	Resources   *Resources
	KillTimeout time.Duration
	KillSignal  string
	// User is the account a raw_exec task runs as; empty means the
	// client's own (root on most hosts), which can read anything on the
	// host. A task run as another user cannot read the client's state.
	User         string
	VolumeMounts []*VolumeMount
	Meta         map[string]string
	// CSIPluginConfig, when set, makes the task a CSI plugin: the client
	// tells it where to listen (CSI_ENDPOINT) and manages it while it runs.
	CSIPluginConfig *TaskCSIPluginConfig
	// Lifecycle, when set, runs the task before, beside or after the
	// group's main tasks.
	Lifecycle *TaskLifecycleConfig `json:",omitempty"`
	// Templates are rendered into the task's directory before it starts.
	Templates []*Template `json:",omitempty"`
	// Artifacts are fetched into the task's directory before it starts.
	Artifacts []*TaskArtifact `json:",omitempty"`
}

// Lifecycle hooks, as in Nomad.
const (
	TaskLifecycleHookPrestart  = "prestart"
	TaskLifecycleHookPoststart = "poststart"
	TaskLifecycleHookPoststop  = "poststop"
)

// TaskLifecycleConfig is a task's lifecycle block.
type TaskLifecycleConfig struct {
	Hook    string
	Sidecar bool
}

// LifecycleHook is the task's hook, "" for a main task.
func (t *Task) LifecycleHook() string {
	if t.Lifecycle == nil {
		return ""
	}
	return t.Lifecycle.Hook
}

// CSI plugin types a task may declare: which of the plugin's services the
// client uses.
const (
	CSIPluginTypeController = "controller"
	CSIPluginTypeNode       = "node"
	CSIPluginTypeMonolith   = "monolith"
)

// DefaultCSIPluginMountDir is where, inside its task directory, a plugin
// task creates its socket unless it says otherwise.
const DefaultCSIPluginMountDir = "csi"

// TaskCSIPluginConfig describes the CSI plugin a task serves.
type TaskCSIPluginConfig struct {
	// ID is the plugin ID volumes name.
	ID string
	// Type is CSIPluginTypeController, CSIPluginTypeNode or
	// CSIPluginTypeMonolith.
	Type string
	// MountDir is the directory, relative to the task directory, in which
	// the plugin creates its socket (csi.sock). A leading "/" is accepted,
	// as Nomad writes it, and still means the task directory.
	MountDir string
	// ControllerConcurrency is how many destructive controller calls the
	// plugin accepts at once, never two on one volume nor two
	// publish/unpublish calls for one node (controller_concurrency; 0
	// means the default, 1).
	ControllerConcurrency int `json:",omitempty"`
}

// Resources a task asks for.
type Resources struct {
	CPU      int // MHz
	MemoryMB int
	// MemoryMaxMB, when above MemoryMB, is the hard limit an isolating
	// driver enforces; MemoryMB is then what the scheduler reserves.
	MemoryMaxMB int `json:",omitempty"`
}

// Restart modes.
const (
	RestartPolicyModeFail  = "fail"
	RestartPolicyModeDelay = "delay"
)

// RestartPolicy says how a task that exits is restarted in place.
type RestartPolicy struct {
	Attempts int
	Interval time.Duration
	Delay    time.Duration
	Mode     string
}

// Reschedule delay functions.
const (
	DelayFunctionConstant    = "constant"
	DelayFunctionExponential = "exponential"
	DelayFunctionFibonacci   = "fibonacci"
)

// ReschedulePolicy says how a failed allocation is replaced elsewhere.
type ReschedulePolicy struct {
	Attempts      int
	Interval      time.Duration
	Delay         time.Duration
	DelayFunction string
	MaxDelay      time.Duration
	Unlimited     bool
}

// MigrateStrategy bounds how a drain moves a group's allocations.
type MigrateStrategy struct {
	MaxParallel     int
	HealthCheck     string
	MinHealthyTime  time.Duration
	HealthyDeadline time.Duration
}

// VolumeRequest is a group's claim on a CSI volume.
type VolumeRequest struct {
	Name   string
	Type   string // "csi"
	Source string // the volume ID
	// PerAlloc appends "[N]" (the allocation's index) to Source.
	PerAlloc       bool
	ReadOnly       bool
	AccessMode     string
	AttachmentMode string
	MountOptions   *CSIMountOptions
}

// CSIMountOptions are passed to the node plugin.
type CSIMountOptions struct {
	FSType     string
	MountFlags []string
}

// VolumeMount exposes a group volume inside a task.
type VolumeMount struct {
	Volume      string
	Destination string
	ReadOnly    bool
}

// Defaults for a group's policies by job type, as in Nomad.
func defaultRestartPolicy(jobType string) *RestartPolicy {
	if jobType == JobTypeBatch {
		return &RestartPolicy{Attempts: 3, Interval: 24 * time.Hour, Delay: 15 * time.Second, Mode: RestartPolicyModeFail}
	}
	return &RestartPolicy{Attempts: 2, Interval: 30 * time.Minute, Delay: 15 * time.Second, Mode: RestartPolicyModeFail}
}

func defaultReschedulePolicy(jobType string) *ReschedulePolicy {
	switch jobType {
	case JobTypeService:
		return &ReschedulePolicy{Delay: 30 * time.Second, DelayFunction: DelayFunctionExponential, MaxDelay: time.Hour, Unlimited: true}
	case JobTypeBatch:
		return &ReschedulePolicy{Attempts: 1, Interval: 24 * time.Hour, Delay: 5 * time.Second, DelayFunction: DelayFunctionConstant}
	}
	return nil // system jobs are not rescheduled
}

func defaultMigrateStrategy() *MigrateStrategy {
	return &MigrateStrategy{MaxParallel: 1, HealthCheck: "task_states", MinHealthyTime: 10 * time.Second, HealthyDeadline: 5 * time.Minute}
}

// Canonicalize fills in defaults the user left out. Values the user set,
// including explicit zeros inside a policy block, are kept. A group's Count
// is not defaulted here: zero is a valid count, so the job file parsers,
// which can tell "count = 0" from no count, default it to 1.
func (j *Job) Canonicalize() {
	if j.Namespace == "" {
		j.Namespace = DefaultNamespace
	}
	if j.Name == "" {
		j.Name = j.ID
	}
	if j.Type == "" {
		j.Type = JobTypeService
	}
	if j.Priority == 0 {
		j.Priority = JobDefaultPriority
	}
	if len(j.Datacenters) == 0 {
		j.Datacenters = []string{"*"}
	}
	for _, tg := range j.TaskGroups {
		if tg == nil {
			continue // Validate refuses it
		}
		if tg.RestartPolicy == nil {
			tg.RestartPolicy = defaultRestartPolicy(j.Type)
		}
		if tg.ReschedulePolicy == nil {
			tg.ReschedulePolicy = defaultReschedulePolicy(j.Type)
		}
		if tg.Migrate == nil && j.Type == JobTypeService {
			tg.Migrate = defaultMigrateStrategy()
		}
		for _, t := range tg.Tasks {
			if t == nil {
				continue
			}
			if t.Resources == nil {
				t.Resources = &Resources{CPU: 100, MemoryMB: 300}
			}
			if t.KillTimeout == 0 {
				t.KillTimeout = DefaultKillTimeout
			}
			if t.KillSignal == "" {
				t.KillSignal = "SIGINT"
			}
			if p := t.CSIPluginConfig; p != nil && p.MountDir == "" {
				p.MountDir = DefaultCSIPluginMountDir
			}
		}
		for name, v := range tg.Volumes {
			if v != nil && v.Name == "" {
				v.Name = name
			}
		}
	}
}

// Validate reports the problems of a canonicalized job under the default
// limits; see ValidateWith.
func (j *Job) Validate() error { return j.ValidateWith(DefaultJobLimits()) }

// ValidateWith reports every problem with a canonicalized job, joined,
// wrapping ErrInvalidRequest. A job over l's size limits is refused with
// that one problem before anything walks its groups; otherwise at most
// l.ErrorMaxProblems problems are listed, then "and K more".
func (j *Job) ValidateWith(l JobLimits) error {
	if err := l.CheckSize(j); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	p := &Problems{Max: l.ErrorMaxProblems}
	// The job ID, group and task names become allocation names and task
	// directories on clients: ValidateID's rule, as for every such name.
	if err := ValidateID(IDKindJob, j.ID); err != nil {
		p.Add(err)
	}
	if j.Namespace != DefaultNamespace {
		p.Addf("namespace %q is not supported; only %q exists", j.Namespace, DefaultNamespace)
	}
	switch j.Type {
	case JobTypeService, JobTypeBatch, JobTypeSystem:
	default:
		p.Addf("job type %q is not one of service, batch, system", j.Type)
	}
	if j.Priority < JobMinPriority || j.Priority > JobMaxPriority {
		p.Addf("priority %d must be between %d and %d", j.Priority, JobMinPriority, JobMaxPriority)
	}
	if len(j.TaskGroups) == 0 {
		p.Addf("job has no task groups")
	}
	groups := make(map[string]bool)
	for i, tg := range j.TaskGroups {
		if tg == nil {
			p.Addf("task group %d is null", i)
			continue
		}
		if tg.Name == "" {
			p.Addf("a task group has no name")
			continue
		}
		if err := ValidateID(IDKindGroup, tg.Name); err != nil {
			p.Add(err)
			continue
		}
		if groups[tg.Name] {
			p.Addf("task group %q is defined twice", tg.Name)
		}
		groups[tg.Name] = true
		tg.validate(j.Type, p)
	}
	if err := p.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return nil
}

// validate adds tg's problems to p, each naming the group.
func (tg *TaskGroup) validate(jobType string, p *Problems) {
	add := func(format string, args ...any) {
		p.Add(fmt.Errorf("group %q: %w", tg.Name, fmt.Errorf(format, args...)))
	}
	if tg.Count < 0 {
		add("count %d must not be negative", tg.Count)
	}
	if jobType == JobTypeSystem && tg.Count > 1 {
		add("system jobs run one allocation per node; count %d is not allowed", tg.Count)
	}
	if len(tg.Tasks) == 0 {
		add("group has no tasks")
	}
	tg.validateNetworks(add)
	tg.validateLifecycle(add)
	tg.validateSharedTemplates(add)
	if rp := tg.RestartPolicy; rp != nil {
		if rp.Attempts < 0 || rp.Interval < 0 || rp.Delay < 0 {
			add("restart: attempts, interval and delay must not be negative")
		}
		if rp.Mode != RestartPolicyModeFail && rp.Mode != RestartPolicyModeDelay {
			add("restart: mode %q is not one of fail, delay", rp.Mode)
		}
	}
	if rs := tg.ReschedulePolicy; rs != nil {
		if jobType == JobTypeSystem {
			add("reschedule is not supported for system jobs")
		}
		if rs.Attempts < 0 || rs.Interval < 0 || rs.Delay < 0 || rs.MaxDelay < 0 {
			add("reschedule: attempts, interval, delay and max_delay must not be negative")
		}
		switch rs.DelayFunction {
		case DelayFunctionConstant, DelayFunctionExponential, DelayFunctionFibonacci:
		default:
			add("reschedule: delay_function %q is not one of constant, exponential, fibonacci", rs.DelayFunction)
		}
		if rs.DelayFunction != DelayFunctionConstant && rs.MaxDelay > 0 && rs.MaxDelay < rs.Delay {
			add("reschedule: max_delay %s is less than delay %s", rs.MaxDelay, rs.Delay)
		}
	}
	if m := tg.Migrate; m != nil && m.MaxParallel < 0 {
		add("migrate: max_parallel %d must not be negative", m.MaxParallel)
	}
	for _, name := range sortedVolumeNames(tg.Volumes) {
		v := tg.Volumes[name]
		if v == nil {
			add("volume %q is null", name)
			continue
		}
		if v.Type != "csi" {
			add("volume %q: type %q is not supported; only \"csi\"", name, v.Type)
		}
		if v.Source == "" {
			add("volume %q: source is required", name)
		} else if err := ValidateID(IDKindVolumeSrc, volumeSourceID(v, tg.Count)); err != nil {
			// The source is a volume ID, which names directories on the
			// client; per_alloc's longest is checked, with its "[N]".
			add("volume %q: %w", name, err)
		}
	}
	tasks := make(map[string]bool)
	for i, t := range tg.Tasks {
		if t == nil {
			add("task %d is null", i)
			continue
		}
		if t.Name == "" {
			add("a task has no name")
			continue
		}
		if err := ValidateID(IDKindTask, t.Name); err != nil {
			add("%w", err)
			continue
		}
		if tasks[t.Name] {
			add("task %q is defined twice", t.Name)
		}
		tasks[t.Name] = true
		if t.Driver == "" {
			add("task %q: driver is required", t.Name)
		} else if !SupportedDrivers[t.Driver] {
			add("task %q: driver %q is not supported (supported: exec, raw_exec)", t.Name, t.Driver)
		} else if err := ValidateDriverConfig(t.Driver, t.Config); err != nil {
			add("task %q: %v", t.Name, err)
		}
		if t.User != "" && !ValidUserName(t.User) {
			add("task %q: user %q is not a user name (lowercase letters, digits, _ and -, at most 32)", t.Name, t.User)
		}
		if r := t.Resources; r != nil {
			if r.CPU < 0 || r.MemoryMB < 0 || r.MemoryMaxMB < 0 {
				add("task %q: resources must not be negative", t.Name)
			}
			// Bounded so that no sum of them, over a job's tasks or a
			// node's allocations, can overflow and fit anywhere.
			if r.CPU > MaxTaskResource || r.MemoryMB > MaxTaskResource || r.MemoryMaxMB > MaxTaskResource {
				add("task %q: resources: cpu %d, memory %d and memory_max %d must each be at most %d", t.Name, r.CPU, r.MemoryMB, r.MemoryMaxMB, MaxTaskResource)
			}
			if r.MemoryMB >= 0 && r.MemoryMB < MinTaskMemoryMB {
				add("task %q: resources: memory %d MB is under the minimum of %d MB", t.Name, r.MemoryMB, MinTaskMemoryMB)
			}
			if r.MemoryMaxMB > 0 && r.MemoryMaxMB < r.MemoryMB {
				add("task %q: resources: memory_max %d MB is under memory %d MB", t.Name, r.MemoryMaxMB, r.MemoryMB)
			}
		}
		if t.KillTimeout < 0 {
			add("task %q: kill_timeout must not be negative", t.Name)
		}
		tg.validateVolumeMounts(t, add)
		t.validateTemplates(add)
		t.validateArtifacts(add)
		if pc := t.CSIPluginConfig; pc != nil {
			if t.Driver == "exec" {
				// The client serves a plugin's socket from a host path, and
				// the plugin needs mount privileges exec takes away.
				add("task %q: csi_plugin: a plugin task needs the raw_exec driver, not exec", t.Name)
			}
			if pc.ID == "" {
				add("task %q: csi_plugin: id is required", t.Name)
			} else if err := ValidateID(IDKindPlugin, pc.ID); err != nil {
				add("task %q: csi_plugin: %w", t.Name, err)
			}
			switch pc.Type {
			case CSIPluginTypeController, CSIPluginTypeNode, CSIPluginTypeMonolith:
			default:
				add("task %q: csi_plugin: type %q is not valid (controller, node or monolith)", t.Name, pc.Type)
			}
			if !validCSIMountDir(pc.MountDir) {
				add("task %q: csi_plugin: mount_dir %q must stay inside the task directory", t.Name, pc.MountDir)
			}
			if n := pc.ControllerConcurrency; n != 0 && !laneadmit.Valid(n) {
				add("task %q: csi_plugin: controller_concurrency %d must be from %d to %d", t.Name, n, laneadmit.MinLimit, laneadmit.MaxLimit)
			} else if n != 0 && pc.Type == CSIPluginTypeNode {
				add("task %q: csi_plugin: controller_concurrency is for a controller or monolith plugin, not type %q", t.Name, pc.Type)
			}
		}
	}
}

// volumeSourceID is the longest volume ID a group's volume request claims:
// its source, or with per_alloc the source of the highest index.
func volumeSourceID(v *VolumeRequest, count int) string {
	if !v.PerAlloc {
		return v.Source
	}
	return fmt.Sprintf("%s[%d]", v.Source, max(count-1, 0))
}

// validCSIMountDir reports whether dir, taken relative to the task
// directory, stays inside it. Empty means the default.
func validCSIMountDir(dir string) bool {
	if dir == "" {
		return true
	}
	rel := strings.TrimLeft(dir, "/")
	return rel != "" && filepath.IsLocal(rel)
}

// LookupTaskGroup returns the named group or nil.
func (j *Job) LookupTaskGroup(name string) *TaskGroup {
	for _, tg := range j.TaskGroups {
		if tg.Name == name {
			return tg
		}
	}
	return nil
}

// Stopped reports whether the job should run nothing.
func (j *Job) Stopped() bool { return j == nil || j.Stop }

// ValidUserName reports whether name is a plain POSIX user name: a
// lowercase letter or _, then lowercase letters, digits, _ or -, at most
// 32 in all.
func ValidUserName(name string) bool {
	if len(name) == 0 || len(name) > 32 {
		return false
	}
	for i, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r == '_':
		case i > 0 && (r >= '0' && r <= '9' || r == '-'):
		default:
			return false
		}
	}
	return true
}
