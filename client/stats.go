package client

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/roamhq/roam/structs"
)

// statsWindow is how long a stats request measures CPU use over.
const statsWindow = 100 * time.Millisecond

// mhzPerCore turns a share of a core into MHz, as the scheduler counts a
// core (cpu.numcores * 1000) when the node reports no cpu.totalcompute.
const mhzPerCore = 1000

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat times.
const clockTicks = 100

// usageSample is a running task's counters at one moment: from its
// cgroup under exec, from its main process under raw_exec.
type usageSample struct {
	at                              time.Time
	cpuTotal, cpuUser, cpuSystem    uint64 // nanoseconds
	throttledPeriods, throttledTime uint64
	mem                             structs.MemoryStats
	cpuMeasured                     []string
}

// sample reads the task's counters; ok is false when it is not running.
func (tr *taskRunner) sample() (s *usageSample, ok bool, err error) {
	h := tr.current.Load()
	if h == nil || !h.IsRunning() {
		return nil, false, nil
	}
	if tr.task.Driver == execDriver && tr.drivers.exec != nil {
		u, err := tr.drivers.exec.Usage(tr.allocID + "/" + tr.task.Name)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, false, nil // it ended meanwhile
		}
		if err != nil {
			return nil, false, err
		}
		return &usageSample{
			at: u.Time, cpuTotal: u.CPUTotal, cpuUser: u.CPUUser, cpuSystem: u.CPUSystem,
			throttledPeriods: u.ThrottledPeriods, throttledTime: u.ThrottledTime,
			mem: structs.MemoryStats{RSS: u.RSS, Cache: u.Cache, Swap: u.Swap, Usage: u.MemoryUsage,
				MaxUsage: u.MemoryMaxUsage, KernelUsage: u.KernelUsage,
				Measured: []string{"RSS", "Cache", "Swap", "Usage", "Max Usage", "Kernel Usage"}},
			cpuMeasured: []string{"System Mode", "User Mode", "Throttled Periods", "Throttled Time", "Percent"},
		}, true, nil
	}
	return procSample(h.State().TaskPID)
}

// procSample reads the times and resident memory of the task's process
// group (the executor makes the task the leader of its own) from /proc:
// what the task's children use counts too.
func procSample(pgid int) (*usageSample, bool, error) {
	if pgid <= 0 {
		return nil, false, nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, false, err
	}
	s := &usageSample{at: time.Now(), cpuMeasured: []string{"System Mode", "User Mode", "Percent"}}
	s.mem.Measured = []string{"RSS"}
	found := false
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		utime, stime, group, ok := procTimes(pid)
		if !ok || group != pgid {
			continue
		}
		found = true
		s.cpuUser += utime * uint64(time.Second) / clockTicks
		s.cpuSystem += stime * uint64(time.Second) / clockTicks
		s.mem.RSS += procRSS(pid)
	}
	s.cpuTotal = s.cpuUser + s.cpuSystem
	return s, found, nil
}

// procTimes reads a process's user and system ticks and process group.
func procTimes(pid int) (utime, stime uint64, pgid int, ok bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	// The command name may hold spaces; the fields follow its ")".
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		return 0, 0, 0, false
	}
	pgid, _ = strconv.Atoi(f[2])
	utime, _ = strconv.ParseUint(f[11], 10, 64)
	stime, _ = strconv.ParseUint(f[12], 10, 64)
	return utime, stime, pgid, true
}

// procRSS is a process's resident memory in bytes.
func procRSS(pid int) uint64 {
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// usageBetween is a task's usage from two samples: memory as of the
// second, CPU as shares of one core over the time between.
func usageBetween(a, b *usageSample) *structs.ResourceUsage {
	mem := b.mem
	cpu := &structs.CpuStats{ThrottledPeriods: b.throttledPeriods, ThrottledTime: b.throttledTime, Measured: b.cpuMeasured}
	if dt := b.at.Sub(a.at); dt > 0 {
		pct := func(x, y uint64) float64 {
			if y < x {
				return 0
			}
			return float64(y-x) / float64(dt) * 100
		}
		cpu.Percent = pct(a.cpuTotal, b.cpuTotal)
		cpu.UserMode = pct(a.cpuUser, b.cpuUser)
		cpu.SystemMode = pct(a.cpuSystem, b.cpuSystem)
		cpu.TotalTicks = cpu.Percent / 100 * mhzPerCore
	}
	return &structs.ResourceUsage{MemoryStats: &mem, CpuStats: cpu}
}

// allocStats measures the allocation's running tasks over statsWindow.
func (m *allocManager) allocStats(allocID string) (*structs.AllocResourceUsage, error) {
	ar := m.getRunner(allocID)
	if ar == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownAlloc, allocID)
	}
	first := map[string]*usageSample{}
	for _, tr := range ar.tasks {
		s, ok, err := tr.sample()
		if err != nil {
			return nil, fmt.Errorf("task %q: %w", tr.task.Name, err)
		}
		if ok {
			first[tr.task.Name] = s
		}
	}
	if len(first) > 0 {
		<-time.After(statsWindow)
	}
	out := &structs.AllocResourceUsage{ResourceUsage: &structs.ResourceUsage{}, Tasks: map[string]*structs.TaskResourceUsage{}}
	for _, tr := range ar.tasks {
		a := first[tr.task.Name]
		if a == nil {
			continue
		}
		b, ok, err := tr.sample()
		if err != nil {
			return nil, fmt.Errorf("task %q: %w", tr.task.Name, err)
		}
		if !ok {
			continue // it ended within the window
		}
		u := usageBetween(a, b)
		out.Tasks[tr.task.Name] = &structs.TaskResourceUsage{ResourceUsage: u, Timestamp: b.at.UnixNano()}
		out.ResourceUsage.Add(u)
	}
	out.Timestamp = time.Now().UnixNano()
	return out, nil
}

// AllocStats measures the resource usage of an allocation this client
// runs.
func (c *Client) AllocStats(allocID string) (*structs.AllocResourceUsage, error) {
	if c.allocs == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownAlloc, allocID)
	}
	return c.allocs.allocStats(allocID)
}

// Stats measures an allocation's resource usage for a server relaying
// a stats request.
func (a *ClientAllocs) Stats(args *structs.AllocStatsRequest, reply *structs.AllocResourceUsage) error {
	u, err := a.c.AllocStats(args.AllocID)
	if err != nil {
		return logRPCError(err)
	}
	*reply = *u
	return nil
}
