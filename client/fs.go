package client

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/roamhq/roam/structs"
)

// ErrFSDenied is a path of the allocation directory the fs API does not
// read: a task's secrets/ and the executor's .rawexec/.
var ErrFSDenied = errors.New("reading this path is not allowed")

// fsPath cleans a path of the allocation directory given by a caller
// ("" and "/" are the directory itself) and refuses what leaves it or
// reaches a task's secrets or the executor's files.
func fsPath(p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%w: path holds a NUL byte", ErrBadLogRequest)
	}
	clean := path.Clean("/" + p)[1:]
	if clean == "" {
		clean = "."
	}
	parts := strings.Split(clean, "/")
	for i, part := range parts {
		if part == ".rawexec" || (i == 1 && part == secretsDirName) {
			return "", fmt.Errorf("%w: %q", ErrFSDenied, p)
		}
	}
	return clean, nil
}

func fileInfo(name string, fi fs.FileInfo) *structs.AllocFileInfo {
	return &structs.AllocFileInfo{Name: name, IsDir: fi.IsDir(), Size: fi.Size(), FileMode: fi.Mode().String(), ModTime: fi.ModTime()}
}

// deniedRel reports whether a clean path relative to the allocation
// directory lies in a task's secrets/ or the executor's .rawexec/.
func deniedRel(rel string) bool {
	for i, part := range strings.Split(rel, "/") {
		if part == ".rawexec" || (i == 1 && part == secretsDirName) {
			return true
		}
	}
	return false
}

// openChecked opens rel beneath the allocation directory dirFD without
// following anything out of it (openat2 RESOLVE_BENEATH), as O_PATH, which
// has no effect on the file (a device or FIFO is not really opened). A
// link inside the directory is followed; what it resolves to is checked
// again, so that no link leads into a task's secrets/ or .rawexec/.
func openChecked(dirFD int, realDir, p, rel string) (*os.File, fs.FileInfo, error) {
	fd, err := unix.Openat2(dirFD, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case errors.Is(err, unix.EXDEV):
		return nil, nil, fmt.Errorf("%w: %q leads out of the allocation directory", ErrFSDenied, p)
	case errors.Is(err, unix.ENOENT):
		return nil, nil, fmt.Errorf("%q: %w", p, fs.ErrNotExist)
	case err != nil:
		return nil, nil, fmt.Errorf("%q: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	real, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	r, err := filepath.Rel(realDir, real)
	if err != nil || r == ".." || strings.HasPrefix(r, "../") || deniedRel(r) {
		f.Close()
		return nil, nil, fmt.Errorf("%w: %q", ErrFSDenied, p)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// reopen opens an O_PATH descriptor for reading, without blocking on a
// FIFO and without making a tty the controlling one.
func reopen(fd int, flags int) (*os.File, error) {
	return os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), flags|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
}

// allocFS answers one fs request for an allocation this client runs.
func (m *allocManager) allocFS(req *structs.AllocFSRequest) (*structs.AllocFSResponse, error) {
	ar := m.getRunner(req.AllocID)
	if ar == nil || ar.allocDir == "" {
		return nil, fmt.Errorf("%w: %s", ErrUnknownAlloc, req.AllocID)
	}
	rel, err := fsPath(req.Path)
	if err != nil {
		return nil, err
	}
	realDir, err := filepath.EvalSymlinks(ar.allocDir)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnknownAlloc, req.AllocID, err)
	}
	dirFD, err := unix.Open(realDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnknownAlloc, req.AllocID, err)
	}
	defer unix.Close(dirFD)
	pf, fi, err := openChecked(dirFD, realDir, req.Path, rel)
	if err != nil {
		return nil, err
	}
	defer pf.Close()
	fd := int(pf.Fd())
	switch req.Op {
	case structs.AllocFSStat:
		return &structs.AllocFSResponse{File: fileInfo(path.Base(rel), fi)}, nil
	case structs.AllocFSList:
		if !fi.IsDir() {
			return nil, fmt.Errorf("%w: %q is not a directory", ErrBadLogRequest, req.Path)
		}
		d, err := reopen(fd, os.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		entries, err := d.ReadDir(structs.MaxAllocFSEntries)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		out := &structs.AllocFSResponse{Files: []*structs.AllocFileInfo{}}
		for _, e := range entries {
			if deniedRel(path.Join(rel, e.Name())) {
				continue
			}
			info, err := e.Info()
			if err != nil {
				continue // gone since the listing
			}
			out.Files = append(out.Files, fileInfo(e.Name(), info))
		}
		sort.Slice(out.Files, func(i, j int) bool { return out.Files[i].Name < out.Files[j].Name })
		return out, nil
	case structs.AllocFSCat:
		if fi.IsDir() {
			return nil, fmt.Errorf("%w: %q is a directory", ErrBadLogRequest, req.Path)
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("%w: %q is not a regular file", ErrBadLogRequest, req.Path)
		}
		if req.Offset < 0 {
			return nil, fmt.Errorf("%w: negative offset", ErrBadLogRequest)
		}
		f, err := reopen(fd, os.O_RDONLY)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		limit := req.Limit
		if limit <= 0 || limit > structs.MaxLogChunk {
			limit = structs.MaxLogChunk
		}
		size := fi.Size()
		off := min(req.Offset, size)
		buf := make([]byte, min(int64(limit), size-off))
		n, err := f.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		return &structs.AllocFSResponse{Data: buf[:n], Offset: off, Size: size}, nil
	}
	return nil, fmt.Errorf("%w: unknown fs operation %q", ErrBadLogRequest, req.Op)
}

// AllocFS reads the directory of an allocation this client runs.
func (c *Client) AllocFS(req *structs.AllocFSRequest) (*structs.AllocFSResponse, error) {
	if c.allocs == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownAlloc, req.AllocID)
	}
	return c.allocs.allocFS(req)
}

// FS reads an allocation's directory for a server relaying an fs request.
func (a *ClientAllocs) FS(args *structs.AllocFSRequest, reply *structs.AllocFSResponse) error {
	r, err := a.c.AllocFS(args)
	if err != nil {
		return fsRPCError(err)
	}
	*reply = *r
	return nil
}

// fsRPCError gives an fs error the sentinel its caller maps to a status.
func fsRPCError(err error) error {
	if errors.Is(err, ErrFSDenied) {
		return fmt.Errorf("%w: %w", structs.ErrPermissionDenied, err)
	}
	return logRPCError(err)
}
