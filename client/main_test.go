package client

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	execdriver "github.com/roamhq/roam/client/driver/exec"
	"github.com/roamhq/roam/plugins/csi/hostpath"
)

// testCSIPluginEnv makes the test binary a hostpath CSI plugin serving on
// $CSI_ENDPOINT, with node ID and state dir from the variables below,
// until SIGINT or SIGTERM: a task that is a plugin, without building roam.
const (
	testCSIPluginEnv      = "ROAM_TEST_CSI_PLUGIN"
	testCSIPluginNodeEnv  = "ROAM_TEST_CSI_NODE_ID"
	testCSIPluginStateEnv = "ROAM_TEST_CSI_STATE_DIR"
)

// The test binary doubles as the raw_exec executor, so test agents run
// real tasks, and as a CSI plugin for plugin tasks.
func TestMain(m *testing.M) {
	if os.Getenv(testCSIPluginEnv) != "" {
		os.Exit(serveTestCSIPlugin())
	}
	os.Exit(execdriver.RunTestMain(m))
}

func serveTestCSIPlugin() int {
	cfg := hostpath.DefaultConfig()
	cfg.Endpoint = os.Getenv("CSI_ENDPOINT")
	cfg.NodeID = os.Getenv(testCSIPluginNodeEnv)
	cfg.StateDir = os.Getenv(testCSIPluginStateEnv)
	cfg.Mode = hostpath.ModeMonolith
	p, err := hostpath.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "test csi plugin:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := p.Serve(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "test csi plugin:", err)
		return 1
	}
	return 0
}
