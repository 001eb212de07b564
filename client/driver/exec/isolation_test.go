package exec

import (
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

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

// Two CPU hogs pinned to one core split it by their cpu shares: the one
// asking for 100 MHz gets about a tenth beside one asking for 900.
func TestExec_CPUSharesUnderContention(t *testing.T) {
	t.Parallel()
	d := testDriver(t, nil)
	hog := func(name string, cpu int) cgroups.Manager {
		_, cfg := startTask(t, d, TaskConfig{
			ID:        "a1b2c3/" + name,
			Command:   "/usr/bin/taskset",
			Args:      []string{"-c", "0", "/bin/sh", "-c", "while :; do :; done"},
			Resources: Resources{CPU: cpu, MemoryMB: 32},
		})
		return taskCgroup(t, d, cfg.ID)
	}
	small, big := hog("cpu-small", 100), hog("cpu-big", 900)
	usage := func(m cgroups.Manager) uint64 {
		st, err := m.GetStats()
		must.NoError(t, err)
		return st.CpuStats.CpuUsage.TotalUsage
	}
	// Both must be burning before the window opens.
	waitFor(t, "both hogs to run", func() bool { return usage(small) > 0 && usage(big) > 0 })
	s0, b0 := usage(small), usage(big)
	var ds, db uint64
	// A loaded machine gives the pair only part of the core: wait for the
	// CPU time, not for a wall-clock span.
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool {
			ds, db = usage(small)-s0, usage(big)-b0
			return ds+db >= 1e9
		}),
		wait.Timeout(90*time.Second),
		wait.Gap(50*time.Millisecond),
	), must.Sprint("waiting for a CPU-second between the hogs"))
	share := float64(ds) / float64(ds+db)
	t.Logf("cpu=100 got %.1f%% of core 0 beside cpu=900 (%.2fs vs %.2fs)", 100*share, float64(ds)/1e9, float64(db)/1e9)
	must.Less(t, 0.25, share, must.Sprint("the small task took more than its share"))
	must.Greater(t, 0.02, share, must.Sprint("the small task was starved"))
}

// A client restarted while an exec task runs re-attaches to it: the same
// process, in the same cgroup, under the same limits; stopping it through
// the new handle leaves nothing behind.
func TestExec_ReattachKeepsTheTaskAndItsLimits(t *testing.T) {
	t.Parallel()
	d := testDriver(t, nil)
	h, cfg := startTask(t, d, TaskConfig{
		Command:   "/bin/sh",
		Args:      []string{"-c", "sleep 300 & exec sleep 300"},
		Resources: Resources{MemoryMB: 48, PidsLimit: 64},
	})
	cg := taskCgroup(t, d, cfg.ID)
	waitFor(t, "both processes in the cgroup", func() bool {
		pids, err := cgroups.GetAllPids(pidsDir(cg))
		return err == nil && len(pids) == 2
	})
	before, err := cgroups.GetAllPids(pidsDir(cg))
	must.NoError(t, err)

	// A new client process: a new driver, from the persisted state only.
	again := testDriver(t, nil)
	h2, err := again.Reattach(h.State())
	must.NoError(t, err)
	must.True(t, h2.IsRunning())
	must.Eq(t, h.State().TaskPID, h2.State().TaskPID)
	after, err := cgroups.GetAllPids(pidsDir(cg))
	must.NoError(t, err)
	must.SliceContainsAll(t, before, after, must.Sprint("nothing started twice, nothing lost"))
	st, err := cg.GetStats()
	must.NoError(t, err)
	must.Eq(t, uint64(48<<20), st.MemoryStats.Usage.Limit)
	must.Eq(t, uint64(64), st.PidsStats.Limit)

	must.NoError(t, h2.Kill(testCtx(t), "SIGKILL", time.Second))
	res, err := h2.Wait(testCtx(t))
	must.NoError(t, err)
	must.Eq(t, int(syscall.SIGKILL), res.Signal)
	for _, pid := range before {
		waitFor(t, "process "+strconv.Itoa(pid)+" to be gone", func() bool { return processGone(pid) })
	}
	waitFor(t, "the cgroup to be removed", func() bool { return !cgroupExists(cg) })
}

// An executor killed with -9 leaves its task without a supervisor; the
// next client's re-attach kills every process of the task and removes its
// cgroup, and reports the task gone.
func TestExec_ExecutorKilledLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	d := testDriver(t, nil)
	h, cfg := startTask(t, d, TaskConfig{
		Command: "/bin/sh",
		Args:    []string{"-c", "sleep 300 & sleep 300 & wait"},
	})
	cg := taskCgroup(t, d, cfg.ID)
	waitFor(t, "the task's three processes", func() bool {
		pids, err := cgroups.GetAllPids(pidsDir(cg))
		return err == nil && len(pids) == 3
	})
	pids, err := cgroups.GetAllPids(pidsDir(cg))
	must.NoError(t, err)
	state := h.State()
	must.NoError(t, syscall.Kill(state.ExecutorPID, syscall.SIGKILL))
	// This test process started the executor: reap it, as init would once
	// the client that started it is gone.
	waitFor(t, "the executor to be gone", func() bool {
		h.IsRunning()
		return processGone(state.ExecutorPID)
	})
	for _, pid := range pids {
		must.False(t, processGone(pid), must.Sprintf("process %d died with its executor", pid))
	}

	_, err = testDriver(t, nil).Reattach(state)
	must.ErrorIs(t, err, rawexec.ErrTaskGone)
	must.ErrorContains(t, err, "its executor is gone")
	for _, pid := range pids {
		waitFor(t, "process "+strconv.Itoa(pid)+" to be gone", func() bool { return processGone(pid) })
	}
	must.False(t, cgroupExists(cg), must.Sprint("the cgroup is left"))
}

// A chroot_env entry may be a single file: it is bound read-only at its
// place, beside the directories.
func TestExec_ChrootEnvFile(t *testing.T) {
	t.Parallel()
	host := filepath.Join(t.TempDir(), "motd")
	must.NoError(t, os.WriteFile(host, []byte("from the host\n"), 0o644))
	d := testDriver(t, func(c *Config) {
		c.ChrootEnv = DefaultChrootEnv()
		c.ChrootEnv[host] = "/opt/motd"
	})
	res, out, errOut := run(t, d, TaskConfig{}, `cat /opt/motd; if echo x > /opt/motd 2>/dev/null; then echo writable; fi`)
	must.True(t, res.Successful(), must.Sprintf("result %+v, stderr %s", res, errOut))
	must.Eq(t, "from the host\n", out)
}

// A task run as root cannot leave its root: the host's is detached from
// its mount namespace, so the classic chroot escape finds nothing, and a
// device node it makes in a writable place does not work.
func TestExec_RootTaskCannotEscape(t *testing.T) {
	t.Parallel()
	secret := filepath.Join(t.TempDir(), "host-secret")
	must.NoError(t, os.WriteFile(secret, []byte("HOST SECRET\n"), 0o600))
	d := testDriver(t, nil)
	script := `
perl -e 'mkdir "/tmp/x"; chroot "/tmp/x"; chdir ".." for 1..64; chroot "."; open(F, "<", "` + secret + `") or exit 3; print <F>'
echo "escape=$?"
for where in /local /alloc /tmp; do
  if mknod $where/null c 1 3 2>/dev/null && echo x > $where/null 2>/dev/null; then echo "dev $where=works"; else echo "dev $where=refused"; fi
done
if mknod /dev/mine c 1 3 2>/dev/null; then echo "mknod /dev=works"; else echo "mknod /dev=refused"; fi
echo probe > /dev/null && echo "null=ok"
`
	res, out, errOut := run(t, d, TaskConfig{User: "root"}, script)
	must.True(t, res.Successful(), must.Sprintf("result %+v, stderr %s", res, errOut))
	must.StrNotContains(t, out, "HOST SECRET")
	must.StrContains(t, out, "escape=3\n")
	for _, line := range []string{"dev /local=refused", "dev /alloc=refused", "dev /tmp=refused", "mknod /dev=refused", "null=ok"} {
		must.StrContains(t, out, line+"\n")
	}
}

// A bind brings the source's own submounts along; those get the same
// restrictions: read-only where the bind is, nosuid and nodev everywhere.
func TestExec_SubmountsAreRestrictedToo(t *testing.T) {
	t.Parallel()
	host := t.TempDir()
	vol, rovol, ce := filepath.Join(host, "vol"), filepath.Join(host, "rovol"), filepath.Join(host, "ce")
	for _, dir := range []string{vol, rovol, ce} {
		sub := filepath.Join(dir, "sub")
		must.NoError(t, os.MkdirAll(sub, 0o777))
		must.NoError(t, syscall.Mount("tmpfs", sub, "tmpfs", 0, "mode=0777,size=1m"))
		t.Cleanup(func() { _ = syscall.Unmount(sub, syscall.MNT_DETACH) })
	}
	d := testDriver(t, func(c *Config) {
		c.ChrootEnv = DefaultChrootEnv()
		c.ChrootEnv[ce] = "/ce"
	})
	script := `
try() { if "$@" 2>/dev/null; then echo ok; else echo refused; fi; }
echo "rovol_sub=$(try touch /rovol/sub/x)"
echo "ce_sub=$(try touch /ce/sub/x)"
echo "vol_sub=$(try touch /vol/sub/x)"
for where in /vol/sub /rovol/sub /ce/sub; do
  if mknod $where/null c 1 3 2>/dev/null && echo x > $where/null 2>/dev/null; then echo "dev $where=works"; else echo "dev $where=refused"; fi
done
`
	res, out, errOut := run(t, d, TaskConfig{User: "root", Volumes: []VolumeMount{
		{Source: vol, Destination: "vol"}, {Source: rovol, Destination: "rovol", ReadOnly: true},
	}}, script)
	must.True(t, res.Successful(), must.Sprintf("result %+v, stderr %s", res, errOut))
	for _, line := range []string{"rovol_sub=refused", "ce_sub=refused", "vol_sub=ok",
		"dev /vol/sub=refused", "dev /rovol/sub=refused", "dev /ce/sub=refused"} {
		must.StrContains(t, out, line+"\n")
	}
}
