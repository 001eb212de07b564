package exec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/roamhq/roam/client/driver/rawexec"
)

// initEnv marks the process the launcher starts as exec-init, for binaries
// (test binaries) that have no `exec-init` command of their own.
const initEnv = "ROAM_EXEC_INIT"

// DefaultCgroupParent is where, below each hierarchy's root, the tasks'
// cgroups are made.
const DefaultCgroupParent = "/roam"

// secretsSize bounds a task's secrets/ tmpfs, as Nomad's.
const secretsSize = "1m"

// Errors returned by Start; compare with errors.Is.
var (
	// ErrDeniedUser means the client refuses to run tasks as that user.
	ErrDeniedUser = errors.New("user is denied by the client's user.denylist")
	// ErrBadResources means the task's resources cannot be enforced.
	ErrBadResources = errors.New("invalid resources")
)

// Config configures a Driver.
type Config struct {
	// ExecutorPath, StartTimeout and Logger are as in rawexec.Config.
	ExecutorPath string
	StartTimeout time.Duration
	Logger       hclog.Logger
	// ChrootEnv maps host paths to where a task sees them, read-only; nil
	// means DefaultChrootEnv.
	ChrootEnv map[string]string
	// PidsLimit is the limit of a task that sets none; 0 means
	// DefaultPidsLimit.
	PidsLimit int64
	// CgroupParent is where tasks' cgroups are made; empty means
	// DefaultCgroupParent.
	CgroupParent string
	// UserDenylist are accounts tasks may not run as.
	UserDenylist []string
}

// Driver starts exec tasks. Like rawexec's it keeps no state of its own.
type Driver struct {
	sup       *rawexec.Driver
	chroot    []mount
	chrootEnv map[string]string
	pids      int64
	parent    string
	denied    []string
	logger    hclog.Logger
}

// New returns a driver.
func New(cfg Config) (*Driver, error) {
	sup, err := rawexec.New(rawexec.Config{ExecutorPath: cfg.ExecutorPath, StartTimeout: cfg.StartTimeout, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	env := cfg.ChrootEnv
	if env == nil {
		env = DefaultChrootEnv()
	}
	chroot, err := chrootMounts(env)
	if err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	d := &Driver{sup: sup, chroot: chroot, chrootEnv: env, pids: cfg.PidsLimit, parent: cfg.CgroupParent, denied: cfg.UserDenylist, logger: cfg.Logger}
	if d.pids < 0 {
		return nil, fmt.Errorf("exec: pids limit %d is negative", d.pids)
	}
	if d.pids == 0 {
		d.pids = DefaultPidsLimit
	}
	if d.parent == "" {
		d.parent = DefaultCgroupParent
	}
	if !strings.HasPrefix(d.parent, "/") || filepath.Clean(d.parent) != d.parent {
		return nil, fmt.Errorf("exec: cgroup parent %q is not a clean absolute path", d.parent)
	}
	if d.logger == nil {
		d.logger = hclog.NewNullLogger()
	}
	return d, nil
}

// VolumeMount is a host directory bound into the task.
type VolumeMount struct {
	Source      string
	Destination string
	ReadOnly    bool
}

// TaskConfig describes one task to start.
type TaskConfig struct {
	// ID names the task (alloc ID and task name) and its cgroup.
	ID string
	// Command is the program as the task sees it: absolute, relative to
	// the task's root, or a bare name looked up in PATH inside the task.
	Command string
	Args    []string
	Env     map[string]string
	// User is the account the task runs as; empty means DefaultUser.
	User string
	// Dir is the task directory, which becomes the task's "/"; SharedDir
	// is the allocation's shared directory, seen as /alloc.
	Dir         string
	SharedDir   string
	StdoutPath  string
	StderrPath  string
	KillSignal  string
	KillTimeout time.Duration
	Resources   Resources
	Volumes     []VolumeMount
}

// TaskUser is the account a task runs as.
func TaskUser(named string) string {
	if named != "" {
		return named
	}
	return DefaultUser
}

// Start starts the task isolated and returns once it runs.
func (d *Driver) Start(ctx context.Context, cfg TaskConfig) (*rawexec.Handle, error) {
	fail := func(err error) (*rawexec.Handle, error) {
		return nil, fmt.Errorf("exec: start task %q: %w", cfg.ID, err)
	}
	if cfg.ID == "" {
		return nil, errors.New("exec: task ID is empty")
	}
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) {
		return fail(fmt.Errorf("task dir %q is not absolute", cfg.Dir))
	}
	if err := cfg.Resources.validate(); err != nil {
		return fail(fmt.Errorf("%w: %w", ErrBadResources, err))
	}
	user := TaskUser(cfg.User)
	if slices.Contains(d.denied, user) {
		return fail(fmt.Errorf("task user %q: %w", user, ErrDeniedUser))
	}
	uid, gid, err := rawexec.LookupUser(user)
	if err != nil {
		return fail(err)
	}
	command, err := d.resolveCommand(cfg.Command, cfg.Dir, cfg.Env)
	if err != nil {
		return fail(err)
	}
	if err := makeTmp(cfg.Dir); err != nil {
		return fail(err)
	}
	mounts := append([]mount(nil), d.chroot...)
	if cfg.SharedDir != "" {
		mounts = append(mounts, mount{Kind: mountBind, Source: cfg.SharedDir, Target: "alloc"})
	}
	mounts = append(mounts,
		mount{Kind: mountTmpfs, Target: "secrets", Data: fmt.Sprintf("mode=0700,uid=%d,gid=%d,size=%s", uid, gid, secretsSize)},
		// The executor's own files are the client's business.
		mount{Kind: mountTmpfs, Target: ".rawexec", ReadOnly: true, Data: "mode=0555,size=4k"},
	)
	for _, v := range cfg.Volumes {
		rel, err := cleanTarget(v.Destination)
		if err != nil {
			return fail(fmt.Errorf("volume mount: %w", err))
		}
		mounts = append(mounts, mount{Kind: mountBind, Source: v.Source, Target: rel, ReadOnly: v.ReadOnly})
	}
	r := cfg.Resources
	cg := cgroupConfig{
		Path:        d.parent + "/" + cgroupName(cfg.ID),
		MemoryBytes: int64(r.MemoryMB) << 20,
		CPUShares:   uint64(max(r.CPU, 2)),
		PidsLimit:   d.pids,
	}
	if r.MemoryMaxMB > r.MemoryMB {
		cg.MemoryBytes = int64(r.MemoryMaxMB) << 20
		cg.MemoryReservationBytes = int64(r.MemoryMB) << 20
	}
	if r.PidsLimit > 0 {
		cg.PidsLimit = r.PidsLimit
	}
	return d.sup.Start(ctx, rawexec.TaskConfig{
		ID:          cfg.ID,
		Command:     command,
		Args:        cfg.Args,
		Env:         cfg.Env,
		Dir:         cfg.Dir,
		StdoutPath:  cfg.StdoutPath,
		StderrPath:  cfg.StderrPath,
		KillSignal:  cfg.KillSignal,
		KillTimeout: cfg.KillTimeout,
		Launcher:    LauncherName,
		LaunchConfig: launchConfig{
			Root: cfg.Dir, Mounts: mounts, UID: uid, GID: gid, Cgroup: cg,
		},
	})
}

// Reattach re-attaches to a task started by an earlier driver.
//
// A task whose executor is gone (killed with -9, say) has nobody left to
// record its exit or to empty and remove its cgroup: Reattach kills the
// cgroup, every process in it, removes it, and returns an error that
// wraps rawexec.ErrTaskGone, so the task is restarted by its policy.
func (d *Driver) Reattach(st rawexec.HandleState) (*rawexec.Handle, error) {
	h, err := d.sup.Reattach(st)
	if err == nil && (!h.IsRunning() || h.ExecutorAlive()) {
		return h, nil
	}
	path := d.parent + "/" + cgroupName(st.ID)
	if cerr := removeTaskCgroup(path); cerr != nil {
		d.logger.Warn("could not remove the cgroup of a task without an executor", "task_id", st.ID, "cgroup", path, "error", cerr)
	}
	if err != nil {
		return nil, err
	}
	d.logger.Warn("the task's executor is gone; killed the task and its cgroup", "task_id", st.ID, "cgroup", path)
	return nil, fmt.Errorf("exec: reattach task %q: its executor is gone, the task was killed: %w", st.ID, rawexec.ErrTaskGone)
}

// cgroupName makes a task ID a single cgroup directory name.
func cgroupName(id string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '.'
	}, id)
}

// defaultPath is the PATH inside a task that sets none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// resolveCommand finds the task's program as the task will see it, and
// checks it on the host through the chroot_env that maps it there, so that
// a missing command fails now rather than inside the task.
func (d *Driver) resolveCommand(command, taskDir string, env map[string]string) (string, error) {
	if command == "" {
		return "", errors.New("command is empty")
	}
	if strings.Contains(command, "/") {
		inside := filepath.Join("/", command)
		return inside, d.checkInside(inside, taskDir)
	}
	path := env["PATH"]
	if path == "" {
		path = os.Getenv("PATH")
	}
	if path == "" {
		path = defaultPath
	}
	var firstErr error
	for _, p := range filepath.SplitList(path) {
		if !filepath.IsAbs(p) {
			continue
		}
		cand := filepath.Join(p, command)
		err := d.checkInside(cand, taskDir)
		if err == nil {
			return cand, nil
		}
		if firstErr == nil && !errors.Is(err, rawexec.ErrCommandNotFound) {
			firstErr = err
		}
	}
	if firstErr != nil {
		return "", firstErr
	}
	return "", fmt.Errorf("%q is not in the task's PATH: %w", command, rawexec.ErrCommandNotFound)
}

// checkInside checks that inside, a path in the task, is an executable
// file where the task will find it: under a chroot_env directory or in the
// task directory.
func (d *Driver) checkInside(inside, taskDir string) error {
	host := ""
	best := -1
	for src, dst := range d.chrootEnv {
		dst = filepath.Join("/", dst)
		if rest, ok := strings.CutPrefix(inside, dst); ok && (rest == "" || rest[0] == '/') && len(dst) > best {
			host, best = filepath.Join(src, rest), len(dst)
		}
	}
	if host == "" {
		// In the task's own directory, which the task may fill with
		// links: look through an os.Root so none leads out of it.
		root, err := os.OpenRoot(taskDir)
		if err != nil {
			return err
		}
		defer root.Close()
		rel := strings.TrimLeft(inside, "/")
		fi, err := root.Stat(rel)
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s: %w", inside, rawexec.ErrCommandNotFound)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", inside, err)
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("%s: %w", inside, rawexec.ErrNotExecutable)
		}
		return nil
	}
	fi, err := os.Stat(host)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s: %w", inside, rawexec.ErrCommandNotFound)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", inside, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is a %s: %w", inside, fi.Mode().Type(), rawexec.ErrNotExecutable)
	}
	if err := unix.Access(host, unix.X_OK); err != nil {
		return fmt.Errorf("%s: %v: %w", inside, err, rawexec.ErrNotExecutable)
	}
	return nil
}

// makeTmp gives the task a world-writable, sticky /tmp in its directory,
// through an os.Root on it.
func makeTmp(taskDir string) error {
	root, err := os.OpenRoot(taskDir)
	if err != nil {
		return fmt.Errorf("task dir: %w", err)
	}
	defer root.Close()
	if err := root.Mkdir("tmp", 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create tmp: %w", err)
	}
	fi, err := root.Lstat("tmp")
	if err != nil {
		return fmt.Errorf("tmp: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("tmp in the task dir is a %s, not a directory", fi.Mode().Type())
	}
	if err := root.Chmod("tmp", 0o777|os.ModeSticky); err != nil {
		return fmt.Errorf("chmod tmp: %w", err)
	}
	return nil
}

// Usage is a task's cgroup counters at one moment: memory in bytes, CPU
// in nanoseconds since the task started.
type Usage struct {
	Time                                          time.Time
	MemoryUsage, MemoryMaxUsage, RSS, Cache, Swap uint64
	KernelUsage                                   uint64
	CPUTotal, CPUUser, CPUSystem                  uint64
	ThrottledPeriods, ThrottledTime               uint64
}

// Usage reads the counters of the task's cgroup; the task is named by the
// ID it was started with.
func (d *Driver) Usage(taskID string) (*Usage, error) {
	return cgroupUsage(d.parent + "/" + cgroupName(taskID))
}
