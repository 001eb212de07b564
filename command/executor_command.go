package command

import (
	"fmt"
	"io"

	"github.com/roamhq/roam/client/driver/rawexec"
)

func init() {
	// Internal: the client's raw_exec driver runs the roam binary with this
	// command to supervise one task. The command table has no notion of a
	// hidden command, so the synopsis warns people off instead.
	register("executor", &Command{
		Synopsis: "Internal: supervise one raw_exec task (started by the client)",
		Hidden:   true,
		Run:      runExecutor,
	})
}

const executorUsage = `Usage: roam executor SPEC-FILE

  Internal command. The client's raw_exec driver starts it to run one task,
  described by SPEC-FILE, in a session of its own, so that the task survives
  a restart of the client. Not meant to be run by hand.
`

func runExecutor(args []string, out, errOut io.Writer) int {
	if len(args) != 1 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		fmt.Fprint(errOut, executorUsage)
		return 1
	}
	return rawexec.RunExecutor(args[0])
}
