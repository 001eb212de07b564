package api

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Allocation desired and client statuses.
const (
	AllocDesiredStatusRun     = "run"
	AllocDesiredStatusStop    = "stop"
	AllocDesiredStatusEvict   = "evict"
	AllocClientStatusPending  = "pending"
	AllocClientStatusRunning  = "running"
	AllocClientStatusComplete = "complete"
	AllocClientStatusFailed   = "failed"
	AllocClientStatusLost     = "lost"
)

// Allocation is one placement of a task group on a node.
type Allocation struct {
	ID                 string
	Namespace          string
	EvalID             string
	Name               string
	NodeID             string
	NodeName           string
	JobID              string
	Job                *Job
	TaskGroup          string
	Resources          *Resources
	AllocatedResources *AllocatedResources `json:",omitempty"`
	DesiredStatus      string
	DesiredDescription string
	DesiredTransition  DesiredTransition
	ClientStatus       string
	ClientDescription  string
	TaskStates         map[string]*TaskState
	PreviousAllocation string
	NextAllocation     string
	RescheduleTracker  *RescheduleTracker
	FollowupEvalID     string
	CreateIndex        uint64
	ModifyIndex        uint64
	AllocModifyIndex   uint64
	// CreateTime and ModifyTime are Unix nanoseconds.
	CreateTime int64
	ModifyTime int64
}

// AllocationListStub is an allocation in a list.
type AllocationListStub struct {
	ID                 string
	EvalID             string
	Name               string
	Namespace          string
	NodeID             string
	NodeName           string
	JobID              string
	JobType            string
	JobVersion         uint64
	TaskGroup          string
	DesiredStatus      string
	DesiredDescription string
	ClientStatus       string
	ClientDescription  string
	TaskStates         map[string]*TaskState
	DesiredTransition  DesiredTransition
	PreviousAllocation string
	NextAllocation     string
	RescheduleTracker  *RescheduleTracker
	FollowupEvalID     string
	CreateIndex        uint64
	ModifyIndex        uint64
	CreateTime         int64
	ModifyTime         int64
}

// DesiredTransition is the servers' request that an allocation move.
type DesiredTransition struct {
	Migrate         *bool
	Reschedule      *bool
	ForceReschedule *bool
}

// ShouldMigrate reports whether a drain asked for the allocation to move.
func (d DesiredTransition) ShouldMigrate() bool { return d.Migrate != nil && *d.Migrate }

// TaskState is a task's lifecycle on its client.
type TaskState struct {
	State       string
	Failed      bool
	Restarts    uint64
	LastRestart time.Time
	StartedAt   time.Time
	FinishedAt  time.Time
	Events      []*TaskEvent
}

// TaskEvent is one thing that happened to a task.
type TaskEvent struct {
	Type string
	// Time is Unix nanoseconds.
	Time           int64
	Message        string
	DisplayMessage string
	ExitCode       int
	Signal         int
}

// RescheduleTracker records the replacements that led to an allocation.
type RescheduleTracker struct {
	Events []*RescheduleEvent
}

// RescheduleEvent is one replacement.
type RescheduleEvent struct {
	RescheduleTime int64
	PrevAllocID    string
	PrevNodeID     string
	Delay          time.Duration
}

// Allocations reads allocations.
type Allocations struct{ c *Client }

// Allocations returns a handle on the allocation endpoints.
func (c *Client) Allocations() *Allocations { return &Allocations{c} }

// List returns allocation stubs; q.Prefix filters by ID prefix.
func (a *Allocations) List(q *QueryOptions) ([]*AllocationListStub, *QueryMeta, error) {
	var out []*AllocationListStub
	qm, err := a.c.query("/v1/allocations", &out, q)
	if err != nil {
		return nil, nil, err
	}
	return out, qm, nil
}

// PrefixList returns the allocations whose ID starts with prefix.
func (a *Allocations) PrefixList(prefix string) ([]*AllocationListStub, *QueryMeta, error) {
	return a.List(&QueryOptions{Prefix: prefix})
}

// Info returns one allocation by ID or unique ID prefix; an unknown one
// is an *UnexpectedResponseError with status 404, an ambiguous prefix one
// with status 400.
func (a *Allocations) Info(allocID string, q *QueryOptions) (*Allocation, *QueryMeta, error) {
	var out Allocation
	qm, err := a.c.query("/v1/allocation/"+url.PathEscape(allocID), &out, q)
	if err != nil {
		return nil, nil, err
	}
	return &out, qm, nil
}

// Log streams.
const (
	LogStdout = "stdout"
	LogStderr = "stderr"
)

// AllocFS reads allocation files from the clients that run them.
type AllocFS struct{ c *Client }

// AllocFS returns a handle on the client file endpoints.
func (c *Client) AllocFS() *AllocFS { return &AllocFS{c} }

// LogOptions pick which part of a log to read.
type LogOptions struct {
	// Origin is "start" (default) or "end".
	Origin string
	// Offset counts bytes from the origin.
	Offset int64
}

// Logs returns a task's stdout or stderr (LogStdout, LogStderr) from
// its start, as plain text. task may be empty when the allocation's
// group has one task. Any agent can answer: one that does not run the
// allocation asks the one that does. The caller closes the reader.
func (f *AllocFS) Logs(allocID, task, stream string) (io.ReadCloser, error) {
	return f.LogsOpts(allocID, task, stream, nil, nil)
}

// LogsOpts is Logs with an origin and offset.
func (f *AllocFS) LogsOpts(allocID, task, stream string, opts *LogOptions, q *QueryOptions) (io.ReadCloser, error) {
	r := f.c.newRequest(http.MethodGet, "/v1/client/fs/logs/"+url.PathEscape(allocID))
	f.c.setQueryOptions(r, q)
	if task != "" {
		r.params.Set("task", task)
	}
	if stream == "" {
		stream = LogStdout
	}
	r.params.Set("type", stream)
	r.params.Set("plain", "true")
	if opts != nil {
		if opts.Origin != "" {
			r.params.Set("origin", opts.Origin)
		}
		if opts.Offset != 0 {
			r.params.Set("offset", strconv.FormatInt(opts.Offset, 10))
		}
	}
	resp, _, err := f.c.do(r)
	if err != nil {
		return nil, fmt.Errorf("api: logs of alloc %s: %w", allocID, err)
	}
	return resp.Body, nil
}

// AllocFileInfo is a file of an allocation's directory.
type AllocFileInfo struct {
	Name        string
	IsDir       bool
	Size        int64
	FileMode    string
	ModTime     time.Time
	ContentType string `json:",omitempty"`
}

// List lists a directory of the allocation's directory.
func (f *AllocFS) List(allocID, path string, q *QueryOptions) ([]*AllocFileInfo, error) {
	var out []*AllocFileInfo
	if err := f.get("/v1/client/fs/ls/"+url.PathEscape(allocID), path, &out, q); err != nil {
		return nil, err
	}
	return out, nil
}

// Stat describes one file of the allocation's directory.
func (f *AllocFS) Stat(allocID, path string, q *QueryOptions) (*AllocFileInfo, error) {
	var out AllocFileInfo
	if err := f.get("/v1/client/fs/stat/"+url.PathEscape(allocID), path, &out, q); err != nil {
		return nil, err
	}
	return &out, nil
}

// get is a GET of an fs route with ?path=, decoded into out.
func (f *AllocFS) get(route, path string, out any, q *QueryOptions) error {
	r := f.c.newRequest(http.MethodGet, route)
	f.c.setQueryOptions(r, q)
	r.params.Set("path", path)
	resp, _, err := f.c.do(r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeBody(resp, out)
}

// Cat reads one file of the allocation's directory.
func (f *AllocFS) Cat(allocID, path string, q *QueryOptions) (io.ReadCloser, error) {
	r := f.c.newRequest(http.MethodGet, "/v1/client/fs/cat/"+url.PathEscape(allocID))
	f.c.setQueryOptions(r, q)
	r.params.Set("path", path)
	resp, _, err := f.c.do(r)
	if err != nil {
		return nil, fmt.Errorf("api: cat %s of alloc %s: %w", path, allocID, err)
	}
	return resp.Body, nil
}

// AllocatedResources are the host ports an allocation holds, in Nomad's
// shape.
type AllocatedResources struct {
	Shared AllocatedSharedResources
}

// AllocatedSharedResources are an allocation's group-wide resources.
type AllocatedSharedResources struct {
	Ports []PortMapping `json:",omitempty"`
}

// PortMapping is one host port of an allocation: Value on HostIP, To
// inside the task (0: the same).
type PortMapping struct {
	Label  string
	Value  int
	To     int
	HostIP string
}

// Stats measures the allocation's resource usage on its node
// (/v1/client/allocation/:id/stats).
func (a *Allocations) Stats(allocID string, q *QueryOptions) (*AllocResourceUsage, error) {
	var out AllocResourceUsage
	if _, err := a.c.query("/v1/client/allocation/"+url.PathEscape(allocID)+"/stats", &out, q); err != nil {
		return nil, err
	}
	return &out, nil
}

// AllocResourceUsage is an allocation's resource usage, in Nomad's shape.
type AllocResourceUsage struct {
	ResourceUsage *ResourceUsage
	Tasks         map[string]*TaskResourceUsage
	Timestamp     int64
}

// TaskResourceUsage is one task's resource usage.
type TaskResourceUsage struct {
	ResourceUsage *ResourceUsage
	Timestamp     int64
}

// ResourceUsage is memory and CPU usage.
type ResourceUsage struct {
	MemoryStats *MemoryStats
	CpuStats    *CpuStats
}

// MemoryStats are bytes.
type MemoryStats struct {
	RSS, Cache, Swap, Usage, MaxUsage, KernelUsage, KernelMaxUsage uint64
	Measured                                                       []string
}

// CpuStats: percent of one core, MHz used (TotalTicks), throttling.
type CpuStats struct {
	SystemMode, UserMode, TotalTicks float64
	ThrottledPeriods, ThrottledTime  uint64
	Percent                          float64
	Measured                         []string
}
