package agent

import (
	"fmt"
	"net"
	"strings"

	execdriver "github.com/roamhq/roam/client/driver/exec"
	"github.com/roamhq/roam/structs"
)

// validateTrust checks the settings that decide who can reach the agent
// and what its tasks may do.
func (c *Config) validateTrust() error {
	for _, p := range c.Plugins {
		switch p.Name {
		case "raw_exec":
			if p.Config != nil && p.Config.DefaultUser != "" && !structs.ValidUserName(p.Config.DefaultUser) {
				return fmt.Errorf("config: plugin \"raw_exec\" default_user = %q is not a user name", p.Config.DefaultUser)
			}
		case "exec":
			if p.Config != nil && p.Config.DefaultUser != "" {
				return fmt.Errorf("config: plugin \"exec\" has no default_user; a task that names no user runs as %s", execdriver.DefaultUser)
			}
		default:
			return fmt.Errorf("config: plugin %q is unknown; the driver plugins are exec and raw_exec", p.Name)
		}
	}
	if err := execdriver.ValidateChrootEnv(c.Client.ChrootEnv); err != nil {
		return fmt.Errorf("config: client.%w", err)
	}
	for k := range c.Client.Options {
		if k != userDenylistOption {
			return fmt.Errorf("config: client.options %q is unknown; the only option is %q", k, userDenylistOption)
		}
	}
	for _, u := range c.userDenylist() {
		if !structs.ValidUserName(u) {
			return fmt.Errorf("config: client.options %q: %q is not a user name", userDenylistOption, u)
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

// userDenylistOption is the client option naming the accounts exec tasks
// may not run as, as in Nomad.
const userDenylistOption = "user.denylist"

// defaultUserDenylist is Nomad's: root, who would be root of the host's
// files bound into the task.
var defaultUserDenylist = []string{"root"}

// userDenylist is client.options "user.denylist", split at commas.
func (c *Config) userDenylist() []string {
	v, ok := c.Client.Options[userDenylistOption]
	if !ok {
		return defaultUserDenylist
	}
	var out []string
	for _, u := range strings.Split(v, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// execEnabled reports whether the exec driver is on: unless a plugin
// "exec" block sets enabled = false, the last such block winning.
func (c *Config) execEnabled() bool {
	on := true
	for _, p := range c.Plugins {
		if p.Name == "exec" && p.Config != nil && p.Config.Enabled != nil {
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
