package exec

import (
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/client/driver/rawexec"
)

// The task is pid 1 of its own pid namespace and its /proc shows nothing
// else of the host.
func TestExec_SeesOnlyItsOwnProcesses(t *testing.T) {
	t.Parallel()
	d := testDriver(t, nil)
	// "; true" keeps the shell from exec'ing ps in its place.
	res, out, errOut := run(t, d, TaskConfig{}, "ps -e -o pid=,comm=; true")
	must.True(t, res.Successful(), must.Sprintf("result %+v, stderr %s", res, errOut))
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	// exec-init's threads took pids before it became sh; they are gone.
	must.SliceLen(t, 2, lines, must.Sprint(out))
	must.Eq(t, "1 sh", lines[0])
	must.StrHasSuffix(t, " ps", lines[1])
}

// The host is visible read-only through chroot_env only, the task's own
// dirs are writable, and nothing else of the host is reachable.
func TestExec_FileSystemIsConfined(t *testing.T) {
	t.Parallel()
	d := testDriver(t, nil)
	other := t.TempDir() // stands in for another allocation's directory
	must.NoError(t, os.Chmod(other, 0o777))
	must.NoError(t, os.WriteFile(filepath.Join(other, "theirs"), []byte("x"), 0o666))
	script := `
try() { if "$@" 2>/dev/null; then echo ok; else echo refused; fi; }
echo "etc=$(try touch /etc/roam-exec-test)"
echo "usr=$(try touch /usr/roam-exec-test)"
echo "other=$(try touch ` + other + `/theirs)"
echo "local=$(try touch /local/mine)"
echo "alloc=$(try touch /alloc/shared)"
echo "secrets=$(try touch /secrets/s)"
echo "tmp=$(try touch /tmp/t)"
echo "rawexec=$(try touch /.rawexec/x)"
echo "secretsmode=$(stat -c %a /secrets)"
`
	res, out, errOut := run(t, d, TaskConfig{}, script)
	must.True(t, res.Successful(), must.Sprintf("result %+v, stderr %s", res, errOut))
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(l, "=")
		got[k] = v
	}
	must.Eq(t, map[string]string{
		"etc": "refused", "usr": "refused", "other": "refused", "rawexec": "refused",
		"local": "ok", "alloc": "ok", "secrets": "ok", "tmp": "ok", "secretsmode": "700",
	}, got)
	for _, p := range []string{"/etc/roam-exec-test", "/usr/roam-exec-test"} {
		_, err := os.Stat(p)
		must.True(t, errors.Is(err, os.ErrNotExist), must.Sprintf("%s was created on the host", p))
	}
	b, err := os.ReadFile(filepath.Join(other, "theirs"))
	must.NoError(t, err)
	must.Eq(t, "x", string(b))
}

// A task runs as nobody by default, with no capabilities and no way to
// gain privileges through exec.
func TestExec_RunsAsNobodyWithoutCapabilities(t *testing.T) {
	t.Parallel()
	d := testDriver(t, nil)
	res, out, errOut := run(t, d, TaskConfig{}, `id -u; id -g; id -G; grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs):' /proc/self/status`)
	must.True(t, res.Successful(), must.Sprintf("result %+v, stderr %s", res, errOut))
	uid, gid, err := rawexec.LookupUser("nobody")
	must.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	must.SliceLen(t, 7, lines, must.Sprint(out))
	must.Eq(t, strconv.Itoa(int(uid)), lines[0])
	must.Eq(t, strconv.Itoa(int(gid)), lines[1])
	must.Eq(t, strconv.Itoa(int(gid)), lines[2], must.Sprint("no supplementary groups"))
	status := map[string]string{}
	for _, l := range lines[3:] {
		k, v, _ := strings.Cut(l, ":")
		status[k] = strings.TrimSpace(v)
	}
	must.Eq(t, "0000000000000000", status["CapEff"])
	must.Eq(t, "0000000000000000", status["CapPrm"])
	must.Eq(t, "1", status["NoNewPrivs"])
	bnd, err := strconv.ParseUint(status["CapBnd"], 16, 64)
	must.NoError(t, err)
	var allowed uint64
	for _, c := range defaultCaps {
		allowed |= 1 << c
	}
	must.Eq(t, uint64(0), bnd&^allowed, must.Sprintf("bounding set %x holds capabilities beyond Nomad's default set", bnd))
}

// A user on the client's denylist is refused before anything runs.
func TestExec_DeniedUserIsRefused(t *testing.T) {
	t.Parallel()
	d := testDriver(t, func(c *Config) { c.UserDenylist = []string{"root"} })
	cfg := TaskConfig{User: "root", Command: "/bin/true"}
	taskLayout(t, &cfg)
	_, err := d.Start(testCtx(t), cfg)
	must.ErrorIs(t, err, ErrDeniedUser)
	_, statErr := os.Stat(filepath.Join(cfg.Dir, ".rawexec"))
	must.True(t, errors.Is(statErr, os.ErrNotExist), must.Sprint("a refused task left executor files"))
}

// A command that is not there fails at Start, found through chroot_env as
// the task would look for it.
func TestExec_MissingCommandFailsAtStart(t *testing.T) {
	t.Parallel()
	d := testDriver(t, nil)
	for _, c := range []string{"/usr/bin/roam-no-such-command", "roam-no-such-command", "/local/nothing"} {
		cfg := TaskConfig{Command: c}
		taskLayout(t, &cfg)
		_, err := d.Start(testCtx(t), cfg)
		must.ErrorIs(t, err, rawexec.ErrCommandNotFound, must.Sprint(c))
	}
}

// A symlink the task left where a mount goes is refused, not followed.
func TestExec_SymlinkInTaskDirIsNotFollowed(t *testing.T) {
	t.Parallel()
	d := testDriver(t, nil)
	victim := t.TempDir()
	cfg := TaskConfig{Command: "/bin/true"}
	taskLayout(t, &cfg)
	must.NoError(t, os.Symlink(victim, filepath.Join(cfg.Dir, "secrets")))
	_, err := d.Start(testCtx(t), cfg)
	must.ErrorContains(t, err, "symlink is in the way")
	entries, err := os.ReadDir(victim)
	must.NoError(t, err)
	must.SliceEmpty(t, entries)
}

// A memory hog is killed by the kernel at its limit, and the result says
// so.
func TestExec_MemoryHogIsOOMKilled(t *testing.T) {
	t.Parallel()
	d := testDriver(t, nil)
	// tail keeps the whole "line" of /dev/zero, which never ends.
	res, _, errOut := run(t, d, TaskConfig{Resources: Resources{MemoryMB: 16}}, "tail /dev/zero")
	must.True(t, res.OOMKilled, must.Sprintf("result %+v, stderr %s", res, errOut))
	must.Eq(t, int64(16<<20), res.MemoryLimit)
	must.False(t, res.Successful())
}

// A fork bomb stops at the pids limit, the host keeps working, and a kill
// leaves nothing behind.
func TestExec_ForkBombStopsAtPidsLimit(t *testing.T) {
	t.Parallel()
	d := testDriver(t, nil)
	const limit = 48
	h, cfg := startTask(t, d, TaskConfig{
		Command: "/bin/sh",
		// The shell is pid 1 and must not fork once the bomb runs: a
		// failed fork would end it, and its namespace with it.
		Args:      []string{"-c", "bomb() { bomb | bomb & }; bomb; exec sleep 300"},
		Resources: Resources{MemoryMB: 256, PidsLimit: limit},
	})
	cg := taskCgroup(t, d, cfg.ID)
	waitFor(t, "the bomb to reach the limit", func() bool {
		st, err := cg.GetStats()
		return err == nil && st.PidsStats.Current >= limit-2
	})
	st, err := cg.GetStats()
	must.NoError(t, err)
	must.LessEq(t, uint64(limit), st.PidsStats.Current)
	must.Eq(t, uint64(limit), st.PidsStats.Limit)
	// The host still forks at will.
	start := time.Now()
	for i := 0; i < 20; i++ {
		must.NoError(t, osexecRun("/bin/true"))
	}
	t.Logf("20 host forks took %s beside the bomb", time.Since(start))
	pids, err := cgroups.GetAllPids(pidsDir(cg))
	must.NoError(t, err)
	must.NoError(t, h.Kill(testCtx(t), "SIGKILL", time.Second))
	_, err = h.Wait(testCtx(t))
	must.NoError(t, err)
	for _, pid := range pids {
		waitFor(t, "process "+strconv.Itoa(pid)+" to be gone", func() bool { return processGone(pid) })
	}
	waitFor(t, "the cgroup to be removed", func() bool { return !cgroupExists(cg) })
}

// exec-init run outside a new pid namespace refuses before it reads a
// config or mounts anything.
func TestExec_InitRefusesOutsideItsNamespace(t *testing.T) {
	t.Parallel()
	cmd := osexec.Command(os.Args[0], "exec-init")
	cmd.Env = append(os.Environ(), initEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *osexec.ExitError
	must.True(t, errors.As(err, &exit), must.Sprintf("exec-init: %v, output %s", err, out))
	must.Eq(t, 1, exit.ExitCode())
	must.StrContains(t, string(out), "not pid 1 of a new pid namespace")
}
