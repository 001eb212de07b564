package agent

import (
	"os"
	"strings"
	"testing"

	"github.com/roamhq/roam/client/driver/rawexec"
)

// envExecutor makes the test binary act as the raw_exec executor, as the
// roam binary does for `roam executor <spec>`: a test agent's client runs
// its own executable to supervise tasks.
const envExecutor = "ROAM_TEST_EXECUTOR"

func TestMain(m *testing.M) {
	if os.Getenv(envExecutor) != "" && len(os.Args) == 3 && os.Args[1] == "executor" {
		os.Exit(rawexec.RunExecutor(os.Args[2]))
	}
	os.Setenv(envExecutor, "1")
	// A race-enabled executor otherwise sleeps a second at exit.
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	os.Exit(m.Run())
}
