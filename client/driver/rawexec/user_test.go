package rawexec

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// A task gets PATH and the locale of the client's environment, not the
// rest of it: a secret the agent was started with stays out of its reach.
func TestStart_TaskEnvLeavesOutAgentEnv(t *testing.T) {
	t.Setenv("ROAM_TEST_AGENT_SECRET", "agent-secret")
	dir := t.TempDir()
	cfg := TaskConfig{
		Command:    "/bin/sh",
		Args:       []string{"-c", "env"},
		Env:        map[string]string{"GIVEN": "by-job"},
		Dir:        filepath.Join(dir, "task"),
		StdoutPath: filepath.Join(dir, "out"),
	}
	h := startTask(t, testDriver(t), cfg)
	res, err := h.Wait(testCtx(t))
	must.NoError(t, err)
	must.True(t, res.Successful())
	out, err := os.ReadFile(cfg.StdoutPath)
	must.NoError(t, err)
	must.StrContains(t, string(out), "GIVEN=by-job")
	must.StrContains(t, string(out), "PATH="+os.Getenv("PATH"))
	must.StrNotContains(t, string(out), "agent-secret")
}

// A task with a User runs as that user, and cannot read a file only the
// client's user may.
func TestStart_TaskRunsAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running a task as another user needs root")
	}
	uid, gid, err := LookupUser("nobody")
	if err != nil {
		t.Skipf("no user nobody here: %v", err)
	}
	t.Parallel()
	dir := t.TempDir()
	// The task must reach its directory; the secret next to it stays 0600.
	for d := dir; d != filepath.Dir(os.TempDir()) && d != "/"; d = filepath.Dir(d) {
		if strings.HasPrefix(d, os.TempDir()+string(filepath.Separator)) {
			must.NoError(t, os.Chmod(d, 0o711))
		}
	}
	secret := filepath.Join(dir, "identity.json")
	must.NoError(t, os.WriteFile(secret, []byte(`{"SecretID":"s3cret"}`), 0o600))
	task := filepath.Join(dir, "task")
	must.NoError(t, os.MkdirAll(task, 0o755))
	must.NoError(t, os.Chown(task, int(uid), int(gid)))

	cfg := TaskConfig{
		Command:    "/bin/sh",
		Args:       []string{"-c", "id -u; cat ../identity.json; echo end"},
		Dir:        task,
		User:       "nobody",
		StdoutPath: filepath.Join(dir, "out"),
		StderrPath: filepath.Join(dir, "err"),
	}
	h := startTask(t, testDriver(t), cfg)
	_, err = h.Wait(testCtx(t))
	must.NoError(t, err)
	out, err := os.ReadFile(cfg.StdoutPath)
	must.NoError(t, err)
	errOut, _ := os.ReadFile(cfg.StderrPath)
	must.Eq(t, strconv.Itoa(int(uid))+"\nend\n", string(out), must.Sprintf("stderr: %s", errOut))
	must.StrContains(t, string(errOut), "Permission denied")

	_, err = testDriver(t).Start(testCtx(t), TaskConfig{ID: "x", Command: "/bin/true", Dir: task, User: "no-such-user-here"})
	must.ErrorIs(t, err, ErrUnknownUser)
}
