package agent

import (
	"testing"

	"github.com/shoenig/test/must"
)

func TestLimits_ParseMergeValidate(t *testing.T) {
	file, err := ParseConfig("limits.hcl", []byte(`
limits {
  job_max_depth         = 32
  rpc_frame_timeout     = "10s"
}
`))
	must.NoError(t, err)
	c := DefaultConfig().Merge(file)
	must.EqOp(t, 32, c.Limits.JobMaxDepth)
	must.EqOp(t, "10s", c.Limits.RPCFrameTimeout)
	// Unset fields keep their defaults.
	must.EqOp(t, DefaultLimits().JobMaxBytes, c.Limits.JobMaxBytes)
	must.NoError(t, c.Limits.validate())

	bad := DefaultLimits()
	bad.JobMaxGroups = -1
	bad.HTTPBodyReadTimeout = "soon"
	err = bad.validate()
	must.ErrorContains(t, err, "job_max_groups = -1")
	must.ErrorContains(t, err, `http_body_read_timeout = "soon"`)

	_, err = ParseConfig("typo.hcl", []byte(`limits { job_max_dept = 3 }`))
	must.ErrorContains(t, err, "job_max_dept")
}
