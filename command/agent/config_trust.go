package agent

import (
	"fmt"
	"net"

	"github.com/roamhq/roam/structs"
)

// validateTrust checks the settings that decide who can reach the agent
// and what its tasks may do.
func (c *Config) validateTrust() error {
	for _, p := range c.Plugins {
		if p.Name != "raw_exec" {
			return fmt.Errorf("config: plugin %q is unknown; the only driver plugin is raw_exec", p.Name)
		}
		if p.Config != nil && p.Config.DefaultUser != "" && !structs.ValidUserName(p.Config.DefaultUser) {
			return fmt.Errorf("config: plugin \"raw_exec\" default_user = %q is not a user name", p.Config.DefaultUser)
		}
	}
	if c.DevMode || c.InsecureBind || c.tlsEnabled() {
		return nil
	}
	if ip := net.ParseIP(c.BindAddr); ip != nil && !ip.IsLoopback() {
		missing := "TLS is not configured"
		if tc := c.tlsConfig(); tc.Enabled() {
			// One listener speaks TLS and the other does not.
			missing = fmt.Sprintf("TLS is not on for both ports (tls.rpc = %t, tls.http = %t)", tc.RPC, tc.HTTP)
		}
		return fmt.Errorf("config: bind_addr = %q is not a loopback address and %s: "+
			"anyone who can reach the RPC port could act as a server or a node of this cluster; "+
			"configure TLS, bind a loopback address, or set insecure_bind = true to accept that risk", c.BindAddr, missing)
	}
	return nil
}

// tlsEnabled reports whether the agent's RPC and HTTP both run over TLS.
func (c *Config) tlsEnabled() bool {
	tc := c.tlsConfig()
	return tc.RPC && tc.HTTP
}

// rawExecEnabled reports whether plugin "raw_exec" { config { enabled =
// true } } is set (DevConfig sets it); the last block that sets enabled
// wins.
func (c *Config) rawExecEnabled() bool {
	on := false
	for _, p := range c.Plugins {
		if p.Name == "raw_exec" && p.Config != nil && p.Config.Enabled != nil {
			on = *p.Config.Enabled
		}
	}
	return on
}

// rawExecDefaultUser is the last default_user a raw_exec plugin block
// sets.
func (c *Config) rawExecDefaultUser() string {
	u := ""
	for _, p := range c.Plugins {
		if p.Name == "raw_exec" && p.Config != nil && p.Config.DefaultUser != "" {
			u = p.Config.DefaultUser
		}
	}
	return u
}
