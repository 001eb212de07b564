package client

import (
	"os"
	"testing"

	"github.com/roamhq/roam/client/driver/rawexec"
)

// The test binary doubles as the raw_exec executor, so test agents run
// real tasks.
func TestMain(m *testing.M) { os.Exit(rawexec.RunTestMain(m)) }
