package rawexec

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
)

// A Launcher starts a task some other way than as a plain host process:
// the exec driver uses one to run the task in namespaces and a cgroup. It
// runs inside the executor, so the supervision (state files, re-attach,
// kill, exit status) stays this package's and the isolation stays the
// launcher's.
//
// The executor calls Command, starts the command it returns (adding
// output files and a process group of its own), then Started with the
// new PID; the task must not run its program until Started has returned
// nil. Once the task's main process has exited, and before the exit
// status is recorded, Finished ends whatever is left of the task and may
// add to the result.
type Launcher interface {
	Command(spec LaunchSpec) (*exec.Cmd, error)
	Started(pid int) error
	Finished(res *ExitResult)
}

// LaunchSpec is what a launcher gets of the executor's spec.
type LaunchSpec struct {
	ID      string
	Command string
	Args    []string
	Env     []string
	Dir     string
	// Config is the launcher's own configuration, as its driver gave it.
	Config json.RawMessage
}

// NewLauncherFunc builds a launcher in the executor.
type NewLauncherFunc func() Launcher

var (
	launchersMu sync.Mutex
	launchers   = map[string]NewLauncherFunc{}
)

// RegisterLauncher makes a launcher known to executors of this binary by
// name; drivers register theirs from init. A second registration of a name
// panics.
func RegisterLauncher(name string, f NewLauncherFunc) {
	launchersMu.Lock()
	defer launchersMu.Unlock()
	if _, dup := launchers[name]; dup {
		panic(fmt.Sprintf("rawexec: launcher %q registered twice", name))
	}
	launchers[name] = f
}

func lookupLauncher(name string) (Launcher, error) {
	launchersMu.Lock()
	f, ok := launchers[name]
	launchersMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("launcher %q is not part of this executor binary", name)
	}
	return f(), nil
}

// hostLauncher runs the task as a plain host process: raw_exec.
type hostLauncher struct{}

func (hostLauncher) Command(spec LaunchSpec) (*exec.Cmd, error) {
	return &exec.Cmd{
		Path: spec.Command,
		Args: append([]string{spec.Command}, spec.Args...),
		Env:  spec.Env,
		Dir:  spec.Dir,
	}, nil
}

func (hostLauncher) Started(int) error    { return nil }
func (hostLauncher) Finished(*ExitResult) {}

// ExecutablePath is the binary a launcher re-executes for a stage of its
// own: this process's executable.
func ExecutablePath() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find own executable: %w", err)
	}
	return exe, nil
}
