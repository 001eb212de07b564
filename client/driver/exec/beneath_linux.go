package exec

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// resolveBeneath is how every path under a task's root is opened: never
// through a symlink, never out of the root.
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openBeneath opens rel, a clean relative path, under the directory rootFD
// as an O_PATH descriptor. Missing directories on the way are created
// (mode 0755, owned by the caller); a missing last component is created
// as a directory, or as an empty file when file is set. A symlink anywhere
// on the way is refused, so nothing a task left in its directory can lead
// a mount elsewhere.
func openBeneath(rootFD int, rel string, file bool) (int, error) {
	parts := strings.Split(rel, "/")
	fd, err := unix.Dup(rootFD)
	if err != nil {
		return -1, err
	}
	for i, p := range parts {
		last := i == len(parts)-1
		next, err := openat2(fd, p)
		if errors.Is(err, unix.ENOENT) {
			if last && file {
				var f int
				f, err = unix.Openat(fd, p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
				if err == nil {
					unix.Close(f)
				}
			} else {
				err = unix.Mkdirat(fd, p, 0o755)
			}
			if err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(fd)
				return -1, fmt.Errorf("create %s: %w", strings.Join(parts[:i+1], "/"), err)
			}
			next, err = openat2(fd, p)
		}
		unix.Close(fd)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
				return -1, fmt.Errorf("open %s: a symlink is in the way: %w", strings.Join(parts[:i+1], "/"), err)
			}
			return -1, fmt.Errorf("open %s: %w", strings.Join(parts[:i+1], "/"), err)
		}
		fd = next
	}
	return fd, nil
}

func openat2(dirFD int, name string) (int, error) {
	for {
		fd, err := unix.Openat2(dirFD, name, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_CLOEXEC,
			Resolve: resolveBeneath,
		})
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		return fd, err
	}
}

// fdPath names an open descriptor as a path mount(2) accepts.
func fdPath(fd int) string { return fmt.Sprintf("/proc/self/fd/%d", fd) }
