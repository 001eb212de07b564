package structs

import (
	"errors"
	"fmt"
)

// JobLimits bound what one job may ask for and how much a refusal may
// say. Servers check them on every register and the scheduler on every
// evaluation (a job stored before a limit was lowered is refused there,
// not placed); the job file parsers check the size and depth of the source
// before they parse it. The agent fills them from its limits block.
type JobLimits struct {
	// MaxBytes bounds a job file or job JSON body (job_max_bytes).
	MaxBytes int
	// MaxDepth bounds nesting in a job file: blocks, lists, objects,
	// parentheses, templates and chained operators (job_max_depth).
	MaxDepth int
	// MaxGroups bounds a job's task groups (job_max_groups).
	MaxGroups int
	// MaxTasks bounds a job's tasks, all groups together (job_max_tasks).
	MaxTasks int
	// GroupMaxCount bounds one group's count (group_max_count).
	GroupMaxCount int
	// MaxAllocs bounds the sum of a job's group counts (job_max_allocs).
	MaxAllocs int
	// ErrorMaxProblems bounds how many problems one error lists before
	// "and K more" (error_max_problems).
	ErrorMaxProblems int
}

// DefaultJobLimits are the limits an agent without a limits block uses.
func DefaultJobLimits() JobLimits {
	return JobLimits{
		MaxBytes:         1 << 20,
		MaxDepth:         64,
		MaxGroups:        100,
		MaxTasks:         500,
		GroupMaxCount:    10000,
		MaxAllocs:        50000,
		ErrorMaxProblems: 20,
	}
}

// Validate names every limit that is not positive; it changes nothing.
func (l JobLimits) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{
		{"job_max_bytes", l.MaxBytes},
		{"job_max_depth", l.MaxDepth},
		{"job_max_groups", l.MaxGroups},
		{"job_max_tasks", l.MaxTasks},
		{"group_max_count", l.GroupMaxCount},
		{"job_max_allocs", l.MaxAllocs},
		{"error_max_problems", l.ErrorMaxProblems},
	} {
		if f.v <= 0 {
			errs = append(errs, fmt.Errorf("job limits: %s = %d, must be positive", f.name, f.v))
		}
	}
	return errors.Join(errs...)
}

// ErrJobTooLarge means a job asks for more groups, tasks or allocations
// than the limits allow. It wraps ErrInvalidRequest where a request is
// refused; the scheduler returns it for a stored job it will not place.
var ErrJobTooLarge = errors.New("job exceeds limits")

// CheckSize reports, before anything iterates over them, whether j's
// groups, tasks and counts are within l. It looks at each group once and
// never sums past the limits, so a count near 2^63 cannot overflow it.
func (l JobLimits) CheckSize(j *Job) error {
	if n := len(j.TaskGroups); n > l.MaxGroups {
		return fmt.Errorf("%w: %d task groups, more than job_max_groups = %d", ErrJobTooLarge, n, l.MaxGroups)
	}
	tasks, allocs := 0, 0
	for _, tg := range j.TaskGroups {
		if tg == nil {
			continue
		}
		if tg.Count > l.GroupMaxCount {
			return fmt.Errorf("%w: group %q: count %d is more than group_max_count = %d", ErrJobTooLarge, tg.Name, tg.Count, l.GroupMaxCount)
		}
		tasks += len(tg.Tasks)
		if tasks > l.MaxTasks {
			return fmt.Errorf("%w: more than job_max_tasks = %d tasks", ErrJobTooLarge, l.MaxTasks)
		}
		// Both terms are at most their limits here, so the sum cannot
		// overflow.
		allocs += max(tg.Count, 0)
		if allocs > l.MaxAllocs {
			return fmt.Errorf("%w: the groups' counts add up to more than job_max_allocs = %d", ErrJobTooLarge, l.MaxAllocs)
		}
	}
	return nil
}

// Problems collects the problems of one validation and keeps only the
// first Max (at least one), counting the rest, so that a request with a
// million mistakes gets a reply of a few lines.
type Problems struct {
	// Max is how many problems are kept; zero or less means
	// DefaultJobLimits().ErrorMaxProblems.
	Max  int
	errs []error
	more int
}

// Add records a problem.
func (p *Problems) Add(err error) {
	if err == nil {
		return
	}
	limit := p.Max
	if limit <= 0 {
		limit = DefaultJobLimits().ErrorMaxProblems
	}
	if len(p.errs) < limit {
		p.errs = append(p.errs, err)
		return
	}
	p.more++
}

// Addf records a problem built with fmt.Errorf.
func (p *Problems) Addf(format string, args ...any) { p.Add(fmt.Errorf(format, args...)) }

// Len is how many problems were recorded, dropped ones included.
func (p *Problems) Len() int { return len(p.errs) + p.more }

// Err joins the kept problems, one per line, and ends with "and K more
// problems" when some were dropped; nil when there were none.
func (p *Problems) Err() error {
	if p.Len() == 0 {
		return nil
	}
	errs := p.errs
	if p.more > 0 {
		errs = append(errs[:len(errs):len(errs)], fmt.Errorf("and %d more problems", p.more))
	}
	return errors.Join(errs...)
}
