package client

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"

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

// allocFS answers one fs request for an allocation this client runs. Every
// path is opened beneath the allocation directory: a link that leads out
// of it is not followed.
func (m *allocManager) allocFS(req *structs.AllocFSRequest) (*structs.AllocFSResponse, error) {
	ar := m.getRunner(req.AllocID)
	if ar == nil || ar.allocDir == "" {
		return nil, fmt.Errorf("%w: %s", ErrUnknownAlloc, req.AllocID)
	}
	rel, err := fsPath(req.Path)
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(ar.allocDir)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnknownAlloc, req.AllocID, err)
	}
	defer root.Close()
	switch req.Op {
	case structs.AllocFSStat:
		fi, err := root.Stat(rel)
		if err != nil {
			return nil, fsErr(req.Path, err)
		}
		return &structs.AllocFSResponse{File: fileInfo(path.Base(rel), fi)}, nil
	case structs.AllocFSList:
		d, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, fsErr(req.Path, err)
		}
		defer d.Close()
		entries, err := d.ReadDir(structs.MaxAllocFSEntries)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		out := &structs.AllocFSResponse{Files: []*structs.AllocFileInfo{}}
		for _, e := range entries {
			if e.Name() == ".rawexec" || (strings.Count(rel, "/") == 0 && rel != "." && e.Name() == secretsDirName) {
				continue
			}
			fi, err := e.Info()
			if err != nil {
				continue // gone since the listing
			}
			out.Files = append(out.Files, fileInfo(e.Name(), fi))
		}
		sort.Slice(out.Files, func(i, j int) bool { return out.Files[i].Name < out.Files[j].Name })
		return out, nil
	case structs.AllocFSCat:
		f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, fsErr(req.Path, err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return nil, err
		}
		if fi.IsDir() {
			return nil, fmt.Errorf("%w: %q is a directory", ErrBadLogRequest, req.Path)
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("%w: %q is not a regular file", ErrBadLogRequest, req.Path)
		}
		limit := req.Limit
		if limit <= 0 || limit > structs.MaxLogChunk {
			limit = structs.MaxLogChunk
		}
		if req.Offset < 0 {
			return nil, fmt.Errorf("%w: negative offset", ErrBadLogRequest)
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

// fsErr names a path that leads out of the allocation directory (through
// a link) as denied; os.Root has no exported error for it.
func fsErr(p string, err error) error {
	if err != nil && strings.Contains(err.Error(), "path escapes from parent") {
		return fmt.Errorf("%w: %q leads out of the allocation directory", ErrFSDenied, p)
	}
	return err
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
