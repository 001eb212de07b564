package client

import (
	"os"
	"strings"
	"testing"

	"github.com/roamhq/roam/client/driver/rawexec"
)

// envExecutor makes the test binary act as the raw_exec executor, as the
// roam binary does for `roam executor <spec>`, so tests run real tasks
// without building roam. Clients under test set ExecutorPath to os.Args[0].
const envExecutor = "ROAM_TEST_EXECUTOR"

func TestMain(m *testing.M) {
	if os.Getenv(envExecutor) != "" && len(os.Args) == 3 && os.Args[1] == "executor" {
		os.Exit(rawexec.RunExecutor(os.Args[2]))
	}
	// Executors inherit these. A race-enabled binary otherwise sleeps a
	// second at exit, which every task exit would pay.
	os.Setenv(envExecutor, "1")
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	os.Exit(m.Run())
}
