package raftmeta

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// datasync writes f's data (and its size, if it grew) to disk, not its
// timestamps.
func datasync(f *os.File) error {
	return syscall.Fdatasync(int(f.Fd()))
}

// lockDir takes an exclusive lock on dir's lock file, so that two
// processes never write one store.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("raftmeta: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("raftmeta: %s is in use by another process", dir)
		}
		return nil, fmt.Errorf("raftmeta: lock %s: %w", dir, err)
	}
	return f, nil
}
