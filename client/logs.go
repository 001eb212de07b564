package client

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/roamhq/roam/structs"
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
	f, pos, size, err := m.openLog(allocID, task, stream, origin, offset)
	if err != nil {
		return nil, err
	}
	// Bound the read to the size seen now, so a caller gets a consistent
	// snapshot of a log that is still growing.
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, size-pos), f}, nil
}

// openLog opens a task's log positioned where origin and offset say, and
// returns that position and the log's size.
func (m *allocManager) openLog(allocID, task, stream, origin string, offset int64) (*os.File, int64, int64, error) {
	if stream != "stdout" && stream != "stderr" {
		return nil, 0, 0, fmt.Errorf("%w: stream %q is not stdout or stderr", ErrBadLogRequest, stream)
	}
	if origin != "start" && origin != "end" {
		return nil, 0, 0, fmt.Errorf("%w: origin %q is not start or end", ErrBadLogRequest, origin)
	}
	if offset < 0 {
		return nil, 0, 0, fmt.Errorf("%w: offset %d is negative", ErrBadLogRequest, offset)
	}
	ar := m.getRunner(allocID)
	if ar == nil {
		return nil, 0, 0, fmt.Errorf("alloc %s: %w", allocID, ErrUnknownAlloc)
	}
	tr := ar.lookupTask(task)
	if tr == nil {
		return nil, 0, 0, fmt.Errorf("alloc %s: task %q: %w", allocID, task, ErrUnknownTask)
	}
	path := tr.dirs.Stdout
	if stream == "stderr" {
		path = tr.dirs.Stderr
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, 0, fmt.Errorf("alloc %s: task %q: %s: %w", allocID, task, stream, ErrNoLogs)
	}
	if err != nil {
		return nil, 0, 0, fmt.Errorf("alloc %s: task %q: open %s: %w", allocID, task, stream, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, 0, fmt.Errorf("alloc %s: task %q: stat %s: %w", allocID, task, stream, err)
	}
	size := fi.Size()
	pos := min(offset, size)
	if origin == "end" {
		pos = max(size-offset, 0)
	}
	if _, err := f.Seek(pos, io.SeekStart); err != nil {
		f.Close()
		return nil, 0, 0, fmt.Errorf("alloc %s: task %q: seek %s: %w", allocID, task, stream, err)
	}
	return f, pos, size, nil
}

// ClientAllocs serves the servers' calls about this node's allocations.
// Only servers reach it: it is served on the session this node opened.
type ClientAllocs struct {
	c *Client
}

// Logs reads one piece of a task's log, at most args.Limit bytes (and
// never more than structs.MaxLogChunk). A server relays log requests
// here, so that they reach the node over its own session and never an
// address the node reported about itself.
func (a *ClientAllocs) Logs(args *structs.AllocLogsRequest, reply *structs.AllocLogsResponse) error {
	if a.c.allocs == nil {
		return fmt.Errorf("%w: alloc %s: %w", structs.ErrNotFound, args.AllocID, ErrUnknownAlloc)
	}
	limit := args.Limit
	if limit <= 0 || limit > structs.MaxLogChunk {
		limit = structs.MaxLogChunk
	}
	f, pos, size, err := a.c.allocs.openLog(args.AllocID, args.Task, args.Stream, args.Origin, args.Offset)
	if err != nil {
		return logRPCError(err)
	}
	defer f.Close()
	buf := make([]byte, min(int64(limit), size-pos))
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return fmt.Errorf("alloc %s: task %q: read %s: %w", args.AllocID, args.Task, args.Stream, err)
	}
	*reply = structs.AllocLogsResponse{Data: buf[:n], Offset: pos, Size: size}
	return nil
}

// logRPCError gives a log error the sentinel the server's caller maps to
// an HTTP status.
func logRPCError(err error) error {
	switch {
	case errors.Is(err, ErrUnknownAlloc), errors.Is(err, ErrUnknownTask),
		errors.Is(err, ErrNoLogs), errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %w", structs.ErrNotFound, err)
	case errors.Is(err, ErrBadLogRequest):
		return fmt.Errorf("%w: %w", structs.ErrInvalidRequest, err)
	}
	return err
}
