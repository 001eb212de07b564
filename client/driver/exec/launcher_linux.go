package exec

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"syscall"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"

	"github.com/roamhq/roam/client/driver/rawexec"
)

func init() {
	rawexec.RegisterLauncher(LauncherName, func() rawexec.Launcher { return &launcher{} })
}

// launcher runs in the executor: it owns the task's cgroup and starts
// exec-init in new namespaces (see the package doc).
type launcher struct {
	cfg   launchConfig
	init  initConfig
	cg    cgroups.Manager
	pipeW *os.File
	// errR and errW are the pipe exec-init reports a failed start on;
	// errW is exec-init's end.
	errR, errW *os.File
}

// initTimeout bounds how long exec-init may take to build the task's root
// and exec it.
const initTimeout = 30 * time.Second

func (l *launcher) Command(spec rawexec.LaunchSpec) (*osexec.Cmd, error) {
	if err := json.Unmarshal(spec.Config, &l.cfg); err != nil {
		return nil, fmt.Errorf("exec: decode launch config: %w", err)
	}
	l.init = initConfig{
		Root: l.cfg.Root, Mounts: l.cfg.Mounts, UID: l.cfg.UID, GID: l.cfg.GID,
		Command: spec.Command, Args: spec.Args, Env: spec.Env,
	}
	cg, err := newCgroup(l.cfg.Cgroup)
	if err != nil {
		return nil, err
	}
	l.cg = cg
	exe, err := rawexec.ExecutablePath()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("exec: init pipe: %w", err)
	}
	l.pipeW = w
	if l.errR, l.errW, err = os.Pipe(); err != nil {
		return nil, fmt.Errorf("exec: init error pipe: %w", err)
	}
	return &osexec.Cmd{
		Path:       exe,
		Args:       []string{exe, "exec-init"},
		Env:        []string{initEnv + "=1"},
		Dir:        "/",
		ExtraFiles: []*os.File{r, l.errW},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		},
	}, nil
}

// Started places exec-init in the task's cgroup and only then sends it its
// config, which releases it; it returns once exec-init has exec'd the
// task, or with the reason it could not.
func (l *launcher) Started(pid int) error {
	l.errW.Close()
	l.errW = nil
	defer l.errR.Close()
	err := l.release(pid)
	l.pipeW.Close()
	l.pipeW = nil
	if err != nil {
		return err
	}
	_ = l.errR.SetReadDeadline(time.Now().Add(initTimeout))
	msg, err := io.ReadAll(io.LimitReader(l.errR, 4096))
	if len(msg) > 0 {
		return fmt.Errorf("exec: %s", msg)
	}
	if err != nil {
		return fmt.Errorf("exec: waiting for the task's exec: %w", err)
	}
	return nil
}

func (l *launcher) release(pid int) error {
	if err := l.cg.Apply(pid); err != nil {
		return fmt.Errorf("exec: place the task in cgroup %s: %w", l.cfg.Cgroup.Path, err)
	}
	b, err := json.Marshal(l.init)
	if err != nil {
		return err
	}
	if _, err := l.pipeW.Write(b); err != nil {
		return fmt.Errorf("exec: release the task: %w", err)
	}
	return nil
}

// Finished kills what is left in the cgroup, tells whether the kernel
// OOM-killed a process of the task, and removes the cgroup.
func (l *launcher) Finished(res *rawexec.ExitResult) {
	for _, f := range []*os.File{l.pipeW, l.errW} {
		if f != nil {
			f.Close()
		}
	}
	if l.cg == nil {
		return
	}
	_ = killCgroup(l.cg)
	if res != nil {
		if n, err := l.cg.OOMKillCount(); err == nil && n > 0 {
			res.OOMKilled = true
			res.MemoryLimit = l.cfg.Cgroup.MemoryBytes
		}
	}
	_ = destroyCgroup(l.cg)
}

// removeTaskCgroup kills whatever is left in the cgroup at path and
// removes it; a cgroup that does not exist is already done.
func removeTaskCgroup(path string) error {
	m, err := manager.New(&cgroups.Cgroup{Path: path, Resources: &cgroups.Resources{SkipDevices: true}})
	if err != nil {
		return err
	}
	if _, err := os.Stat(pidsDir(m)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := killCgroup(m); err != nil {
		return err
	}
	return destroyCgroup(m)
}

// newCgroup returns a manager for the task's cgroup, with its limits.
func newCgroup(c cgroupConfig) (cgroups.Manager, error) {
	if c.Path == "" {
		return nil, errors.New("exec: the task has no cgroup path")
	}
	pids := c.PidsLimit
	res := &cgroups.Resources{
		Memory:            c.MemoryBytes,
		MemoryReservation: c.MemoryReservationBytes,
		CpuShares:         c.CPUShares,
		PidsLimit:         &pids,
		// Devices are bounded by the task's /dev, not by the cgroup.
		SkipDevices: true,
	}
	if c.MemoryBytes > 0 && swapAccounted() {
		// No swap beyond the memory limit: a hog is killed, not paged out.
		res.MemorySwap = c.MemoryBytes
	}
	m, err := manager.New(&cgroups.Cgroup{Path: c.Path, Resources: res})
	if err != nil {
		return nil, fmt.Errorf("exec: cgroup %s: %w", c.Path, err)
	}
	if err := m.Apply(-1); err != nil {
		return nil, fmt.Errorf("exec: create cgroup %s: %w", c.Path, err)
	}
	if err := m.Set(res); err != nil {
		_ = m.Destroy()
		return nil, fmt.Errorf("exec: set limits of cgroup %s: %w", c.Path, err)
	}
	return m, nil
}

// swapAccounted reports whether a swap limit can be set: always on v2, on
// v1 only with swap accounting.
func swapAccounted() bool {
	if cgroups.IsCgroup2UnifiedMode() {
		return true
	}
	mnt, err := cgroups.FindCgroupMountpoint("", "memory")
	if err != nil {
		return false
	}
	_, err = os.Stat(mnt + "/memory.memsw.limit_in_bytes")
	return err == nil
}

// killPollInterval and killAttempts bound how long killCgroup waits for
// the kernel to take killed processes out of the cgroup.
const (
	killPollInterval = 20 * time.Millisecond
	killAttempts     = 250
)

// killCgroup SIGKILLs every process in the cgroup until none is left.
// Processes are frozen first, so that none can fork a child past the
// kill.
func killCgroup(m cgroups.Manager) error {
	t := time.NewTicker(killPollInterval)
	defer t.Stop()
	for i := 0; i < killAttempts; i++ {
		pids, err := cgroups.GetAllPids(pidsDir(m))
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		_ = m.Freeze(cgroups.Frozen)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = m.Freeze(cgroups.Thawed)
		<-t.C
	}
	return errors.New("exec: processes left in the task's cgroup")
}

// pidsDir is the directory that lists the task's processes: its pids
// cgroup on v1, its one cgroup on v2. (The manager's own GetAllPids looks
// in the devices hierarchy, which the driver leaves alone.)
func pidsDir(m cgroups.Manager) string {
	if cgroups.IsCgroup2UnifiedMode() {
		return m.Path("")
	}
	return m.Path("pids")
}

// destroyCgroup removes the cgroup, retrying while the kernel still counts
// exiting processes in it.
func destroyCgroup(m cgroups.Manager) error {
	t := time.NewTicker(killPollInterval)
	defer t.Stop()
	var err error
	for i := 0; i < killAttempts; i++ {
		if err = m.Destroy(); err == nil {
			return nil
		}
		<-t.C
	}
	return err
}

// cgroupUsage reads a task cgroup's counters, on v1 or v2.
func cgroupUsage(path string) (*Usage, error) {
	m, err := manager.New(&cgroups.Cgroup{Path: path, Resources: &cgroups.Resources{SkipDevices: true}})
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(pidsDir(m)); err != nil {
		return nil, fmt.Errorf("exec: cgroup %s: %w", path, err)
	}
	st, err := m.GetStats()
	if err != nil {
		return nil, fmt.Errorf("exec: stats of cgroup %s: %w", path, err)
	}
	ms, cs := st.MemoryStats, st.CpuStats
	u := &Usage{
		Time:             time.Now(),
		MemoryUsage:      ms.Usage.Usage,
		MemoryMaxUsage:   ms.Usage.MaxUsage,
		Cache:            ms.Cache,
		KernelUsage:      ms.KernelUsage.Usage,
		CPUTotal:         cs.CpuUsage.TotalUsage,
		CPUUser:          cs.CpuUsage.UsageInUsermode,
		CPUSystem:        cs.CpuUsage.UsageInKernelmode,
		ThrottledPeriods: cs.ThrottlingData.ThrottledPeriods,
		ThrottledTime:    cs.ThrottlingData.ThrottledTime,
	}
	if cgroups.IsCgroup2UnifiedMode() {
		u.RSS = ms.Stats["anon"]
		u.Swap = ms.SwapOnlyUsage.Usage
	} else {
		u.RSS = ms.Stats["total_rss"]
		if ms.SwapUsage.Usage > ms.Usage.Usage {
			u.Swap = ms.SwapUsage.Usage - ms.Usage.Usage
		}
	}
	return u, nil
}
