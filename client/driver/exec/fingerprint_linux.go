package exec

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/opencontainers/cgroups"
)

// CgroupVersion is "v2" on a unified hierarchy, "v1" otherwise (legacy or
// hybrid).
func CgroupVersion() string {
	if cgroups.IsCgroup2UnifiedMode() {
		return "v2"
	}
	return "v1"
}

// Fingerprint reports whether this host can run exec tasks, and if not,
// why. It changes nothing.
func Fingerprint() (ok bool, reason string) {
	if os.Geteuid() != 0 {
		return false, "exec needs the client to run as root"
	}
	for _, ns := range []string{"pid", "mnt", "ipc", "uts"} {
		if _, err := os.Stat("/proc/self/ns/" + ns); err != nil {
			return false, fmt.Sprintf("no %s namespace support: %v", ns, err)
		}
	}
	need := []string{"memory", "cpu", "pids"}
	if cgroups.IsCgroup2UnifiedMode() {
		b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
		if err != nil {
			return false, fmt.Sprintf("cgroup v2: %v", err)
		}
		have := strings.Fields(string(b))
		for _, c := range need {
			if !slices.Contains(have, c) {
				return false, fmt.Sprintf("cgroup v2: the %s controller is not available", c)
			}
		}
		return true, "Healthy"
	}
	for _, c := range append(need, "freezer") {
		if _, err := cgroups.FindCgroupMountpoint("", c); err != nil {
			return false, fmt.Sprintf("cgroup v1: the %s controller is not mounted: %v", c, err)
		}
	}
	return true, "Healthy"
}
