//go:build e2e && linux

package e2e

import "syscall"

// sysProcAttr has the kernel kill an agent if the test binary dies (a test
// timeout panics without running cleanups), so no agent outlives the run.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
