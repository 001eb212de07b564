//go:build e2e && storm && !linux

package e2e

import "syscall"

// stormGenProcAttr: see stormgen_linux_test.go.
func stormGenProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }
