package agent

import (
	"testing"

	"github.com/shoenig/test/must"
)

// An agent binds loopback unless told otherwise, and one that is told to
// bind a routable address without TLS refuses unless insecure_bind says
// the operator accepts that.
func TestConfig_BindDefaultsAndInsecureBind(t *testing.T) {
	must.Eq(t, "127.0.0.1", DefaultConfig().BindAddr)

	parse := func(src string) *Config {
		t.Helper()
		c, err := ParseConfig("agent.hcl", []byte(src))
		must.NoError(t, err)
		return DefaultConfig().Merge(c)
	}
	base := `data_dir = "/tmp/roam-test"
server {
  enabled          = true
  bootstrap_expect = 1
}
`
	must.NoError(t, parse(base).Validate())

	err := parse(base + `bind_addr = "0.0.0.0"`).Validate()
	must.ErrorContains(t, err, `bind_addr = "0.0.0.0" is not a loopback address and TLS is not configured`)
	must.ErrorContains(t, err, "insecure_bind = true")
	must.ErrorContains(t, parse(base+`bind_addr = "10.1.2.3"`).Validate(), "insecure_bind")

	// TLS on one port only is named as such, not as no TLS at all.
	rpcOnly := "tls {\n  rpc = true\n  ca_file = \"ca.pem\"\n  cert_file = \"c.pem\"\n  key_file = \"k.pem\"\n}\n"
	must.ErrorContains(t, parse(base+rpcOnly+`bind_addr = "0.0.0.0"`).Validate(),
		`bind_addr = "0.0.0.0" is not a loopback address and TLS is not on for both ports (tls.rpc = true, tls.http = false)`)

	must.NoError(t, parse(base+"bind_addr = \"0.0.0.0\"\ninsecure_bind = true\n").Validate())
	must.NoError(t, parse(base+`bind_addr = "::1"`).Validate())
}

// raw_exec is off unless the client config (or -dev) turns it on.
func TestConfig_RawExecOffByDefault(t *testing.T) {
	must.False(t, DefaultConfig().rawExecEnabled())
	must.True(t, DevConfig().rawExecEnabled())

	c, err := ParseConfig("agent.hcl", []byte(`
plugin "raw_exec" {
  config {
    enabled = true
  }
}
`))
	must.NoError(t, err)
	must.True(t, DefaultConfig().Merge(c).rawExecEnabled())

	off, err := ParseConfig("off.hcl", []byte(`
plugin "raw_exec" {
  config {
    enabled = false
  }
}
`))
	must.NoError(t, err)
	must.False(t, DevConfig().Merge(off).rawExecEnabled(), must.Sprint("a later file that turns raw_exec off wins"))

	bad, err := ParseConfig("bad.hcl", []byte(`
plugin "docker" {
  config {
    enabled = true
  }
}
`))
	must.NoError(t, err)
	must.ErrorContains(t, DevConfig().Merge(bad).Validate(), `plugin "docker" is unknown`)
}

// The trust settings reach the server's and the client's configurations.
func TestConfig_TrustSettingsReachServerAndClient(t *testing.T) {
	a := newTestAgent(t, func(c *Config) {
		c.Server.OperatorToken = "op-token"
		c.Server.ClientIntroTokens = []string{"intro-a", "intro-b"}
		c.Client.IntroToken = "intro-a"
	})
	must.Eq(t, "op-token", a.Server().Config().OperatorToken)
	must.Eq(t, []string{"intro-a", "intro-b"}, a.Server().Config().ClientIntroTokens)
	cc, err := a.clientConfig("127.0.0.1:1")
	must.NoError(t, err)
	must.Eq(t, "intro-a", cc.IntroToken)
	must.False(t, cc.DisableRawExec, must.Sprint("-dev enables raw_exec"))
}

// default_user reaches the client; a block that sets only it leaves
// enabled as an earlier block set it; a bad name is refused.
func TestConfig_RawExecDefaultUser(t *testing.T) {
	c, err := ParseConfig("agent.hcl", []byte(`
plugin "raw_exec" {
  config {
    default_user = "nobody"
  }
}
`))
	must.NoError(t, err)
	merged := DevConfig().Merge(c)
	must.True(t, merged.rawExecEnabled(), must.Sprint("a block without enabled leaves -dev's"))
	must.Eq(t, "nobody", merged.rawExecDefaultUser())
	must.NoError(t, merged.Validate())

	bad, err := ParseConfig("bad.hcl", []byte(`
plugin "raw_exec" {
  config {
    default_user = "../root"
  }
}
`))
	must.NoError(t, err)
	must.ErrorContains(t, DevConfig().Merge(bad).Validate(), `default_user = "../root" is not a user name`)

	a := newTestAgent(t, func(c *Config) {
		c.Plugins = append(c.Plugins, &PluginConfig{Name: "raw_exec", Config: &PluginConfigValues{DefaultUser: "nobody"}})
	})
	cc, err := a.clientConfig("127.0.0.1:1")
	must.NoError(t, err)
	must.Eq(t, "nobody", cc.RawExecDefaultUser)
	must.False(t, cc.DisableRawExec)
}

// The exec driver's settings: on unless a plugin block turns it off,
// chroot_env replaced as a whole by a later file, the user.denylist
// option root by default; bad values are refused with what is wrong.
func TestConfig_ExecDriver(t *testing.T) {
	c, err := ParseConfig("agent.hcl", []byte(`
client {
  chroot_env = { "/bin" = "/bin", "/usr/lib" = "/lib" }
  options = { "user.denylist" = "root, ubuntu" }
}
plugin "exec" {
  config {
    enabled = false
  }
}
`))
	must.NoError(t, err)
	merged := DevConfig().Merge(c)
	must.NoError(t, merged.Validate())
	must.False(t, merged.execEnabled())
	must.Eq(t, []string{"root", "ubuntu"}, merged.userDenylist())
	must.Eq(t, map[string]string{"/bin": "/bin", "/usr/lib": "/lib"}, merged.Client.ChrootEnv)
	later, err := ParseConfig("later.hcl", []byte(`client { chroot_env = { "/opt" = "/opt" } }`))
	must.NoError(t, err)
	must.Eq(t, map[string]string{"/opt": "/opt"}, merged.Merge(later).Client.ChrootEnv)

	dev := DevConfig()
	must.True(t, dev.execEnabled())
	must.Eq(t, []string{"root"}, dev.userDenylist())

	for _, tc := range []struct{ hcl, want string }{
		{`client { chroot_env = { "bin" = "/bin" } }`, `chroot_env: host path "bin" is not absolute`},
		{`client { chroot_env = { "/bin" = "/" } }`, `chroot_env "/bin": "/" is not a path inside the task`},
		{`client { options = { "driver.allowlist" = "exec" } }`, `client.options "driver.allowlist" is unknown`},
		{`client { options = { "user.denylist" = "root,../x" } }`, `"../x" is not a user name`},
		{`plugin "docker" {}`, `plugin "docker" is unknown; the driver plugins are exec and raw_exec`},
		{"plugin \"exec\" {\n config {\n default_user = \"bob\"\n }\n}", `plugin "exec" has no default_user`},
	} {
		bad, err := ParseConfig("bad.hcl", []byte(tc.hcl))
		must.NoError(t, err, must.Sprint(tc.hcl))
		must.ErrorContains(t, DevConfig().Merge(bad).Validate(), tc.want, must.Sprint(tc.hcl))
	}

	a := newTestAgent(t, func(c *Config) {
		c.Plugins = append(c.Plugins, &PluginConfig{Name: "exec", Config: &PluginConfigValues{Enabled: new(bool)}})
		c.Client.Options = map[string]string{"user.denylist": "ubuntu"}
	})
	cc, err := a.clientConfig("127.0.0.1:1")
	must.NoError(t, err)
	must.True(t, cc.DisableExec)
	must.Eq(t, []string{"ubuntu"}, cc.UserDenylist)
}
