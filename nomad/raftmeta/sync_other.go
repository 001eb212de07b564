//go:build !linux

package raftmeta

import (
	"fmt"
	"os"
	"path/filepath"
)

// datasync writes f to disk.
func datasync(f *os.File) error { return f.Sync() }

// lockDir opens dir's lock file. Other systems get no lock: Roam's servers
// run on Linux.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("raftmeta: %w", err)
	}
	return f, nil
}
