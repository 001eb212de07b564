package command

import (
	"fmt"
	"io"

	execdriver "github.com/roamhq/roam/client/driver/exec"
)

func init() {
	// Internal: the exec driver starts the roam binary with this command as
	// pid 1 of a task's new namespaces, to build its root and exec it.
	register("exec-init", &Command{
		Synopsis: "Internal: set up one exec task's isolation (started by the client)",
		Hidden:   true,
		Run:      runExecInit,
	})
}

const execInitUsage = `Usage: roam exec-init

  Internal command. The client's exec driver starts it in a task's new
  namespaces and cgroup; it reads its configuration from a pipe the driver
  holds, builds the task's root, drops privileges and runs the task. Not
  meant to be run by hand.
`

func runExecInit(args []string, out, errOut io.Writer) int {
	if len(args) != 0 {
		fmt.Fprint(errOut, execInitUsage)
		return 1
	}
	return execdriver.RunInit()
}
