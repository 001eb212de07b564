//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// upgradeFromCommit is the earlier build a rolling upgrade starts from:
// the last commit before the version gate (docs/upgrades.md), which
// reports build 0.1.0 and so counts as a server that may send controller
// calls without a lane term.
const upgradeFromCommit = "448d725a9195911097a8d4851aecc4a480e42928"

// buildAt builds the roam binary of commit, from this repository's own
// history (git archive, so the work tree is not touched).
func buildAt(t *testing.T, commit string) string {
	t.Helper()
	root, err := filepath.Abs("..")
	must.NoError(t, err)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	must.NoError(t, os.MkdirAll(src, 0o755))
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", commit)
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	must.NoError(t, err)
	untar.Stdin = pipe
	var stderr bytes.Buffer
	archive.Stderr = &stderr
	must.NoError(t, untar.Start())
	must.NoError(t, archive.Run(), must.Sprintf("git archive %s (a shallow clone lacks it): %s", commit, stderr.String()))
	must.NoError(t, untar.Wait())

	bin := filepath.Join(dir, "roam-"+commit[:7])
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	build := exec.Command(gobin, "build", "-o", bin, ".")
	build.Dir = src
	out, err := build.CombinedOutput()
	must.NoError(t, err, must.Sprintf("go build at %s: %s", commit, out))
	return bin
}

// serverBuilds is each server's build as the members list of the agent
// at base reports it, by name.
func serverBuilds(base string) (map[string]string, error) {
	m, err := Members(base)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(m.Members))
	for _, mem := range m.Members {
		if mem.Status != "alive" {
			return nil, fmt.Errorf("server %s is %s", mem.Name, mem.Status)
		}
		out[mem.Name] = mem.Tags["build"]
	}
	return out, nil
}

// TestUpgrade_Rolling starts 3 servers and 3 clients on the build of
// upgradeFromCommit, runs claim churn, and replaces the servers one at a
// time (followers first, the leader last), then the clients, with the
// binary under test, each stopped with SIGTERM and started again on its
// data dir. The churn's checker must then count 0 overlaps, 0 lost
// acknowledged claims and 0 two-writer violations.
func TestUpgrade_Rolling(t *testing.T) {
	old := buildAt(t, upgradeFromCommit)
	cc := startCSICluster(t, csiOpts{Servers: 3, Clients: 3, PublishLatency: 200 * time.Millisecond, OwnAddrs: true,
		StopOnClientAfter: partitionStopAfter, ServerConfigExtra: partitionServerTimers,
		PluginGroupExtra: pluginRestartAlways, Binary: old})
	ch := newClaimChurn(t, cc, churnWorkers)
	t.Cleanup(ch.halt)
	ch.start(time.Now().UnixNano() % 1e6)

	allOn := func(version string) {
		WaitFor(t, leaderTimeout, func() error {
			builds, err := serverBuilds(cc.ServerHTTP(0))
			if err != nil {
				return err
			}
			if len(builds) != len(cc.Servers) {
				return fmt.Errorf("server-0 knows %d of %d servers: %v", len(builds), len(cc.Servers), builds)
			}
			for name, b := range builds {
				if b != version {
					return fmt.Errorf("server %s reports build %q, want %q", name, b, version)
				}
			}
			return nil
		})
	}
	allOn("0.1.0")
	cycledBy := ch.waitCycled
	cycledBy("on the old build", 3)

	leader := cc.WaitForLeader(leaderTimeout)
	order := []int{}
	for i := range cc.Servers {
		if i != leader {
			order = append(order, i)
		}
	}
	order = append(order, leader)
	for step, i := range order {
		a := cc.Servers[i]
		code, killed, err := a.Stop(time.Minute)
		must.NoError(t, err)
		must.False(t, killed, must.Sprintf("%s needed SIGKILL", a.Name))
		t.Logf("upgrade %d: %s stopped (exit %d)", step+1, a.Name, code)
		a.Bin = ""
		cc.RestartServer(i)
		WaitFor(t, leaderTimeout, func() error {
			builds, err := serverBuilds(a.HTTPAddr())
			if err != nil {
				return err
			}
			if len(builds) != len(cc.Servers) || builds[a.Name] != structs.Version {
				return fmt.Errorf("%s sees %v", a.Name, builds)
			}
			_, err = cc.LeaderNow()
			return err
		})
		cycledBy(fmt.Sprintf("after %s's upgrade", a.Name), 2)
	}
	allOn(structs.Version)

	for j, a := range cc.Clients {
		code, killed, err := a.Stop(time.Minute)
		must.NoError(t, err)
		must.False(t, killed, must.Sprintf("%s needed SIGKILL", a.Name))
		t.Logf("upgrade of %s: stopped (exit %d)", a.Name, code)
		a.Bin = ""
		cc.RestartClient(j)
		// The upgraded client hears from the leader that every server
		// sends lane terms, and enforces them (docs/upgrades.md).
		WaitFor(t, leaderTimeout, func() error {
			log := a.Log()
			log = log[strings.LastIndex(log, "==== e2e: start #"):]
			if !strings.Contains(log, "min_server_version="+structs.Version) || !strings.Contains(log, "lane_term_required=true") {
				return fmt.Errorf("%s has not logged that every server runs %s", a.Name, structs.Version)
			}
			return nil
		})
		cycledBy(fmt.Sprintf("after %s's upgrade", a.Name), 2)
	}
	cycledBy("on the new build", 3)

	ch.halt()
	rep := ch.check(t, "rolling upgrade", time.Now(), nil, nil, nil)
	t.Logf("rolling upgrade from %s to %s: %s; claims cycled=%d", upgradeFromCommit[:7], structs.Version, rep, rep.Cycles)
}
