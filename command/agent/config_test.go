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

// The node plugin timeouts reach the server's and the client's
// configurations, and an agent that is both refuses a server timeout that
// would give up before the client answers.
func TestConfig_CSINodeTimeouts(t *testing.T) {
	c, err := ParseConfig("agent.hcl", []byte(`
server {
  enabled                 = true
  csi_node_detach_timeout = "90s"
}
client {
  enabled               = true
  csi_node_call_timeout = "30s"
}
`))
	must.NoError(t, err)
	merged := DefaultConfig().Merge(c).Merge(&Config{})
	must.Eq(t, "90s", merged.Server.CSINodeDetachTimeout)
	must.Eq(t, "30s", merged.Client.CSINodeCallTimeout)

	a := newTestAgent(t, func(c *Config) {
		c.Server.CSINodeDetachTimeout = "90s"
		c.Client.CSINodeCallTimeout = "30s"
	})
	must.Eq(t, 90*time.Second, a.Server().Config().CSINodeDetachTimeout)
	cc, err := a.clientConfig("")
	must.NoError(t, err)
	must.Eq(t, 30*time.Second, cc.CSINodeCallTimeout)

	// The defaults nest.
	must.NoError(t, DevConfig().Validate())

	for _, tc := range []struct{ server, client string }{
		{"30s", "30s"},
		{"", "2m"}, // the server's default is 1m
		{"10s", ""},
	} {
		bad := DevConfig()
		bad.Server.CSINodeDetachTimeout, bad.Client.CSINodeCallTimeout = tc.server, tc.client
		must.ErrorContains(t, bad.Validate(), "csi_node_detach_timeout", must.Sprintf("server %q, client %q", tc.server, tc.client))
	}
	// A server-only agent cannot see the clients' setting.
	serverOnly := DevConfig()
	serverOnly.Client.Enabled = false
	serverOnly.Server.CSINodeDetachTimeout = "1s"
	must.NoError(t, serverOnly.Validate())

	for _, src := range []string{
		"server {\n  csi_node_detach_timeout = \"soon\"\n}\n",
		"client {\n  csi_node_call_timeout = \"0s\"\n}\n",
	} {
		_, err = ParseConfig("bad.hcl", []byte(src))
		must.ErrorContains(t, err, "bad.hcl:2", must.Sprint(src))
	}
}
