//go:build e2e

package e2e

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// copyTree copies the regular files and directories under src to dst.
func copyTree(src, dst string) error {
	return filepath.Walk(src, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(target, info.Mode().Perm())
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, info.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}

// mustRefuseStart starts a and expects it to exit non-zero, with every
// one of needles in its log.
func mustRefuseStart(t *testing.T, a *Agent, needles ...string) string {
	t.Helper()
	must.NoError(t, a.Start())
	code, err := a.Wait(startTimeout)
	must.NoError(t, err, must.Sprintf("%s started on a damaged data dir:\n%s", a.Name, a.LogTail(30)))
	must.NotEq(t, 0, code, must.Sprintf("%s exited 0:\n%s", a.Name, a.LogTail(30)))
	log := a.LogTail(10)
	for _, n := range needles {
		must.StrContains(t, log, n)
	}
	var refusal string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "data dir refused") {
			refusal = l
		}
	}
	return refusal
}

// TestRecovery_DamagedDataDirRefused is issue 19's data dir acceptance
// test: a server whose Raft log was truncated, and a server given the data
// dir of another region's server, each exit non-zero saying what is wrong
// and what to do. The same data dir, undamaged, starts again after both a
// clean stop and a kill -9.
func TestRecovery_DamagedDataDirRefused(t *testing.T) {
	c := StartCluster(t, Opts{Servers: 1})
	srv := c.Servers[0]
	for i := range 20 {
		c.RunJob(serviceJob(fmt.Sprintf("j%d", i), 1, "", sleepScript))
	}

	// A kill -9 and a clean stop both leave a data dir the server takes.
	c.KillServer(0, syscall.SIGKILL)
	c.RestartServer(0)
	c.WaitForLeader(leaderTimeout)
	c.RunJob(serviceJob("after-kill", 1, "", sleepScript))
	must.EqOp(t, 0, c.KillServer(0, syscall.SIGTERM))

	backup := filepath.Join(c.Dir, "backup-data")
	must.NoError(t, copyTree(srv.DataDir, backup))

	// Cut the WAL segment's written part in half.
	segs, err := filepath.Glob(filepath.Join(srv.DataDir, "raft", "wal", "*.wal"))
	must.NoError(t, err)
	must.Len(t, 1, segs)
	b, err := os.ReadFile(segs[0])
	must.NoError(t, err)
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	must.NoError(t, os.Truncate(segs[0], int64(end/2)))
	line := mustRefuseStart(t, srv, "data dir refused", "raft log is truncated or damaged", "move "+srv.DataDir+" aside")
	t.Logf("truncated log: %s", line)

	// Undamaged again, it starts and has every job.
	must.NoError(t, os.RemoveAll(srv.DataDir))
	must.NoError(t, copyTree(backup, srv.DataDir))
	c.RestartServer(0)
	c.WaitForLeader(leaderTimeout)
	WaitFor(t, 10*time.Second, func() error {
		_, err := GetJob(c.API(), "after-kill")
		return err
	})

	// Another region's server started on this data dir refuses it.
	ports := FreePorts(t, 2)
	other := NewAgent(t, "other-region", filepath.Join(c.Dir, "other-region"), ports[0], ports[1])
	t.Cleanup(func() { stopAndReport(t, []*Agent{other}) })
	otherData := filepath.Join(other.Dir, "data")
	must.NoError(t, copyTree(backup, otherData))
	hcl := fmt.Sprintf(`name      = "other-region"
region    = "east"
data_dir  = %q
bind_addr = "127.0.0.1"
ports {
  http = %d
  rpc  = %d
}
server {
  enabled          = true
  bootstrap_expect = 1
}
`, otherData, ports[0], ports[1])
	cfg := filepath.Join(other.Dir, "agent.hcl")
	must.NoError(t, os.WriteFile(cfg, []byte(hcl), 0o644))
	other.Args = []string{"agent", "-config", cfg}
	line = mustRefuseStart(t, other, "data dir refused", `belongs to a server of region "global"`, `configured for region "east"`)
	t.Logf("other region: %s", line)
}

// TestRecovery_OtherClusterDataDirRefused: a server of a 3-server cluster
// started on the data dir of another cluster's server (same region) exits
// non-zero naming both clusters, the cluster never takes it in, and the
// server on its own data dir again rejoins.
func TestRecovery_OtherClusterDataDirRefused(t *testing.T) {
	other := StartCluster(t, Opts{Servers: 1})
	other.RunJob(serviceJob("other", 1, "", sleepScript))
	must.EqOp(t, 0, other.KillServer(0, syscall.SIGTERM))

	c := StartCluster(t, Opts{Servers: 3})
	leader := c.Leader()
	victim := (leader + 1) % 3
	v := c.Servers[victim]
	must.EqOp(t, 0, c.KillServer(victim, syscall.SIGTERM))
	own := filepath.Join(c.Dir, "own-data")
	must.NoError(t, os.Rename(v.DataDir, own))
	must.NoError(t, copyTree(other.Servers[0].DataDir, v.DataDir))

	line := mustRefuseStartLine(t, v, "belongs to another cluster", "Move "+v.DataDir+" aside")
	t.Logf("other cluster: %s", line)

	// The cluster kept its two servers and takes writes.
	c.RunJob(serviceJob("after", 1, "", sleepScript))
	var peers raftPeers
	must.NoError(t, GetJSON(c.ServerHTTP(leader), "/v1/operator/raft/configuration", &peers))
	must.Len(t, 3, peers.Servers, must.Sprint("the foreign server was added, or the stopped one removed"))

	// Back on its own data dir, the server rejoins.
	must.NoError(t, os.RemoveAll(v.DataDir))
	must.NoError(t, os.Rename(own, v.DataDir))
	c.RestartServer(victim)
	WaitFor(t, 30*time.Second, func() error {
		var j JobInfo
		return GetJSON(v.HTTPAddr(), "/v1/job/after?stale", &j)
	})
}

// mustRefuseStartLine is mustRefuseStart for a refusal that comes after
// the agent started (found while joining): it returns the log line that
// names it.
func mustRefuseStartLine(t *testing.T, a *Agent, needles ...string) string {
	t.Helper()
	must.NoError(t, a.Start())
	code, err := a.Wait(startTimeout)
	must.NoError(t, err, must.Sprintf("%s kept running on another cluster's data dir:\n%s", a.Name, a.LogTail(30)))
	must.NotEq(t, 0, code, must.Sprintf("%s exited 0:\n%s", a.Name, a.LogTail(30)))
	for _, l := range strings.Split(a.LogTail(40), "\n") {
		if strings.HasPrefix(l, "roam agent: ") {
			for _, n := range needles {
				must.StrContains(t, l, n)
			}
			return l
		}
	}
	t.Fatalf("no 'roam agent:' line in the log of %s:\n%s", a.Name, a.LogTail(40))
	return ""
}
