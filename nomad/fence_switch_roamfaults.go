//go:build roamfaults

package nomad

import (
	"os"
	"sync"
)

// controllerFenceDisabled reads EnvDisableControllerFence once. This file
// is built only with the roamfaults tag, for the e2e scenarios that show a
// missing fence is caught.
var controllerFenceDisabled = sync.OnceValue(func() bool { return os.Getenv(EnvDisableControllerFence) == "1" })

// raftLogGuardDisabled reads EnvDisableRaftLogGuard once.
var raftLogGuardDisabled = sync.OnceValue(func() bool { return os.Getenv(EnvDisableRaftLogGuard) == "1" })
