package structs

import (
	"fmt"
	"time"
)

// Desired statuses: what the servers want.
const (
	AllocDesiredStatusRun   = "run"
	AllocDesiredStatusStop  = "stop"
	AllocDesiredStatusEvict = "evict"
)

// Client statuses: what the client reports.
const (
	AllocClientStatusPending  = "pending"
	AllocClientStatusRunning  = "running"
	AllocClientStatusComplete = "complete"
	AllocClientStatusFailed   = "failed"
	AllocClientStatusLost     = "lost"
)

// Task states.
const (
	TaskStatePending = "pending"
	TaskStateRunning = "running"
	TaskStateDead    = "dead"
)

// Allocation is one placement of a task group on a node.
type Allocation struct {
	ID        string
	Namespace string
	EvalID    string
	// Name is "<job>.<group>[<index>]"; the index survives replacement.
	Name      string
	NodeID    string
	NodeName  string
	JobID     string
	Job       *Job
	TaskGroup string
	// Resources is the sum of the group's task resources.
	Resources *Resources
	// AllocatedResources are the host ports the scheduler gave it.
	AllocatedResources *AllocatedResources `json:",omitempty"`

	DesiredStatus      string
	DesiredDescription string
	DesiredTransition  DesiredTransition

	ClientStatus      string
	ClientDescription string
	TaskStates        map[string]*TaskState

	PreviousAllocation string
	NextAllocation     string
	RescheduleTracker  *RescheduleTracker
	// FollowupEvalID is the delayed evaluation that will reschedule this
	// allocation.
	FollowupEvalID string

	CreateIndex      uint64
	ModifyIndex      uint64
	AllocModifyIndex uint64
	CreateTime       int64 // Unix nanoseconds
	ModifyTime       int64
}

// DesiredTransition is a server's request that an allocation move; the
// scheduler acts on it.
type DesiredTransition struct {
	// Migrate asks that the allocation be moved off its node (drain).
	Migrate *bool
	// Reschedule asks that a failed allocation be replaced now.
	Reschedule *bool
	// ForceReschedule replaces it even past the policy's attempts.
	ForceReschedule *bool
}

// ShouldMigrate reports whether a drain asked for this allocation to move.
func (d DesiredTransition) ShouldMigrate() bool { return d.Migrate != nil && *d.Migrate }

// TaskState is a task's lifecycle on the client.
type TaskState struct {
	State       string
	Failed      bool
	Restarts    uint64
	LastRestart time.Time
	StartedAt   time.Time
	FinishedAt  time.Time
	Events      []*TaskEvent
}

// Task event types.
const (
	TaskEventReceived      = "Received"
	TaskEventStarted       = "Started"
	TaskEventTerminated    = "Terminated"
	TaskEventRestarting    = "Restarting"
	TaskEventNotRestarting = "Not Restarting"
	TaskEventKilling       = "Killing"
	TaskEventKilled        = "Killed"
	TaskEventDriverFailure = "Driver Failure"
	// TaskEventRestartSignaled and TaskEventSignaling, as in Nomad: a
	// re-rendered template restarts or signals the task.
	TaskEventRestartSignaled = "Restart Signaled"
	TaskEventSignaling       = "Signaling"
	// Artifact downloads, as Nomad names them.
	TaskEventDownloadingArtifacts   = "Downloading Artifacts"
	TaskEventArtifactDownloadFailed = "Failed Artifact Download"
)

// TaskEvent is one thing that happened to a task.
type TaskEvent struct {
	Type           string
	Time           int64 // Unix nanoseconds
	Message        string
	DisplayMessage string
	ExitCode       int
	Signal         int
	// Details are the event's facts by name, as in Nomad ("oom_killed").
	Details map[string]string `json:",omitempty"`
}

// RescheduleTracker records the replacements that led to an allocation.
type RescheduleTracker struct {
	Events []*RescheduleEvent
}

// RescheduleEvent is one replacement.
type RescheduleEvent struct {
	RescheduleTime int64 // Unix nanoseconds
	PrevAllocID    string
	PrevNodeID     string
	Delay          time.Duration
}

// TerminalStatus reports whether the allocation will not run again: the
// servers want it stopped, or the client says it is done.
func (a *Allocation) TerminalStatus() bool {
	switch a.DesiredStatus {
	case AllocDesiredStatusStop, AllocDesiredStatusEvict:
		return true
	}
	return a.ClientTerminalStatus()
}

// ClientTerminalStatus reports whether the client has finished with it.
func (a *Allocation) ClientTerminalStatus() bool {
	switch a.ClientStatus {
	case AllocClientStatusComplete, AllocClientStatusFailed, AllocClientStatusLost:
		return true
	}
	return false
}

// TasksGone reports whether the client has reported the allocation
// terminal with every task it reported dead. A failed task makes the
// allocation failed at once, while its sibling tasks may still be inside
// their kill timeout, or still starting: a task reported pending may have
// its process launched already. They count until the client reports them
// dead, which it does for every task once the allocation is over, its
// setup having failed included.
func (a *Allocation) TasksGone() bool {
	if !a.ClientTerminalStatus() {
		return false
	}
	for _, ts := range a.TaskStates {
		if ts != nil && ts.State != TaskStateDead {
			return false
		}
	}
	return true
}

// Index returns the allocation's index within its group, from its name.
func (a *Allocation) Index() int {
	var idx int
	open := -1
	for i := len(a.Name) - 1; i >= 0; i-- {
		if a.Name[i] == '[' {
			open = i
			break
		}
	}
	if open < 0 {
		return 0
	}
	if _, err := fmt.Sscanf(a.Name[open:], "[%d]", &idx); err != nil {
		return 0
	}
	return idx
}

// AllocName returns the name of a group's idx-th allocation.
func AllocName(job, group string, idx int) string {
	return fmt.Sprintf("%s.%s[%d]", job, group, idx)
}

// Copy returns a copy deep enough that changing statuses, transitions,
// task states or the tracker on it leaves the original alone. The job is
// shared: it is never mutated once stored.
func (a *Allocation) Copy() *Allocation {
	if a == nil {
		return nil
	}
	c := *a
	if a.Resources != nil {
		r := *a.Resources
		c.Resources = &r
	}
	if a.AllocatedResources != nil {
		ar := *a.AllocatedResources
		ar.Shared.Ports = append([]AllocatedPortMapping(nil), a.AllocatedResources.Shared.Ports...)
		c.AllocatedResources = &ar
	}
	if a.TaskStates != nil {
		c.TaskStates = make(map[string]*TaskState, len(a.TaskStates))
		for k, v := range a.TaskStates {
			ts := *v
			ts.Events = append([]*TaskEvent(nil), v.Events...)
			c.TaskStates[k] = &ts
		}
	}
	if a.RescheduleTracker != nil {
		c.RescheduleTracker = &RescheduleTracker{Events: append([]*RescheduleEvent(nil), a.RescheduleTracker.Events...)}
	}
	return &c
}

// Stub is the summary used in lists.
func (a *Allocation) Stub() *AllocListStub {
	s := &AllocListStub{
		ID: a.ID, EvalID: a.EvalID, Name: a.Name, Namespace: a.Namespace,
		NodeID: a.NodeID, NodeName: a.NodeName, JobID: a.JobID, TaskGroup: a.TaskGroup,
		DesiredStatus: a.DesiredStatus, DesiredDescription: a.DesiredDescription,
		ClientStatus: a.ClientStatus, ClientDescription: a.ClientDescription,
		TaskStates: a.TaskStates, DesiredTransition: a.DesiredTransition,
		PreviousAllocation: a.PreviousAllocation, NextAllocation: a.NextAllocation,
		RescheduleTracker: a.RescheduleTracker, FollowupEvalID: a.FollowupEvalID,
		CreateIndex: a.CreateIndex, ModifyIndex: a.ModifyIndex,
		CreateTime: a.CreateTime, ModifyTime: a.ModifyTime,
	}
	if a.Job != nil {
		s.JobType = a.Job.Type
		s.JobVersion = a.Job.Version
	}
	return s
}

// AllocListStub is an allocation in a list, shaped like Nomad's.
type AllocListStub struct {
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
