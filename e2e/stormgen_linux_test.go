//go:build e2e && storm && linux

package e2e

import "syscall"

// stormGenProcAttr starts the storm's generator in a session of its own,
// and has the kernel kill it if the test binary dies.
//
// With autogroup scheduling (Linux's default on desktops and on these
// machines: /proc/sys/kernel/sched_autogroup_enabled), the CPU is shared
// fairly between sessions, not processes, and everything a test starts is
// in the test's session: under load the session gets a fixed share, and
// every millisecond the generator ran came out of the agents' share, as
// no remote attacker's would. In a session of its own it competes with
// the cluster as another user of the machine does; what the agents spend
// on its traffic is still theirs.
func stormGenProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
}
