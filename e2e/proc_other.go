//go:build e2e && !linux

package e2e

import "syscall"

// sysProcAttr: without a parent-death signal, agents rely on t.Cleanup.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
