package jobspec

import (
	"fmt"
	"time"

	"github.com/roamhq/roam/structs"
)

// The policy specs below hold what a job file set, with nil for what it
// left out. structs.Job.Canonicalize only defaults a policy that is
// missing altogether, so a partial block (restart { attempts = 5 }) takes
// the rest of its fields from the job type's defaults here, as in Nomad.
// Their field names are those of Nomad's API JSON, so ParseJSON decodes
// into them directly.

type restartSpec struct {
	Attempts *int
	Interval *time.Duration
	Delay    *time.Duration
	Mode     *string
}

type rescheduleSpec struct {
	Attempts      *int
	Interval      *time.Duration
	Delay         *time.Duration
	DelayFunction *string
	MaxDelay      *time.Duration
	Unlimited     *bool
}

type migrateSpec struct {
	MaxParallel     *int
	HealthCheck     *string
	MinHealthyTime  *time.Duration
	HealthyDeadline *time.Duration
}

type resourcesSpec struct {
	CPU         *int
	MemoryMB    *int
	MemoryMaxMB *int
}

// groupDefaults returns a group with one task as Canonicalize leaves them
// for jobType.
func groupDefaults(jobType string) *structs.TaskGroup {
	j := &structs.Job{Type: jobType, TaskGroups: []*structs.TaskGroup{{Tasks: []*structs.Task{{}}}}}
	j.Canonicalize()
	return j.TaskGroups[0]
}

func set[T any](dst *T, src *T) {
	if src != nil {
		*dst = *src
	}
}

func (s *restartSpec) build(jobType string) *structs.RestartPolicy {
	if s == nil {
		return nil
	}
	p := &structs.RestartPolicy{}
	if d := groupDefaults(jobType).RestartPolicy; d != nil {
		*p = *d
	}
	set(&p.Attempts, s.Attempts)
	set(&p.Interval, s.Interval)
	set(&p.Delay, s.Delay)
	set(&p.Mode, s.Mode)
	return p
}

func (s *rescheduleSpec) build(jobType string) *structs.ReschedulePolicy {
	if s == nil {
		return nil
	}
	p := &structs.ReschedulePolicy{}
	if d := groupDefaults(jobType).ReschedulePolicy; d != nil {
		*p = *d
	}
	set(&p.Attempts, s.Attempts)
	set(&p.Interval, s.Interval)
	set(&p.Delay, s.Delay)
	set(&p.DelayFunction, s.DelayFunction)
	set(&p.MaxDelay, s.MaxDelay)
	set(&p.Unlimited, s.Unlimited)
	return p
}

func (s *migrateSpec) build() *structs.MigrateStrategy {
	if s == nil {
		return nil
	}
	// Only service jobs get a migrate strategy by default; a batch or
	// system job that sets part of one takes the rest from the service
	// defaults.
	p := &structs.MigrateStrategy{}
	if d := groupDefaults(structs.JobTypeService).Migrate; d != nil {
		*p = *d
	}
	set(&p.MaxParallel, s.MaxParallel)
	set(&p.HealthCheck, s.HealthCheck)
	set(&p.MinHealthyTime, s.MinHealthyTime)
	set(&p.HealthyDeadline, s.HealthyDeadline)
	return p
}

func (s *resourcesSpec) build() *structs.Resources {
	if s == nil {
		return nil
	}
	r := &structs.Resources{}
	if d := groupDefaults(structs.JobTypeService).Tasks[0].Resources; d != nil {
		*r = *d
	}
	set(&r.CPU, s.CPU)
	set(&r.MemoryMB, s.MemoryMB)
	set(&r.MemoryMaxMB, s.MemoryMaxMB)
	return r
}

// finish defaults a parsed job and validates it. The parsers have
// already set Count to 1 on groups whose file gave none.
func finish(job *structs.Job, l structs.JobLimits) (*structs.Job, error) {
	job.Canonicalize()
	if err := job.ValidateWith(l); err != nil {
		return nil, err
	}
	return job, nil
}

// invalid wraps a parse error so that callers can treat it like a
// validation error.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", structs.ErrInvalidRequest, fmt.Sprintf(format, args...))
}
