//go:build e2e && linux

package e2e

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// fsWatch records, with inotify, every entry created, removed or moved
// under a set of directories whose name is one of a few, and every change
// at all inside a few other directories: a path that appears outside the
// data dirs and is gone again a moment later (a mount target created, then
// removed on unpublish) shows here although it is gone by the time anyone
// looks.
type fsWatch struct {
	fd    int
	dirs  map[int]string // watch descriptor: directory
	names map[string]bool
	whole map[int]bool
	stop  chan struct{}
	done  chan struct{}

	mu  sync.Mutex
	got []string
}

// fsWatchGap is how often the watch drains its inotify queue.
const fsWatchGap = 20 * time.Millisecond

// watchFS watches dirs for entries named in names, and whole for any
// change (their own removal included).
func watchFS(dirs []string, names []string, whole []string) (*fsWatch, error) {
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &fsWatch{fd: fd, dirs: map[int]string{}, names: map[string]bool{}, whole: map[int]bool{},
		stop: make(chan struct{}), done: make(chan struct{})}
	for _, n := range names {
		w.names[n] = true
	}
	const entries = syscall.IN_CREATE | syscall.IN_DELETE | syscall.IN_MOVED_FROM | syscall.IN_MOVED_TO
	const all = entries | syscall.IN_MODIFY | syscall.IN_ATTRIB | syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF
	for _, d := range dirs {
		wd, err := syscall.InotifyAddWatch(fd, d, entries)
		if err != nil {
			continue // a directory that does not exist cannot gain an entry
		}
		w.dirs[wd] = d
	}
	for _, d := range whole {
		wd, err := syscall.InotifyAddWatch(fd, d, all)
		if err != nil {
			syscall.Close(fd)
			return nil, fmt.Errorf("inotify %s: %w", d, err)
		}
		w.dirs[wd] = d
		w.whole[wd] = true
	}
	go w.run()
	return w, nil
}

func (w *fsWatch) run() {
	defer close(w.done)
	buf := make([]byte, 64<<10)
	for {
		for {
			n, err := syscall.Read(w.fd, buf)
			if err != nil || n <= 0 {
				if err != nil && !errors.Is(err, syscall.EAGAIN) {
					w.note(fmt.Sprintf("inotify read: %v", err))
				}
				break
			}
			w.parse(buf[:n])
		}
		select {
		case <-w.stop:
			return
		case <-time.After(fsWatchGap):
		}
	}
}

func (w *fsWatch) parse(b []byte) {
	for len(b) >= syscall.SizeofInotifyEvent {
		ev := (*syscall.InotifyEvent)(unsafe.Pointer(&b[0]))
		end := syscall.SizeofInotifyEvent + int(ev.Len)
		if end > len(b) {
			return
		}
		name := string(b[syscall.SizeofInotifyEvent:end])
		for len(name) > 0 && name[len(name)-1] == 0 {
			name = name[:len(name)-1]
		}
		b = b[end:]
		if ev.Mask&syscall.IN_Q_OVERFLOW != 0 {
			w.note("inotify queue overflowed: events were lost")
			continue
		}
		dir := w.dirs[int(ev.Wd)]
		if !w.whole[int(ev.Wd)] && !w.names[name] {
			continue
		}
		w.note(fmt.Sprintf("%s %s", maskString(ev.Mask), filepath.Join(dir, name)))
	}
}

func (w *fsWatch) note(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got = append(w.got, s)
}

// events returns what the watch saw so far.
func (w *fsWatch) events() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.got...)
}

// close stops the watch.
func (w *fsWatch) close() {
	close(w.stop)
	<-w.done
	syscall.Close(w.fd)
}

func maskString(m uint32) string {
	for _, f := range []struct {
		bit  uint32
		name string
	}{
		{syscall.IN_CREATE, "created"}, {syscall.IN_DELETE, "removed"},
		{syscall.IN_MOVED_FROM, "moved away"}, {syscall.IN_MOVED_TO, "moved in"},
		{syscall.IN_MODIFY, "modified"}, {syscall.IN_ATTRIB, "attributes changed"},
		{syscall.IN_DELETE_SELF, "removed itself"}, {syscall.IN_MOVE_SELF, "moved itself"},
	} {
		if m&f.bit != 0 {
			return f.name
		}
	}
	return fmt.Sprintf("event %#x", m)
}
