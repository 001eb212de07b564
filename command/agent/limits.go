package agent

import (
	"errors"
	"fmt"
	"time"

	"github.com/roamhq/roam/structs"
)

// Limits is the agent's limits block, in the spirit of Nomad's: every
// size, depth, count and connection a caller controls has a bound, checked
// before any work or write. Zero means "the default".
//
//	limits {
//	  job_max_bytes             = 1048576
//	  job_max_depth             = 64
//	  job_max_groups            = 100
//	  job_max_tasks             = 500
//	  group_max_count           = 10000
//	  job_max_allocs            = 50000
//	  error_max_problems        = 20
//	  http_max_conns_per_client = 100
//	  rpc_max_conns_per_client  = 100
//	  rpc_handshake_timeout     = "5s"
//	  rpc_frame_timeout         = "30s"
//	  http_body_read_timeout    = "30s"
//	}
type Limits struct {
	// JobMaxBytes bounds a job file or job JSON body.
	JobMaxBytes int `hcl:"job_max_bytes,optional"`
	// JobMaxDepth bounds nesting (blocks, lists, objects) in a job file,
	// checked before the parser can recurse.
	JobMaxDepth int `hcl:"job_max_depth,optional"`
	// JobMaxGroups bounds the task groups of one job.
	JobMaxGroups int `hcl:"job_max_groups,optional"`
	// JobMaxTasks bounds the tasks of one job, all groups together.
	JobMaxTasks int `hcl:"job_max_tasks,optional"`
	// GroupMaxCount bounds one group's count (its allocations).
	GroupMaxCount int `hcl:"group_max_count,optional"`
	// JobMaxAllocs bounds the allocations of one job, all groups together.
	JobMaxAllocs int `hcl:"job_max_allocs,optional"`
	// ErrorMaxProblems bounds how many problems an error reply lists before
	// "and K more".
	ErrorMaxProblems int `hcl:"error_max_problems,optional"`
	// HTTPMaxConnsPerClient bounds open HTTP connections from one address.
	HTTPMaxConnsPerClient int `hcl:"http_max_conns_per_client,optional"`
	// RPCMaxConnsPerClient bounds open RPC connections from one address.
	RPCMaxConnsPerClient int `hcl:"rpc_max_conns_per_client,optional"`
	// RPCHandshakeTimeout bounds the wait for a new RPC connection's first
	// byte (and the TLS handshake, when there is one).
	RPCHandshakeTimeout string `hcl:"rpc_handshake_timeout,optional"`
	// RPCFrameTimeout bounds reading one RPC or Raft frame once its first
	// byte arrived.
	RPCFrameTimeout string `hcl:"rpc_frame_timeout,optional"`
	// HTTPBodyReadTimeout bounds reading one HTTP request body. It does
	// not bound the response: a blocking query may wait its full time.
	HTTPBodyReadTimeout string `hcl:"http_body_read_timeout,optional"`
}

// DefaultLimits are the limits before any file or flag.
func DefaultLimits() *Limits {
	return &Limits{
		JobMaxBytes:           1 << 20,
		JobMaxDepth:           64,
		JobMaxGroups:          100,
		JobMaxTasks:           500,
		GroupMaxCount:         10000,
		JobMaxAllocs:          50000,
		ErrorMaxProblems:      20,
		HTTPMaxConnsPerClient: 100,
		RPCMaxConnsPerClient:  100,
		RPCHandshakeTimeout:   "5s",
		RPCFrameTimeout:       "30s",
		HTTPBodyReadTimeout:   "30s",
	}
}

// merge returns l with o's set fields on top.
func (l *Limits) merge(o *Limits) *Limits {
	r := *l
	if o == nil {
		return &r
	}
	setInt(&r.JobMaxBytes, o.JobMaxBytes)
	setInt(&r.JobMaxDepth, o.JobMaxDepth)
	setInt(&r.JobMaxGroups, o.JobMaxGroups)
	setInt(&r.JobMaxTasks, o.JobMaxTasks)
	setInt(&r.GroupMaxCount, o.GroupMaxCount)
	setInt(&r.JobMaxAllocs, o.JobMaxAllocs)
	setInt(&r.ErrorMaxProblems, o.ErrorMaxProblems)
	setInt(&r.HTTPMaxConnsPerClient, o.HTTPMaxConnsPerClient)
	setInt(&r.RPCMaxConnsPerClient, o.RPCMaxConnsPerClient)
	setStr(&r.RPCHandshakeTimeout, o.RPCHandshakeTimeout)
	setStr(&r.RPCFrameTimeout, o.RPCFrameTimeout)
	setStr(&r.HTTPBodyReadTimeout, o.HTTPBodyReadTimeout)
	return &r
}

// validate names every bad limit; it changes nothing.
func (l *Limits) validate() error {
	var errs []error
	positive := func(name string, v int) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("limits: %s = %d, must be positive", name, v))
		}
	}
	positive("job_max_bytes", l.JobMaxBytes)
	positive("job_max_depth", l.JobMaxDepth)
	positive("job_max_groups", l.JobMaxGroups)
	positive("job_max_tasks", l.JobMaxTasks)
	positive("group_max_count", l.GroupMaxCount)
	positive("job_max_allocs", l.JobMaxAllocs)
	positive("error_max_problems", l.ErrorMaxProblems)
	positive("http_max_conns_per_client", l.HTTPMaxConnsPerClient)
	positive("rpc_max_conns_per_client", l.RPCMaxConnsPerClient)
	for name, v := range map[string]string{
		"rpc_handshake_timeout":  l.RPCHandshakeTimeout,
		"rpc_frame_timeout":      l.RPCFrameTimeout,
		"http_body_read_timeout": l.HTTPBodyReadTimeout,
	} {
		if d, err := time.ParseDuration(v); err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("limits: %s = %q, must be a positive duration", name, v))
		}
	}
	return errors.Join(errs...)
}

// jobLimits are the job limits servers and the HTTP API enforce.
func (l *Limits) jobLimits() structs.JobLimits {
	return structs.JobLimits{
		MaxBytes:         l.JobMaxBytes,
		MaxDepth:         l.JobMaxDepth,
		MaxGroups:        l.JobMaxGroups,
		MaxTasks:         l.JobMaxTasks,
		GroupMaxCount:    l.GroupMaxCount,
		MaxAllocs:        l.JobMaxAllocs,
		ErrorMaxProblems: l.ErrorMaxProblems,
	}
}
