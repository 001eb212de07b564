//go:build e2e && linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// diskFaults is a directory served through a FUSE passthrough of another,
// with faults to switch at run time: a delay on every fsync, and EIO on
// every write. A server's data dir mounted this way sees a slow disk, or
// one that fails, while everything else on the machine does not.
type diskFaults struct {
	// syncDelay is the delay added to each fsync, in nanoseconds.
	syncDelay atomic.Int64
	// failWrites makes every write answer EIO.
	failWrites atomic.Bool
	// syncs and failed count the fsyncs served and the writes failed.
	syncs, failed atomic.Int64

	server *fuse.Server
	dir    string
}

// mountDiskFaults serves backing at dir (which must exist and be empty)
// until the test ends.
func mountDiskFaults(t *testing.T, backing, dir string) *diskFaults {
	t.Helper()
	d := &diskFaults{dir: dir}
	var st syscall.Stat_t
	if err := syscall.Stat(backing, &st); err != nil {
		t.Fatalf("e2e: disk faults: %v", err)
	}
	root := &fs.LoopbackRoot{Path: backing, Dev: uint64(st.Dev)}
	root.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &faultNode{LoopbackNode: fs.LoopbackNode{RootData: r}, d: d}
	}
	root.RootNode = root.NewNode(root, nil, "", &st)
	zero := time.Duration(0)
	srv, err := fs.Mount(dir, root.RootNode, &fs.Options{
		// No kernel caching of names or attributes: the data dir is
		// only ever used through the mount.
		EntryTimeout: &zero, AttrTimeout: &zero,
		MountOptions: fuse.MountOptions{
			FsName: "roam-e2e-diskfaults", Name: "roamfaults",
			DirectMountStrict: true, AllowOther: true,
		},
	})
	if err != nil {
		t.Fatalf("e2e: mount disk faults on %s: %v", dir, err)
	}
	d.server = srv
	t.Cleanup(func() {
		d.syncDelay.Store(0)
		d.failWrites.Store(false)
		if err := srv.Unmount(); err != nil {
			// Still busy (a process of the test's kept a file open):
			// detach it so nothing outlives the test.
			if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
				t.Errorf("e2e: unmount %s: %v: %s", dir, err, out)
			}
		}
	})
	return d
}

// faultNode is a loopback node whose files go through faultFile.
type faultNode struct {
	fs.LoopbackNode
	d *diskFaults
}

var (
	_ fs.NodeOpener  = (*faultNode)(nil)
	_ fs.NodeCreater = (*faultNode)(nil)
)

func (n *faultNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return n.wrap(fh), fl, 0
}

func (n *faultNode) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ino, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return ino, n.wrap(fh), fl, 0
}

func (n *faultNode) wrap(fh fs.FileHandle) fs.FileHandle {
	lf, ok := fh.(*fs.LoopbackFile)
	if !ok {
		panic(fmt.Sprintf("e2e: disk faults: loopback file handle is %T", fh))
	}
	return &faultFile{LoopbackFile: lf, d: n.d}
}

// faultFile is a loopback file with the faults applied.
type faultFile struct {
	*fs.LoopbackFile
	d *diskFaults
}

func (f *faultFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if f.d.failWrites.Load() {
		f.d.failed.Add(1)
		return 0, syscall.EIO
	}
	return f.LoopbackFile.Write(ctx, data, off)
}

func (f *faultFile) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if d := time.Duration(f.d.syncDelay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return syscall.EINTR
		}
	}
	f.d.syncs.Add(1)
	return f.LoopbackFile.Fsync(ctx, flags)
}

// PassthroughFd keeps the kernel from bypassing Write and Fsync.
func (f *faultFile) PassthroughFd() (int, bool) { return 0, false }

// onDiskFaults moves a's data dir (a stopped agent's) to a backing
// directory and mounts it back through a diskFaults.
func onDiskFaults(t *testing.T, a *Agent) *diskFaults {
	t.Helper()
	backing := a.DataDir + ".backing"
	if err := os.Rename(a.DataDir, backing); err != nil {
		t.Fatalf("e2e: %v", err)
	}
	if err := os.MkdirAll(a.DataDir, 0o700); err != nil {
		t.Fatalf("e2e: %v", err)
	}
	d := mountDiskFaults(t, backing, a.DataDir)
	// Cleanups run last first: this one stops the agent before its disk
	// is unmounted under it, and an agent that cannot stop cleanly then
	// fails the test.
	t.Cleanup(func() {
		if !a.Running() {
			return
		}
		code, killed, err := a.Stop(30 * time.Second)
		if err != nil || killed || code != 0 {
			t.Errorf("e2e: %s on a faulty disk did not stop cleanly: exit code %d, killed %v, %v", a.Name, code, killed, err)
		}
	})
	return d
}
