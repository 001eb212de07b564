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

// stop_on_client_after reaches the client, "0s" turns it off, and an
// agent that is both server and client refuses a value that does not nest
// inside the servers' claim window.
func TestConfig_StopOnClientAfter(t *testing.T) {
	c, err := ParseConfig("agent.hcl", []byte(`
client {
  enabled              = true
  stop_on_client_after = "4s"
}
`))
	must.NoError(t, err)
	merged := DefaultConfig().Merge(c).Merge(&Config{})
	must.Eq(t, "4s", merged.Client.StopOnClientAfter)

	a := newTestAgent(t, func(c *Config) { c.Client.StopOnClientAfter = "4s" })
	cc, err := a.clientConfig("")
	must.NoError(t, err)
	must.Eq(t, 4*time.Second, cc.StopOnClientAfter)

	// The defaults nest: 10s + 5s + 2s < min(10s, 20s) + 10s.
	must.NoError(t, DevConfig().Validate())
	off := DevConfig()
	off.Client.StopOnClientAfter = "0s"
	must.NoError(t, off.Validate())

	for _, tc := range []struct{ stop, ttl, grace string }{
		{"13s", "", ""},   // 13+5+2 = 20, not below 20
		{"10s", "5s", ""}, // window 15s
		{"1s", "2s", "2s"},
	} {
		bad := DevConfig()
		bad.Client.StopOnClientAfter = tc.stop
		bad.Server.MinHeartbeatTTL, bad.Server.HeartbeatGrace = tc.ttl, tc.grace
		must.ErrorContains(t, bad.Validate(), "stop_on_client_after", must.Sprintf("%+v", tc))
	}
	// A client-only agent checks at run time, against what the servers say.
	clientOnly := DevConfig()
	clientOnly.Server.Enabled = false
	clientOnly.Client.Servers = []string{"127.0.0.1:4647"}
	clientOnly.Client.StopOnClientAfter = "1h"
	must.NoError(t, clientOnly.Validate())

	for _, src := range []string{
		"client {\n  stop_on_client_after = \"-1s\"\n}\n",
		"client {\n  stop_on_client_after = \"soon\"\n}\n",
	} {
		_, err = ParseConfig("bad.hcl", []byte(src))
		must.ErrorContains(t, err, "bad.hcl:2", must.Sprint(src))
	}
}

// controller_concurrency of a static plugin reaches the client, unset is
// the default, and a value outside 1-64 or not a whole number is refused
// with the field named.
func TestConfig_CSIPluginControllerConcurrency(t *testing.T) {
	parse := func(v string) (*Config, error) {
		line := ""
		if v != "" {
			line = "controller_concurrency = " + v
		}
		c, err := ParseConfig("agent.hcl", []byte(`
client {
  enabled = true
  csi_plugin "ebs" {
    type   = "controller"
    socket = "/run/ebs.sock"
    `+line+`
  }
}
`))
		if err != nil {
			return nil, err
		}
		merged := DevConfig().Merge(c)
		return merged, merged.Validate()
	}
	c, err := parse("8")
	must.NoError(t, err)
	a := newTestAgent(t, func(tc *Config) { tc.Client.CSIPlugins = c.Client.CSIPlugins })
	cc, err := a.clientConfig("")
	must.NoError(t, err)
	must.Eq(t, 8, cc.CSIPlugins["ebs"].ControllerConcurrency)

	c, err = parse("")
	must.NoError(t, err)
	must.Nil(t, c.Client.CSIPlugins[0].ControllerConcurrency)

	for v, want := range map[string]string{
		"0":   `csi_plugin "ebs": controller_concurrency = 0 must be from 1 to 64`,
		"65":  `csi_plugin "ebs": controller_concurrency = 65 must be from 1 to 64`,
		"2.5": "agent.hcl:7,30: Unsuitable value type; Unsuitable value: value must be a whole number",
	} {
		_, err := parse(v)
		must.ErrorContains(t, err, want, must.Sprintf("controller_concurrency = %s", v))
	}
}
