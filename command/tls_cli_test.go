package command

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/command/agent"
)

// TestCLI_TLSFromNothing makes a CA and certificates with `roam tls`,
// starts an agent on them with mutual TLS everywhere, and talks to it
// with the CLI's TLS flags.
func TestCLI_TLSFromNothing(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for _, args := range [][]string{
		{"tls", "ca", "create"},
		{"tls", "cert", "create", "-server"},
		{"tls", "cert", "create", "-client"},
		{"tls", "cert", "create", "-cli"},
	} {
		code, _, errOut := run(args...)
		must.EqOp(t, 0, code, must.Sprint(errOut))
	}
	// A second run refuses to overwrite.
	code, _, errOut := run("tls", "cert", "create", "-server")
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "global-server-roam.pem already exists")

	a := startAgent(t, func(c *agent.Config) {
		c.Name = "tls-cli"
		c.TLS = &agent.TLSConfig{
			HTTP: true, RPC: true,
			CAFile:               filepath.Join(dir, "roam-agent-ca.pem"),
			CertFile:             filepath.Join(dir, "global-server-roam.pem"),
			KeyFile:              filepath.Join(dir, "global-server-roam-key.pem"),
			VerifyServerHostname: true, VerifyHTTPSClient: true,
		}
	})
	addr := "https://" + a.HTTPAddr()
	tlsArgs := []string{"-address", addr, "-ca-cert", "roam-agent-ca.pem",
		"-client-cert", "global-cli-roam.pem", "-client-key", "global-cli-roam-key.pem"}

	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			code, out, errOut := run(append([]string{"node", "status"}, tlsArgs...)...)
			if code != 0 || !strings.Contains(out, "ready") {
				return fmt.Errorf("node status: code %d: %s%s", code, out, errOut)
			}
			return nil
		}),
		wait.Timeout(30*time.Second),
		wait.Gap(50*time.Millisecond),
	))
	code, out, errOut := run(append([]string{"server", "members"}, tlsArgs...)...)
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.StrContains(t, strings.Join(lines(out), "\n"), "alive true")

	// The same through the environment.
	t.Setenv("ROAM_ADDR", addr)
	t.Setenv("ROAM_CACERT", "roam-agent-ca.pem")
	t.Setenv("ROAM_CLIENT_CERT", "global-cli-roam.pem")
	t.Setenv("ROAM_CLIENT_KEY", "global-cli-roam-key.pem")
	code, out, errOut = run("server", "members")
	must.EqOp(t, 0, code, must.Sprint(errOut))
	must.StrContains(t, strings.Join(lines(out), "\n"), "alive true")

	// Without the client certificate the agent refuses, and says so.
	t.Setenv("ROAM_CLIENT_CERT", "")
	t.Setenv("ROAM_CLIENT_KEY", "")
	code, _, errOut = run("server", "members")
	must.EqOp(t, 1, code)
	must.StrContains(t, errOut, "certificate required")
}
