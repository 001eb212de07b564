package api

import (
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Job types.
const (
	JobTypeService = "service"
	JobTypeBatch   = "batch"
	JobTypeSystem  = "system"
)

// Ptr returns a pointer to v, for the optional fields of jobs.
func Ptr[T any](v T) *T { return &v }

// Job is a job as registered and as read back. Pointer fields are
// optional: nil takes the server's default, so an explicit zero (a
// count of 0, no restart attempts) can be told from a field left out.
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
	Stop        bool

	// Set by the servers; ignored on register.
	Status            string `json:",omitempty"`
	StatusDescription string `json:",omitempty"`
	Version           uint64 `json:",omitempty"`
	SubmitTime        int64  `json:",omitempty"`
	CreateIndex       uint64 `json:",omitempty"`
	ModifyIndex       uint64 `json:",omitempty"`
	JobModifyIndex    uint64 `json:",omitempty"`
}

// LookupTaskGroup returns the named group, or nil.
func (j *Job) LookupTaskGroup(name string) *TaskGroup {
	for _, tg := range j.TaskGroups {
		if tg.Name == name {
			return tg
		}
	}
	return nil
}

// TaskGroup is a set of tasks placed together.
type TaskGroup struct {
	Name             string
	Count            *int `json:",omitempty"`
	Tasks            []*Task
	RestartPolicy    *RestartPolicy    `json:",omitempty"`
	ReschedulePolicy *ReschedulePolicy `json:",omitempty"`
	Migrate          *MigrateStrategy  `json:",omitempty"`
	Volumes          map[string]*VolumeRequest
	Networks         []*NetworkResource `json:",omitempty"`
	Meta             map[string]string
}

// NetworkResource is a group's network block: static (ReservedPorts) and
// dynamic ports, host mode only.
type NetworkResource struct {
	Mode          string
	ReservedPorts []Port `json:",omitempty"`
	DynamicPorts  []Port `json:",omitempty"`
}

// Port is one port label; Value only for a static port.
type Port struct {
	Label       string
	Value       int
	To          int
	HostNetwork string `json:",omitempty"`
}

// Task is one process run by a driver.
type Task struct {
	Name        string
	Driver      string
	Config      map[string]any
	Env         map[string]string
	Resources   *Resources     `json:",omitempty"`
	KillTimeout *time.Duration `json:",omitempty"`
	KillSignal  string
	// User is the account the task runs as; empty means the client's.
	User         string `json:",omitempty"`
	VolumeMounts []*VolumeMount
	Meta         map[string]string
	// CSIPluginConfig makes the task a CSI plugin the client manages.
	CSIPluginConfig *TaskCSIPluginConfig `json:",omitempty"`
	// Lifecycle runs the task before, beside or after the main tasks.
	Lifecycle *TaskLifecycle `json:",omitempty"`
}

// TaskLifecycle is a task's lifecycle block: Hook prestart, poststart or
// poststop, Sidecar to keep it running beside the main tasks.
type TaskLifecycle struct {
	Hook    string
	Sidecar bool
}

// TaskCSIPluginConfig says which CSI plugin a task serves and where,
// relative to its task directory, it puts its socket.
type TaskCSIPluginConfig struct {
	ID       string
	Type     string
	MountDir string `json:",omitempty"`
	// ControllerConcurrency is how many destructive controller calls the
	// plugin accepts at once (controller_concurrency; 0 means 1).
	ControllerConcurrency int `json:",omitempty"`
}

// Resources a task asks for.
type Resources struct {
	CPU         *int `json:",omitempty"` // MHz
	MemoryMB    *int `json:",omitempty"`
	MemoryMaxMB *int `json:",omitempty"`
}

// RestartPolicy says how a group's failed tasks restart on their node.
type RestartPolicy struct {
	Attempts *int           `json:",omitempty"`
	Interval *time.Duration `json:",omitempty"`
	Delay    *time.Duration `json:",omitempty"`
	Mode     *string        `json:",omitempty"`
}

// ReschedulePolicy says how failed allocations are replaced elsewhere.
type ReschedulePolicy struct {
	Attempts      *int           `json:",omitempty"`
	Interval      *time.Duration `json:",omitempty"`
	Delay         *time.Duration `json:",omitempty"`
	DelayFunction *string        `json:",omitempty"`
	MaxDelay      *time.Duration `json:",omitempty"`
	Unlimited     *bool          `json:",omitempty"`
}

// MigrateStrategy says how a drain moves a group's allocations.
type MigrateStrategy struct {
	MaxParallel     *int           `json:",omitempty"`
	HealthCheck     *string        `json:",omitempty"`
	MinHealthyTime  *time.Duration `json:",omitempty"`
	HealthyDeadline *time.Duration `json:",omitempty"`
}

// VolumeRequest asks for a CSI volume for a group.
type VolumeRequest struct {
	Name           string
	Type           string
	Source         string
	PerAlloc       bool
	ReadOnly       bool
	AccessMode     string
	AttachmentMode string
	MountOptions   *CSIMountOptions `json:",omitempty"`
}

// CSIMountOptions tune how a volume is mounted.
type CSIMountOptions struct {
	FSType     string
	MountFlags []string
}

// VolumeMount mounts a group's volume into a task.
type VolumeMount struct {
	Volume      string
	Destination string
	ReadOnly    bool
}

// JobListStub is a job in a list.
type JobListStub struct {
	ID                string
	Name              string
	Namespace         string
	Type              string
	Priority          int
	Datacenters       []string
	Stop              bool
	Status            string
	StatusDescription string
	JobSummary        *JobSummary
	Version           uint64
	SubmitTime        int64
	CreateIndex       uint64
	ModifyIndex       uint64
	JobModifyIndex    uint64
}

// JobSummary counts a job's allocations by status, per group.
type JobSummary struct {
	JobID     string
	Namespace string
	Summary   map[string]TaskGroupSummary
}

// TaskGroupSummary counts one group's allocations.
type TaskGroupSummary struct {
	Queued   int
	Complete int
	Failed   int
	Running  int
	Starting int
	Lost     int
}

// Jobs registers, reads and stops jobs.
type Jobs struct{ c *Client }

// Jobs returns a handle on the job endpoints.
func (c *Client) Jobs() *Jobs { return &Jobs{c} }

// JobRegisterRequest is the body of a register.
type JobRegisterRequest struct {
	Job *Job
	// EnforceIndex makes the register fail unless the stored job's
	// JobModifyIndex is JobModifyIndex (0: the job must be new).
	EnforceIndex   bool   `json:",omitempty"`
	JobModifyIndex uint64 `json:",omitempty"`
}

// JobRegisterResponse names the evaluation a register created.
type JobRegisterResponse struct {
	EvalID          string
	EvalCreateIndex uint64
	JobModifyIndex  uint64
	Warnings        string
}

// JobDeregisterResponse names the evaluation that stops a job.
type JobDeregisterResponse struct {
	EvalID          string
	EvalCreateIndex uint64
	JobModifyIndex  uint64
}

// Register registers or updates a job and returns the evaluation it
// created. A job the server refuses is an *UnexpectedResponseError with
// status 400 whose body names the problem.
func (j *Jobs) Register(job *Job, w *WriteOptions) (*JobRegisterResponse, *WriteMeta, error) {
	return j.register(&JobRegisterRequest{Job: job}, w)
}

// EnforceRegister registers a job only if its stored JobModifyIndex is
// modifyIndex (0: only if the job is new).
func (j *Jobs) EnforceRegister(job *Job, modifyIndex uint64, w *WriteOptions) (*JobRegisterResponse, *WriteMeta, error) {
	return j.register(&JobRegisterRequest{Job: job, EnforceIndex: true, JobModifyIndex: modifyIndex}, w)
}

func (j *Jobs) register(req *JobRegisterRequest, w *WriteOptions) (*JobRegisterResponse, *WriteMeta, error) {
	var out JobRegisterResponse
	wm, err := j.c.write(http.MethodPut, "/v1/jobs", nil, req, &out, w)
	if err != nil {
		return nil, nil, err
	}
	return &out, wm, nil
}

// List returns the jobs; q.Prefix filters by ID prefix.
func (j *Jobs) List(q *QueryOptions) ([]*JobListStub, *QueryMeta, error) {
	var out []*JobListStub
	qm, err := j.c.query("/v1/jobs", &out, q)
	if err != nil {
		return nil, nil, err
	}
	return out, qm, nil
}

// PrefixList returns the jobs whose ID starts with prefix.
func (j *Jobs) PrefixList(prefix string) ([]*JobListStub, *QueryMeta, error) {
	return j.List(&QueryOptions{Prefix: prefix})
}

// Info returns a job by exact ID; an unknown one is an
// *UnexpectedResponseError with status 404.
func (j *Jobs) Info(jobID string, q *QueryOptions) (*Job, *QueryMeta, error) {
	var out Job
	qm, err := j.c.query("/v1/job/"+url.PathEscape(jobID), &out, q)
	if err != nil {
		return nil, nil, err
	}
	return &out, qm, nil
}

// Allocations returns a job's allocations; all includes those that will
// not run again.
func (j *Jobs) Allocations(jobID string, all bool, q *QueryOptions) ([]*AllocationListStub, *QueryMeta, error) {
	var out []*AllocationListStub
	path := "/v1/job/" + url.PathEscape(jobID) + "/allocations"
	qm, err := j.c.queryParams(path, url.Values{"all": {strconv.FormatBool(all)}}, &out, q)
	if err != nil {
		return nil, nil, err
	}
	return out, qm, nil
}

// Evaluations returns a job's evaluations.
func (j *Jobs) Evaluations(jobID string, q *QueryOptions) ([]*Evaluation, *QueryMeta, error) {
	var out []*Evaluation
	qm, err := j.c.query("/v1/job/"+url.PathEscape(jobID)+"/evaluations", &out, q)
	if err != nil {
		return nil, nil, err
	}
	return out, qm, nil
}

// Deregister stops a job and returns the evaluation that stops its
// allocations; purge also removes the job.
func (j *Jobs) Deregister(jobID string, purge bool, w *WriteOptions) (*JobDeregisterResponse, *WriteMeta, error) {
	var out JobDeregisterResponse
	params := url.Values{"purge": {strconv.FormatBool(purge)}}
	wm, err := j.c.write(http.MethodDelete, "/v1/job/"+url.PathEscape(jobID), params, nil, &out, w)
	if err != nil {
		return nil, nil, err
	}
	return &out, wm, nil
}

// ParseHCL has the agent parse an HCL job file into a job, defaulted and
// validated. Nothing is registered.
func (j *Jobs) ParseHCL(jobHCL string) (*Job, error) {
	req := struct {
		JobHCL       string
		Canonicalize bool
	}{JobHCL: jobHCL, Canonicalize: true}
	var out Job
	if _, err := j.c.write(http.MethodPut, "/v1/jobs/parse", nil, &req, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// queryParams is query with extra URL parameters.
func (c *Client) queryParams(path string, params url.Values, out any, q *QueryOptions) (*QueryMeta, error) {
	r := c.newRequest(http.MethodGet, path)
	c.setQueryOptions(r, q)
	for k, v := range params {
		r.params[k] = v
	}
	resp, rtt, err := c.do(r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	qm := parseQueryMeta(resp)
	qm.RequestTime = rtt
	if err := decodeBody(resp, out); err != nil {
		return nil, err
	}
	return qm, nil
}
