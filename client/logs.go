package client

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Errors from AllocLogs; compare with errors.Is.
var (
	// ErrUnknownAlloc means this client does not run the allocation.
	ErrUnknownAlloc = errors.New("unknown allocation")
	// ErrUnknownTask means the allocation has no such task.
	ErrUnknownTask = errors.New("unknown task")
	// ErrNoLogs means the task has not written the log yet (it has not
	// started).
	ErrNoLogs = errors.New("no logs yet")
	// ErrBadLogRequest means the stream, origin or offset is invalid.
	ErrBadLogRequest = errors.New("invalid log request")
)

// AllocLogs opens one of a task's logs: stream is "stdout" or "stderr";
// origin "start" reads from offset bytes after the beginning, "end" from
// offset bytes before the end (clamped to the beginning). The reader ends
// at the log's current end; the caller closes it. Logs live in
// <DataDir>/alloc/<alloc ID>/alloc/logs/<task>.<stream>.0.
func (c *Client) AllocLogs(allocID, task, stream, origin string, offset int64) (io.ReadCloser, error) {
	if c.allocs == nil {
		return nil, fmt.Errorf("alloc %s: %w", allocID, ErrUnknownAlloc)
	}
	return c.allocs.allocLogs(allocID, task, stream, origin, offset)
}

func (m *allocManager) allocLogs(allocID, task, stream, origin string, offset int64) (io.ReadCloser, error) {
	if stream != "stdout" && stream != "stderr" {
		return nil, fmt.Errorf("%w: stream %q is not stdout or stderr", ErrBadLogRequest, stream)
	}
	if origin != "start" && origin != "end" {
		return nil, fmt.Errorf("%w: origin %q is not start or end", ErrBadLogRequest, origin)
	}
	if offset < 0 {
		return nil, fmt.Errorf("%w: offset %d is negative", ErrBadLogRequest, offset)
	}
	ar := m.getRunner(allocID)
	if ar == nil {
		return nil, fmt.Errorf("alloc %s: %w", allocID, ErrUnknownAlloc)
	}
	tr := ar.lookupTask(task)
	if tr == nil {
		return nil, fmt.Errorf("alloc %s: task %q: %w", allocID, task, ErrUnknownTask)
	}
	path := tr.dirs.Stdout
	if stream == "stderr" {
		path = tr.dirs.Stderr
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("alloc %s: task %q: %s: %w", allocID, task, stream, ErrNoLogs)
	}
	if err != nil {
		return nil, fmt.Errorf("alloc %s: task %q: open %s: %w", allocID, task, stream, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("alloc %s: task %q: stat %s: %w", allocID, task, stream, err)
	}
	size := fi.Size()
	pos := min(offset, size)
	if origin == "end" {
		pos = max(size-offset, 0)
	}
	if _, err := f.Seek(pos, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("alloc %s: task %q: seek %s: %w", allocID, task, stream, err)
	}
	// Bound the read to the size seen now, so a caller gets a consistent
	// snapshot of a log that is still growing.
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, size-pos), f}, nil
}
