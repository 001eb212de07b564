package exec

import (
	"os"

	"github.com/roamhq/roam/client/driver/rawexec"
)

// RunTestMain is rawexec.RunTestMain for test binaries that also run exec
// tasks: the binary then doubles as exec-init too.
//
//	func TestMain(m *testing.M) { os.Exit(exec.RunTestMain(m)) }
func RunTestMain(m interface{ Run() int }) int {
	if os.Getenv(initEnv) != "" && len(os.Args) == 2 && os.Args[1] == "exec-init" {
		return RunInit()
	}
	return rawexec.RunTestMain(m)
}
