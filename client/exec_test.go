package client

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// execTask is shTask run by the exec driver.
func execTask(name, script string, memoryMB int) *structs.Task {
	t := shTask(name, script)
	t.Driver = execDriver
	t.Resources = &structs.Resources{CPU: 100, MemoryMB: memoryMB}
	return t
}

// An exec task runs chrooted in its task directory, as nobody, and its
// NOMAD_* paths are the ones it sees; what it writes to the alloc's data/
// reaches the host's.
func TestAllocRunner_ExecTaskRunsChrooted(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	startTestManager(t, srv, dataDir, nil)

	script := `echo secret > "$NOMAD_SECRETS_DIR/token"
echo "$NOMAD_ALLOC_DIR|$NOMAD_TASK_DIR|$NOMAD_SECRETS_DIR|$ROAM_TASK_DIR|$(pwd)|$(id -u)|$(cat $NOMAD_SECRETS_DIR/token)|$NOMAD_MEMORY_LIMIT|$NOMAD_JOB_ID|$FOO" > "$NOMAD_ALLOC_DIR/data/env.txt"
cat /etc/shadow && exit 9
test -e "` + dataDir + `/alloc" && echo "host data dir visible" >&2 && exit 10
exit 0`
	alloc := testAlloc(srv.nodeID, structs.JobTypeBatch, noRestarts, execTask("jail", script, 64))
	srv.upsert(alloc)

	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)
	st := got.TaskStates["jail"]
	must.Eq(t, []string{structs.TaskEventReceived, structs.TaskEventStarted, structs.TaskEventTerminated}, eventTypes(st))
	allocDir := filepath.Join(dataDir, "alloc", alloc.ID)
	env := strings.TrimSpace(waitFile(t, filepath.Join(allocDir, "alloc", "data", "env.txt")))
	must.Eq(t, strings.Join([]string{"/alloc", "/local", "/secrets", "/", "/", "65534", "secret", "64", alloc.JobID, "bar"}, "|"), env)
	// The secrets lived in the task's tmpfs, not on the host's disk.
	_, err := os.Stat(filepath.Join(allocDir, "jail", "secrets", "token"))
	must.True(t, os.IsNotExist(err), must.Sprintf("secret on the host's disk: %v", err))
}

// A task killed at its memory limit ends with an event that says so, and
// the restart policy takes it from there.
func TestAllocRunner_ExecOOMKillIsReported(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	startTestManager(t, srv, dataDir, nil)

	alloc := testAlloc(srv.nodeID, structs.JobTypeBatch, noRestarts, execTask("hog", `tail /dev/zero`, 16))
	srv.upsert(alloc)

	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusFailed)
	st := got.TaskStates["hog"]
	must.True(t, st.Failed)
	last := st.Events[len(st.Events)-1]
	for _, e := range st.Events {
		if e.Type == structs.TaskEventTerminated {
			last = e
		}
	}
	must.Eq(t, structs.TaskEventTerminated, last.Type)
	must.StrContains(t, last.Message, "OOM Killed")
	must.StrContains(t, last.Message, "16 MiB")
	must.Eq(t, "true", last.Details["oom_killed"])
	must.Eq(t, "16777216", last.Details["memory_limit"])
}

// A client that cannot run exec says why, both in its fingerprint and in
// the event of an exec task that reaches it anyway.
func TestAllocRunner_ExecUnavailableSaysWhy(t *testing.T) {
	logger := hclog.NewNullLogger()
	drivers, err := newTaskDrivers(&Config{ExecutorPath: os.Args[0], DisableExec: true}, logger)
	must.NoError(t, err)
	attrs := map[string]string{}
	infos := drivers.infos(false, attrs)
	must.True(t, infos[rawExecDriver].Detected)
	must.False(t, infos[execDriver].Detected)
	must.Eq(t, "disabled by the client's configuration", infos[execDriver].HealthDescription)
	must.MapNotContainsKey(t, attrs, "driver.exec")

	enabled, err := newTaskDrivers(&Config{ExecutorPath: os.Args[0], CgroupParent: "/roam-test-client"}, logger)
	must.NoError(t, err)
	attrs = map[string]string{}
	infos = enabled.infos(false, attrs)
	must.True(t, infos[execDriver].Detected, must.Sprintf("exec not detected as root: %s", infos[execDriver].HealthDescription))
	must.Eq(t, "1", attrs["driver.exec"])
	must.SliceContains(t, []string{"v1", "v2"}, attrs["unique.cgroup.version"])

	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	startTestManagerWith(t, srv, dataDir, nil, func(c *allocManagerConfig) { c.Drivers = drivers })
	alloc := testAlloc(srv.nodeID, structs.JobTypeBatch, noRestarts, execTask("jail", `exit 0`, 64))
	srv.upsert(alloc)
	got := waitStatus(t, srv, alloc.ID, structs.AllocClientStatusFailed)
	must.StrContains(t, describeTasks(got.TaskStates), "disabled by the client's configuration")
}

// The stats of a running exec task come from its cgroup: the memory it
// holds and the CPU it burns; a raw_exec task's from its process.
func TestAllocRunner_StatsOfRunningTasks(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	m := startTestManager(t, srv, dataDir, nil)
	killTasksOnCleanup(t, m)
	// 24 MiB held by a shell variable, and a core kept busy beside it.
	hog := execTask("hog", `x=$(head -c 25165824 /dev/zero | tr '\0' a); echo held > "$NOMAD_ALLOC_DIR/data/held"; while :; do :; done`, 128)
	alloc := testAlloc(srv.nodeID, structs.JobTypeService, noRestarts, hog, shTask("plain", `exec sleep 60`),
		shTask("parent", `while :; do :; done & wait`))
	srv.upsert(alloc)
	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusRunning)
	waitFile(t, filepath.Join(dataDir, "alloc", alloc.ID, "alloc", "data", "held"))

	u, err := m.allocStats(alloc.ID)
	must.NoError(t, err)
	h := u.Tasks["hog"]
	must.NotNil(t, h)
	must.Greater(t, uint64(24<<20), h.ResourceUsage.MemoryStats.Usage)
	must.Greater(t, 5.0, h.ResourceUsage.CpuStats.Percent, must.Sprintf("cpu %+v", h.ResourceUsage.CpuStats))
	must.SliceContains(t, h.ResourceUsage.CpuStats.Measured, "Throttled Periods")
	p := u.Tasks["plain"]
	must.NotNil(t, p)
	must.Positive(t, p.ResourceUsage.MemoryStats.RSS)
	must.Less(t, 5.0, p.ResourceUsage.CpuStats.Percent)
	must.Greater(t, h.ResourceUsage.MemoryStats.Usage, u.ResourceUsage.MemoryStats.Usage+1)
	// A raw_exec task's children count: the shell waits, its child burns.
	pp := u.Tasks["parent"]
	must.NotNil(t, pp)
	must.Greater(t, 5.0, pp.ResourceUsage.CpuStats.Percent, must.Sprintf("cpu %+v", pp.ResourceUsage.CpuStats))
	_, err = m.allocStats("no-such-alloc")
	must.ErrorIs(t, err, ErrUnknownAlloc)
}
