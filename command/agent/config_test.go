package agent

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// The handoff settings in an agent file reach the server's configuration,
// and a file layered on top cannot turn leave_on_terminate back off.
func TestConfig_HandoffSettings(t *testing.T) {
	c, err := ParseConfig("server.hcl", []byte(`
leave_on_terminate = true
server {
  enabled             = true
  leave_drain_timeout = "45s"
}
`))
	must.NoError(t, err)
	must.True(t, c.LeaveOnTerminate)

	merged := DefaultConfig().Merge(c).Merge(&Config{})
	must.True(t, merged.LeaveOnTerminate)
	must.Eq(t, "45s", merged.Server.LeaveDrainTimeout)

	a := newTestAgent(t, func(c *Config) {
		c.LeaveOnTerminate = true
		c.Server.LeaveDrainTimeout = "45s"
	})
	must.True(t, a.Server().Config().LeaveOnTerminate)
	must.Eq(t, 45*time.Second, a.Server().Config().LeaveDrainTimeout)

	_, err = ParseConfig("bad.hcl", []byte(`leave_on_terminate = "sometimes"`))
	must.ErrorContains(t, err, "bad.hcl:1")
}
