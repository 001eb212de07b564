package structs

// AllocStatsRequest asks for an allocation's resource usage (Alloc.Stats
// on a server, ClientAllocs.Stats on the allocation's node).
type AllocStatsRequest struct {
	AllocID string
	QueryOptions
}

// AllocResourceUsage is an allocation's resource usage in Nomad's shape:
// the sum over its tasks, and each running task's.
type AllocResourceUsage struct {
	ResourceUsage *ResourceUsage
	Tasks         map[string]*TaskResourceUsage
	// Timestamp is Unix nanoseconds.
	Timestamp int64
}

// TaskResourceUsage is one task's usage.
type TaskResourceUsage struct {
	ResourceUsage *ResourceUsage
	Timestamp     int64
	Pids          map[string]*ResourceUsage
}

// ResourceUsage is memory and CPU usage.
type ResourceUsage struct {
	MemoryStats *MemoryStats
	CpuStats    *CpuStats
}

// MemoryStats are bytes; Measured names the fields that were measured.
type MemoryStats struct {
	RSS            uint64
	Cache          uint64
	Swap           uint64
	Usage          uint64
	MaxUsage       uint64
	KernelUsage    uint64
	KernelMaxUsage uint64
	Measured       []string
}

// CpuStats: SystemMode and UserMode are percent of one core over the last
// interval, TotalTicks MHz used, Percent of one core; Throttled* from the
// cgroup.
type CpuStats struct {
	SystemMode       float64
	UserMode         float64
	TotalTicks       float64
	ThrottledPeriods uint64
	ThrottledTime    uint64
	Percent          float64
	Measured         []string
}

// Add sums u into r.
func (r *ResourceUsage) Add(u *ResourceUsage) {
	if u == nil {
		return
	}
	if u.MemoryStats != nil {
		if r.MemoryStats == nil {
			r.MemoryStats = &MemoryStats{Measured: u.MemoryStats.Measured}
		}
		m, o := r.MemoryStats, u.MemoryStats
		m.RSS += o.RSS
		m.Cache += o.Cache
		m.Swap += o.Swap
		m.Usage += o.Usage
		m.MaxUsage += o.MaxUsage
		m.KernelUsage += o.KernelUsage
		m.KernelMaxUsage += o.KernelMaxUsage
	}
	if u.CpuStats != nil {
		if r.CpuStats == nil {
			r.CpuStats = &CpuStats{Measured: u.CpuStats.Measured}
		}
		c, o := r.CpuStats, u.CpuStats
		c.SystemMode += o.SystemMode
		c.UserMode += o.UserMode
		c.TotalTicks += o.TotalTicks
		c.ThrottledPeriods += o.ThrottledPeriods
		c.ThrottledTime += o.ThrottledTime
		c.Percent += o.Percent
	}
}
