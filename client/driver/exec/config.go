package exec

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
)

// LauncherName is the name the launcher registers under with rawexec.
const LauncherName = "exec"

// DefaultUser is the account a task that names none runs as.
const DefaultUser = "nobody"

// DefaultPidsLimit caps the processes and threads of a task that sets no
// limit of its own, so that a fork bomb stops there.
const DefaultPidsLimit = 1024

// MinMemoryMB is the least memory a task may ask for, as in Nomad.
const MinMemoryMB = 10

// DefaultChrootEnv is what the task sees of the host, read-only: Nomad's
// default chroot_env, host path to path inside the task.
func DefaultChrootEnv() map[string]string {
	m := map[string]string{}
	for _, d := range []string{"/bin", "/etc", "/lib", "/lib32", "/lib64", "/run/resolvconf", "/sbin", "/usr"} {
		m[d] = d
	}
	return m
}

// Mount kinds of the init config.
const (
	mountBind  = "bind"
	mountTmpfs = "tmpfs"
)

// mount is one mount exec-init makes beneath the task's root.
type mount struct {
	Kind string
	// Source is the host path of a bind.
	Source string `json:",omitempty"`
	// Target is a clean path relative to the root.
	Target   string
	ReadOnly bool `json:",omitempty"`
	// File makes a bind target a file rather than a directory.
	File bool `json:",omitempty"`
	// Data is the tmpfs options.
	Data string `json:",omitempty"`
	// Optional skips a bind whose source does not exist on the host.
	Optional bool `json:",omitempty"`
}

// cgroupConfig is the task's cgroup and its limits.
type cgroupConfig struct {
	// Path is the cgroup's path below the hierarchy roots, e.g.
	// /roam/<alloc>.<task>.
	Path string
	// MemoryBytes is the hard limit; MemoryReservationBytes the soft one
	// (set when memory_max raises the hard limit above memory).
	MemoryBytes            int64
	MemoryReservationBytes int64 `json:",omitempty"`
	CPUShares              uint64
	PidsLimit              int64
}

// launchConfig is what the exec driver hands the executor's launcher.
type launchConfig struct {
	// Root is the task directory on the host; it becomes "/".
	Root   string
	Mounts []mount
	UID    uint32
	GID    uint32
	Cgroup cgroupConfig
}

// initConfig is what the launcher writes to exec-init once it sits in its
// cgroup.
type initConfig struct {
	Root    string
	Mounts  []mount
	UID     uint32
	GID     uint32
	Command string
	Args    []string
	Env     []string
}

// Resources are the limits of one task.
type Resources struct {
	// CPU is the task's share in MHz, as Nomad counts it: it becomes cpu
	// shares (v1) or the equivalent weight (v2).
	CPU int
	// MemoryMB is the memory the task is given; MemoryMaxMB, when larger,
	// is the hard limit and MemoryMB then only a reservation.
	MemoryMB    int
	MemoryMaxMB int
	// PidsLimit caps processes and threads; 0 means the driver's default.
	PidsLimit int64
}

func (r Resources) validate() error {
	var errs []error
	if r.MemoryMB < MinMemoryMB {
		errs = append(errs, fmt.Errorf("resources.memory %d MB is under the minimum of %d MB", r.MemoryMB, MinMemoryMB))
	}
	if r.MemoryMaxMB != 0 && r.MemoryMaxMB < r.MemoryMB {
		errs = append(errs, fmt.Errorf("resources.memory_max %d MB is under resources.memory %d MB", r.MemoryMaxMB, r.MemoryMB))
	}
	if r.CPU < 0 {
		errs = append(errs, fmt.Errorf("resources.cpu %d is negative", r.CPU))
	}
	if r.PidsLimit < 0 {
		errs = append(errs, fmt.Errorf("pids limit %d is negative", r.PidsLimit))
	}
	return errors.Join(errs...)
}

// cleanTarget turns a path inside the task (absolute or not) into a clean
// path relative to its root, refusing one that is the root itself or
// climbs out of it.
func cleanTarget(p string) (string, error) {
	rel := strings.TrimLeft(filepath.Clean("/"+p), "/")
	if rel == "" || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("%q is not a path inside the task", p)
	}
	return rel, nil
}

// MaxChrootEnv bounds the entries of a chroot_env.
const MaxChrootEnv = 64

// ValidateChrootEnv says what is wrong with a chroot_env, or nil: host
// paths absolute, task paths inside the task's root, at most MaxChrootEnv.
func ValidateChrootEnv(env map[string]string) error {
	_, err := chrootMounts(env)
	return err
}

// chrootMounts are the read-only binds of a chroot_env, sorted so that a
// parent is mounted before what lies in it.
func chrootMounts(env map[string]string) ([]mount, error) {
	if len(env) > MaxChrootEnv {
		return nil, fmt.Errorf("chroot_env: %d entries, at most %d", len(env), MaxChrootEnv)
	}
	out := make([]mount, 0, len(env))
	for src, dst := range env {
		if !filepath.IsAbs(src) {
			return nil, fmt.Errorf("chroot_env: host path %q is not absolute", src)
		}
		rel, err := cleanTarget(dst)
		if err != nil {
			return nil, fmt.Errorf("chroot_env %q: %w", src, err)
		}
		out = append(out, mount{Kind: mountBind, Source: filepath.Clean(src), Target: rel, ReadOnly: true, Optional: true})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Target < out[j].Target })
	return out, nil
}
