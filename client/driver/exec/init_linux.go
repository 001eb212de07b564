package exec

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// initConfigFD is the descriptor exec-init reads its config from: the
// first of the command's ExtraFiles. initErrFD, the second, is where it
// writes why it could not exec the task; a successful exec closes it
// (close-on-exec), which tells the launcher the task runs.
const (
	initConfigFD = 3
	initErrFD    = 4
)

// maxInitConfig bounds what exec-init reads from its pipe.
const maxInitConfig = 4 << 20

// RunInit is the body of `roam exec-init`: started by the launcher in new
// namespaces, it waits for its config, builds the task's root, drops
// privileges and execs the task. It returns only on failure, with the exit
// code to use (127 for a missing command, 126 for one that cannot run, 1
// otherwise); the reason is on stderr, which is the task's.
func RunInit() int {
	// The capability bounding set is per thread, and exec replaces the
	// process from the thread that calls it: both must be this one.
	runtime.LockOSThread()
	syscall.CloseOnExec(initErrFD)
	errPipe := os.NewFile(initErrFD, "init-errors")
	report := func(code int, msg string) int {
		fmt.Fprintln(os.Stderr, "exec-init: "+msg)
		if errPipe != nil {
			_, _ = errPipe.WriteString(msg)
		}
		return code
	}
	fail := func(format string, args ...any) int {
		return report(1, fmt.Sprintf(format, args...))
	}
	if os.Getpid() != 1 {
		// Only the launcher starts it, in a new pid and mount namespace;
		// run anywhere else, its mounts and chroot would be the host's.
		return fail("not pid 1 of a new pid namespace; exec-init is started by the exec driver only")
	}
	f := os.NewFile(initConfigFD, "init-config")
	if f == nil {
		return fail("no config descriptor")
	}
	b, err := io.ReadAll(io.LimitReader(f, maxInitConfig+1))
	f.Close()
	if err != nil {
		return fail("read config: %v", err)
	}
	if len(b) == 0 {
		// The launcher closed the pipe without a config: it could not
		// place us in the task's cgroup. Run nothing.
		return fail("the executor did not release the task")
	}
	if len(b) > maxInitConfig {
		return fail("config over %d bytes", maxInitConfig)
	}
	var cfg initConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fail("decode config: %v", err)
	}
	if err := buildRoot(&cfg); err != nil {
		return fail("build the task's root: %v", err)
	}
	if err := pivotRoot(cfg.Root); err != nil {
		return fail("pivot to %s: %v", cfg.Root, err)
	}
	if err := dropPrivileges(cfg.UID, cfg.GID); err != nil {
		return fail("drop privileges: %v", err)
	}
	err = syscall.Exec(cfg.Command, append([]string{cfg.Command}, cfg.Args...), cfg.Env)
	msg := fmt.Sprintf("exec %s: %v", cfg.Command, err)
	switch {
	case errors.Is(err, syscall.ENOENT):
		return report(127, msg)
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.ENOEXEC), errors.Is(err, syscall.EISDIR):
		return report(126, msg)
	}
	return report(1, msg)
}

// pivotRoot makes root the process's "/" and detaches the host's old
// root, so that nothing of the host is left in the mount namespace: a
// chroot inside the task leads nowhere else. (pivot_root(".", ".")
// stacks the old root on the new one; unmounting "." then removes it.)
func pivotRoot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	return unix.Chdir("/")
}

// buildRoot makes the task's mounts beneath cfg.Root, in this process's
// own mount namespace, which nothing is shared back from.
func buildRoot(cfg *initConfig) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	// The task's root becomes a mount of its own, for pivot_root, and one
	// where no device node or setuid bit the task writes has effect.
	if err := unix.Mount(cfg.Root, cfg.Root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind the root onto itself: %w", err)
	}
	rootFD, err := unix.Open(cfg.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("open root: %w", err)
	}
	defer unix.Close(rootFD)
	if err := restrictMounts(rootFD, false); err != nil {
		return fmt.Errorf("remount the root nosuid, nodev: %w", err)
	}
	for _, m := range cfg.Mounts {
		if err := doMount(rootFD, m); err != nil {
			return fmt.Errorf("mount %s at /%s: %w", orKind(m), m.Target, err)
		}
	}
	if err := mountDev(rootFD); err != nil {
		return fmt.Errorf("/dev: %w", err)
	}
	// Last, so that nothing above could have covered it: a proc of the new
	// pid namespace, which shows the task only its own processes.
	fd, err := openBeneath(rootFD, "proc", false)
	if err != nil {
		return fmt.Errorf("/proc: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Mount("proc", fdPath(fd), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	// Kernel knobs stay read-only even for a task run as root.
	sys, err := openBeneath(rootFD, "proc/sys", false)
	if err != nil {
		return fmt.Errorf("/proc/sys: %w", err)
	}
	defer unix.Close(sys)
	if err := bindReadOnly(rootFD, fdPath(sys), "proc/sys", false); err != nil {
		return fmt.Errorf("/proc/sys: %w", err)
	}
	// So is the magic SysRq trigger, where the kernel has one.
	if trig, err := openBeneath(rootFD, "proc/sysrq-trigger", true); err == nil {
		err = bindReadOnly(rootFD, fdPath(trig), "proc/sysrq-trigger", true)
		unix.Close(trig)
		if err != nil {
			return fmt.Errorf("/proc/sysrq-trigger: %w", err)
		}
	}
	return nil
}

func orKind(m mount) string {
	if m.Source != "" {
		return m.Source
	}
	return m.Kind
}

func doMount(rootFD int, m mount) error {
	switch m.Kind {
	case mountBind:
		fi, err := os.Stat(m.Source)
		if err != nil {
			if m.Optional && errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		// A chroot_env entry may be one file (a binary, /etc/passwd): its
		// target is a file too.
		file := m.File || !fi.IsDir()
		if m.ReadOnly {
			return bindReadOnly(rootFD, m.Source, m.Target, file)
		}
		fd, err := openBeneath(rootFD, m.Target, file)
		if err != nil {
			return err
		}
		err = unix.Mount(m.Source, fdPath(fd), "", unix.MS_BIND|unix.MS_REC, "")
		unix.Close(fd)
		if err != nil {
			return err
		}
		// Writable, but no device node or setuid bit on it takes effect.
		// The remount goes through a descriptor of the new mount.
		fd, err = openBeneath(rootFD, m.Target, file)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return restrictMounts(fd, m.ReadOnly)
	case mountTmpfs:
		fd, err := openBeneath(rootFD, m.Target, false)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
		if m.ReadOnly {
			flags |= unix.MS_RDONLY
		}
		return unix.Mount("tmpfs", fdPath(fd), "tmpfs", flags, m.Data)
	}
	return fmt.Errorf("unknown mount kind %q", m.Kind)
}

// bindReadOnly binds src at target and makes the new mount read-only,
// nosuid and nodev. The remount goes through a descriptor opened after the
// bind, which names the new mount rather than the directory it covers.
func bindReadOnly(rootFD int, src, target string, file bool) error {
	fd, err := openBeneath(rootFD, target, file)
	if err != nil {
		return err
	}
	err = unix.Mount(src, fdPath(fd), "", unix.MS_BIND|unix.MS_REC, "")
	unix.Close(fd)
	if err != nil {
		return err
	}
	fd, err = openBeneath(rootFD, target, file)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := restrictMounts(fd, true); err != nil {
		return fmt.Errorf("remount read-only: %w", err)
	}
	return nil
}

// restrictMounts makes the mount at fd, and every mount beneath it (a
// bind is recursive: the source's own submounts come along), nosuid and
// nodev, and read-only if ro. Kernels before 5.12 lack mount_setattr;
// there only the top mount is changed.
func restrictMounts(fd int, ro bool) error {
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if ro {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr)
	if !errors.Is(err, unix.ENOSYS) {
		return err
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	if ro {
		flags |= unix.MS_RDONLY
	}
	return unix.Mount("", fdPath(fd), "", flags, "")
}

// devices are the host devices a task gets in its /dev.
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// mountDev gives the task a /dev of its own: a small tmpfs with the
// harmless devices bound in, a /dev/shm, and the usual links.
func mountDev(rootFD int) error {
	fd, err := openBeneath(rootFD, "dev", false)
	if err != nil {
		return err
	}
	err = unix.Mount("tmpfs", fdPath(fd), "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k")
	unix.Close(fd)
	if err != nil {
		return err
	}
	for _, d := range devices {
		src := "/dev/" + d
		if _, err := os.Stat(src); err != nil {
			continue
		}
		fd, err := openBeneath(rootFD, "dev/"+d, true)
		if err != nil {
			return err
		}
		err = unix.Mount(src, fdPath(fd), "", unix.MS_BIND, "")
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("bind %s: %w", src, err)
		}
	}
	shm, err := openBeneath(rootFD, "dev/shm", false)
	if err != nil {
		return err
	}
	defer unix.Close(shm)
	if err := unix.Mount("tmpfs", fdPath(shm), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	devFD, err := openBeneath(rootFD, "dev", false)
	if err != nil {
		return err
	}
	defer unix.Close(devFD)
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := unix.Symlinkat(target, devFD, name); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("link /dev/%s: %w", name, err)
		}
	}
	// The tmpfs must allow the bound devices; read-only, nothing else can
	// be made there (a task run as root keeps CAP_MKNOD).
	if err := unix.Mount("", fdPath(devFD), "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("remount /dev read-only: %w", err)
	}
	return nil
}

// defaultCaps is the capability set of Nomad's exec driver; a task keeps
// no other, even as root.
var defaultCaps = []uintptr{
	unix.CAP_AUDIT_WRITE, unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID,
	unix.CAP_KILL, unix.CAP_MKNOD, unix.CAP_NET_BIND_SERVICE, unix.CAP_SETFCAP, unix.CAP_SETGID,
	unix.CAP_SETPCAP, unix.CAP_SETUID, unix.CAP_SYS_CHROOT,
}

// dropPrivileges limits this thread's capabilities to defaultCaps, becomes
// uid:gid with no supplementary groups (which, for a uid other than 0,
// clears every capability), and forbids gaining any back through exec.
func dropPrivileges(uid, gid uint32) error {
	keep := map[uintptr]bool{}
	var mask uint64
	for _, c := range defaultCaps {
		keep[c] = true
		mask |= 1 << c
	}
	last, err := lastCap()
	if err != nil {
		return err
	}
	for c := uintptr(0); c <= last; c++ {
		if keep[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setgid(int(gid)); err != nil {
		return fmt.Errorf("setgid %d: %w", gid, err)
	}
	if err := syscall.Setuid(int(uid)); err != nil {
		return fmt.Errorf("setuid %d: %w", uid, err)
	}
	if uid != 0 {
		return nil
	}
	// Still root: keep only the default set, in every set exec carries over.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: uint32(mask), Permitted: uint32(mask), Inheritable: uint32(mask)},
		{Effective: uint32(mask >> 32), Permitted: uint32(mask >> 32), Inheritable: uint32(mask >> 32)},
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

func lastCap() (uintptr, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("read cap_last_cap: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 || n > 63 {
		return 0, fmt.Errorf("cap_last_cap %q", strings.TrimSpace(string(b)))
	}
	return uintptr(n), nil
}
