package rawexec

import (
	"os"
	"strings"
)

// testExecutorEnv marks a test binary that may be started as an executor.
const testExecutorEnv = "ROAM_TEST_EXECUTOR"

// RunTestMain lets a package's test binary double as the executor, as the
// roam binary does for `roam executor <spec>`, so tests that run real
// tasks need not build roam: clients under test point ExecutorPath (or
// default to) os.Args[0]. Call it from a package's TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(rawexec.RunTestMain(m)) }
func RunTestMain(m interface{ Run() int }) int {
	if os.Getenv(testExecutorEnv) != "" && len(os.Args) == 3 && os.Args[1] == "executor" {
		return RunExecutor(os.Args[2])
	}
	// Executors inherit these. A race-enabled binary otherwise sleeps a
	// second at exit, which every task exit would pay.
	os.Setenv(testExecutorEnv, "1")
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return m.Run()
}
