package rawexec

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

func TestStart_ExitCodes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		script string
		code   int
	}{
		{"zero", "exit 0", 0},
		{"nonzero", "exit 3", 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := startTask(t, testDriver(t), TaskConfig{Command: "/bin/sh", Args: []string{"-c", tc.script}})
			res, err := h.Wait(testCtx(t))
			must.NoError(t, err)
			must.Eq(t, tc.code, res.ExitCode)
			must.Eq(t, 0, res.Signal)
			must.Eq(t, "", res.Err)
			must.Eq(t, tc.code == 0, res.Successful())
			must.False(t, h.IsRunning())
			_, err = readProcStat(h.State().ExecutorPID)
			must.ErrorIs(t, err, fs.ErrNotExist, must.Sprint("the executor was reaped, not left a zombie"))
		})
	}
}

func TestStart_OutputAndEnv(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := TaskConfig{
		Command:    "sh", // found in PATH
		Args:       []string{"-c", `echo "out $GREETING"; echo "err $GREETING" >&2; pwd`},
		Env:        map[string]string{"GREETING": "hello world"},
		Dir:        filepath.Join(dir, "task"),
		StdoutPath: filepath.Join(dir, "logs.stdout"),
	}
	h := startTask(t, testDriver(t), cfg)
	res, err := h.Wait(testCtx(t))
	must.NoError(t, err)
	must.True(t, res.Successful())

	out, err := os.ReadFile(cfg.StdoutPath)
	must.NoError(t, err)
	must.Eq(t, "out hello world\n"+cfg.Dir+"\n", string(out))
	// StderrPath was left empty: the default lands in the task dir.
	errOut, err := os.ReadFile(filepath.Join(cfg.Dir, "stderr.log"))
	must.NoError(t, err)
	must.Eq(t, "err hello world\n", string(errOut))
}

func TestStart_OutputIsAppended(t *testing.T) {
	t.Parallel()
	d := testDriver(t)
	cfg := TaskConfig{Command: "/bin/sh", Args: []string{"-c", "echo run"}, Dir: filepath.Join(t.TempDir(), "task")}
	for range 2 {
		h := startTask(t, d, cfg)
		_, err := h.Wait(testCtx(t))
		must.NoError(t, err)
	}
	out, err := os.ReadFile(filepath.Join(cfg.Dir, "stdout.log"))
	must.NoError(t, err)
	must.Eq(t, "run\nrun\n", string(out))
}

func TestStart_BadCommandFailsBeforeSpawning(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notExec := filepath.Join(dir, "data.txt")
	must.NoError(t, os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644))

	cases := []struct {
		name    string
		command string
		want    error
	}{
		{"absent", filepath.Join(dir, "no-such-binary"), ErrCommandNotFound},
		{"not in PATH", "roam-no-such-command", ErrCommandNotFound},
		{"not executable", notExec, ErrNotExecutable},
		{"directory", dir, ErrNotExecutable},
	}
	// An executor that cannot start either: had Start spawned anything,
	// the error would be about the executor.
	d, err := New(Config{ExecutorPath: filepath.Join(dir, "no-such-executor")})
	must.NoError(t, err)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			taskDir := filepath.Join(t.TempDir(), "task")
			_, err := d.Start(testCtx(t), TaskConfig{ID: "bad", Command: tc.command, Dir: taskDir})
			must.ErrorIs(t, err, tc.want)
			must.StrContains(t, err.Error(), `"bad"`)
			_, statErr := os.Stat(filepath.Join(taskDir, executorDirName, "spec.json"))
			must.True(t, errors.Is(statErr, os.ErrNotExist))
		})
	}
}

func TestStart_ExecFailureReportedByExecutor(t *testing.T) {
	t.Parallel()
	// Executable bits but no valid format: only execve can tell.
	bad := filepath.Join(t.TempDir(), "garbage")
	must.NoError(t, os.WriteFile(bad, []byte{0, 1, 2, 3, 4, 5, 6, 7}, 0o755))

	taskDir := filepath.Join(t.TempDir(), "task")
	_, err := testDriver(t).Start(testCtx(t), TaskConfig{ID: "garbage", Command: bad, Dir: taskDir})
	must.Error(t, err)
	must.StrContains(t, err.Error(), "exec format error")

	var res ExitResult
	must.NoError(t, readJSONFile(filepath.Join(taskDir, executorDirName, "exit.json"), &res))
	must.Eq(t, -1, res.ExitCode)
	must.StrContains(t, res.Err, "exec format error")
}

func TestStart_RefusesDirOfRunningTask(t *testing.T) {
	t.Parallel()
	d := testDriver(t)
	cfg := TaskConfig{Command: "/bin/sh", Args: []string{"-c", "sleep 60"}, Dir: filepath.Join(t.TempDir(), "task")}
	h := startTask(t, d, cfg)
	_, err := d.Start(testCtx(t), TaskConfig{ID: "again", Command: "/bin/true", Dir: cfg.Dir})
	must.ErrorIs(t, err, ErrAlreadyRunning)
	must.True(t, h.IsRunning())
}

func TestKill_TaskHandlesSignal(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	marker := filepath.Join(dir, "trapped")
	// The background sleep ignores SIGINT (a non-interactive shell's async
	// commands do); the executor must still clean it up.
	script := `trap 'echo trapped > ` + marker + `; exit 7' INT; sleep 60 & echo $! > ` + filepath.Join(dir, "child.pid") + `; wait`
	h := startTask(t, testDriver(t), TaskConfig{
		Command:     "/bin/sh",
		Args:        []string{"-c", script},
		Dir:         filepath.Join(dir, "task"),
		KillSignal:  "SIGINT",
		KillTimeout: time.Minute, // never reached: SIGKILL would show in the result
	})
	pgid := h.State().TaskPID
	waitFor(t, "the child to start", func() bool { return len(groupMembers(t, pgid)) == 2 })
	childPID := readPID(t, filepath.Join(dir, "child.pid"))

	must.NoError(t, h.Kill(testCtx(t), "", 0))
	res, err := h.Wait(testCtx(t))
	must.NoError(t, err)
	must.Eq(t, 7, res.ExitCode, must.Sprint("the task's own handler decided the exit"))
	must.Eq(t, 0, res.Signal)
	_, err = os.Stat(marker)
	must.NoError(t, err)
	must.False(t, processAlive(childPID, 0), must.Sprint("leftover child is killed"))
	must.SliceEmpty(t, groupMembers(t, pgid))
}

func TestKill_IgnoredSignalEscalatesToSIGKILL(t *testing.T) {
	t.Parallel()
	h := startTask(t, testDriver(t), TaskConfig{
		Command: "/bin/sh",
		// The foreground sleep inherits the ignored SIGINT.
		Args:        []string{"-c", `trap "" INT; sleep 60`},
		KillSignal:  "SIGINT",
		KillTimeout: 200 * time.Millisecond,
	})
	pgid := h.State().TaskPID
	waitFor(t, "sleep to start", func() bool { return len(groupMembers(t, pgid)) == 2 })

	must.NoError(t, h.Kill(testCtx(t), "", 0))
	res, err := h.Wait(testCtx(t))
	must.NoError(t, err)
	must.Eq(t, int(syscall.SIGKILL), res.Signal, must.Sprint("SIGINT was ignored, so SIGKILL ended it"))
	must.Eq(t, 128+int(syscall.SIGKILL), res.ExitCode)
	must.False(t, res.Successful())
	must.SliceEmpty(t, groupMembers(t, pgid), must.Sprint("the whole process group is gone"))
}

func TestKill_ExitedTaskIsNoop(t *testing.T) {
	t.Parallel()
	h := startTask(t, testDriver(t), TaskConfig{Command: "/bin/sh", Args: []string{"-c", "exit 4"}})
	_, err := h.Wait(testCtx(t))
	must.NoError(t, err)
	must.NoError(t, h.Kill(testCtx(t), "SIGTERM", time.Second))
	res, err := h.Wait(testCtx(t))
	must.NoError(t, err)
	must.Eq(t, 4, res.ExitCode)
}

func TestKill_UnknownSignal(t *testing.T) {
	t.Parallel()
	h := startTask(t, testDriver(t), TaskConfig{Command: "/bin/sh", Args: []string{"-c", "sleep 60"}})
	must.Error(t, h.Kill(testCtx(t), "SIGBOGUS", time.Second))
	must.True(t, h.IsRunning())
}

func TestReattach_RunningTask(t *testing.T) {
	t.Parallel()
	h1 := startTask(t, testDriver(t), TaskConfig{Command: "/bin/sh", Args: []string{"-c", "sleep 60"}})
	state := roundTrip(t, h1.State())

	// A new driver, as after a client restart.
	h2, err := testDriver(t).Reattach(state)
	must.NoError(t, err)
	must.True(t, h2.IsRunning())
	must.Eq(t, state, h2.State())

	must.NoError(t, h2.Kill(testCtx(t), "SIGTERM", 10*time.Second))
	res, err := h2.Wait(testCtx(t))
	must.NoError(t, err)
	must.Eq(t, int(syscall.SIGTERM), res.Signal)
	must.Eq(t, 128+int(syscall.SIGTERM), res.ExitCode)

	// The original handle sees the same end.
	res1, err := h1.Wait(testCtx(t))
	must.NoError(t, err)
	must.Eq(t, res, res1)
}

func TestReattach_ExitedTask(t *testing.T) {
	t.Parallel()
	h1 := startTask(t, testDriver(t), TaskConfig{Command: "/bin/sh", Args: []string{"-c", "exit 5"}})
	_, err := h1.Wait(testCtx(t))
	must.NoError(t, err)

	h2, err := testDriver(t).Reattach(roundTrip(t, h1.State()))
	must.NoError(t, err)
	must.False(t, h2.IsRunning())
	res, err := h2.Wait(testCtx(t))
	must.NoError(t, err)
	must.Eq(t, 5, res.ExitCode)
}

func TestReattach_StaleState(t *testing.T) {
	t.Parallel()
	// A PID that is certainly dead: a reaped child of ours.
	cmd := exec.Command("/bin/true")
	must.NoError(t, cmd.Run())
	deadPID := cmd.Process.Pid

	self, err := readProcStat(os.Getpid())
	must.NoError(t, err)

	dir := t.TempDir()
	cases := []struct {
		name  string
		state HandleState
	}{
		{"dead pid", HandleState{ID: "stale", TaskPID: deadPID, ExecutorPID: deadPID}},
		{"reused pid", HandleState{ // a live PID, but not the process recorded
			ID: "reused", TaskPID: os.Getpid(), TaskStartTime: self.StartTime + 1,
			ExecutorPID: os.Getpid(), ExecutorStartTime: self.StartTime + 1,
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.state.ExitPath = filepath.Join(dir, "no-exit.json")
			tc.state.StatePath = filepath.Join(dir, "no-state.json")
			_, err := testDriver(t).Reattach(tc.state)
			must.ErrorIs(t, err, ErrTaskGone)
		})
	}
}

func TestReattach_TaskWhoseExecutorDied(t *testing.T) {
	t.Parallel()
	h1 := startTask(t, testDriver(t), TaskConfig{Command: "/bin/sh", Args: []string{"-c", "sleep 60"}})
	st := h1.State()
	must.NoError(t, syscall.Kill(st.ExecutorPID, syscall.SIGKILL))
	waitFor(t, "the executor to die", func() bool { h1.IsRunning(); return !processAlive(st.ExecutorPID, st.ExecutorStartTime) })

	// The task still runs, so it can be re-attached and stopped, but its
	// exit status is lost with the executor.
	h2, err := testDriver(t).Reattach(st)
	must.NoError(t, err)
	must.True(t, h2.IsRunning())
	must.NoError(t, h2.Kill(testCtx(t), "SIGTERM", 10*time.Second))
	_, err = h2.Wait(testCtx(t))
	must.ErrorIs(t, err, ErrTaskGone)
	// With its executor gone the task is reaped by init, which may list it
	// in /proc a moment after it has died: wait for that, do not race it.
	waitFor(t, "the task's process group to be reaped", func() bool { return len(groupMembers(t, st.TaskPID)) == 0 })
}

func TestExecutor_OwnSessionAndGroup(t *testing.T) {
	t.Parallel()
	h := startTask(t, testDriver(t), TaskConfig{Command: "/bin/sh", Args: []string{"-c", "sleep 60"}})
	st := h.State()

	self, err := readProcStat(os.Getpid())
	must.NoError(t, err)
	exe, err := readProcStat(st.ExecutorPID)
	must.NoError(t, err)
	task, err := readProcStat(st.TaskPID)
	must.NoError(t, err)

	must.Eq(t, st.ExecutorPID, exe.SessionID, must.Sprint("the executor leads a session of its own"))
	must.NotEq(t, self.SessionID, exe.SessionID)
	must.Eq(t, st.TaskPID, task.PGID, must.Sprint("the task leads its own process group"))
	must.NotEq(t, exe.PGID, task.PGID)
	must.Eq(t, st.ExecutorPID, task.PPID)
}

func TestExecutor_IgnoresAgentSignals(t *testing.T) {
	t.Parallel()
	h := startTask(t, testDriver(t), TaskConfig{Command: "/bin/sh", Args: []string{"-c", "sleep 60"}})
	st := h.State()
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		must.NoError(t, syscall.Kill(st.ExecutorPID, sig))
	}
	// The signals are delivered before the executor can see the task end,
	// so an executor they killed would leave no exit status behind.
	must.NoError(t, h.Kill(testCtx(t), "SIGTERM", 10*time.Second))
	res, err := h.Wait(testCtx(t))
	must.NoError(t, err)
	must.Eq(t, int(syscall.SIGTERM), res.Signal)
}

// TestReattach_AfterClientKill9 is the reason for the executor: a client
// killed with SIGKILL leaves its task running, and the next client adopts
// it instead of starting it again.
func TestReattach_AfterClientKill9(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), envDriverChild+"="+dir)
	stdin, err := child.StdinPipe()
	must.NoError(t, err)
	var childErr strings.Builder
	child.Stderr = &childErr
	must.NoError(t, child.Start())
	t.Cleanup(func() {
		_ = child.Process.Kill()
		_ = stdin.Close()
		_ = child.Wait()
	})

	handlePath := filepath.Join(dir, "handle.json")
	waitFor(t, "the child client to start its task", func() bool {
		_, err := os.Stat(handlePath)
		return err == nil
	})
	var state HandleState
	must.NoError(t, readJSONFile(handlePath, &state))
	cleanupTask(t, state)

	must.NoError(t, child.Process.Signal(syscall.SIGKILL))
	_ = child.Wait()
	must.False(t, child.ProcessState.Exited(), must.Sprint("child was killed, not exited: ", childErr.String()))

	h, err := testDriver(t).Reattach(state)
	must.NoError(t, err)
	must.True(t, h.IsRunning(), must.Sprint("the task outlived its client"))
	must.NoError(t, h.Kill(testCtx(t), "SIGTERM", 10*time.Second))
	res, err := h.Wait(testCtx(t))
	must.NoError(t, err)
	must.Eq(t, int(syscall.SIGTERM), res.Signal, must.Sprint("the orphaned executor still recorded the exit"))
}

func TestParseSignal(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]syscall.Signal{
		"": syscall.SIGINT, "SIGTERM": syscall.SIGTERM, "term": syscall.SIGTERM, " SIGHUP ": syscall.SIGHUP, "kill": syscall.SIGKILL,
	} {
		got, err := parseSignal(in, syscall.SIGINT)
		must.NoError(t, err)
		must.Eq(t, want, got, must.Sprint(in))
	}
	_, err := parseSignal("SIGNOPE", syscall.SIGINT)
	must.Error(t, err)
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	var b []byte
	waitFor(t, path, func() bool {
		var err error
		b, err = os.ReadFile(path)
		return err == nil && strings.HasSuffix(string(b), "\n")
	})
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	must.NoError(t, err)
	return pid
}
