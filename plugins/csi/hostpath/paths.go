package hostpath

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Paths from input. The plugin builds paths from two kinds of input, and
// confines both:
//
//   - Volume and snapshot IDs name directories in StateDir. The plugin
//     makes the IDs itself, but they come back in requests and in a state
//     file that other processes share: each must be one plain file name
//     (entryName), and every file operation under StateDir goes through an
//     os.Root on it, so neither ".." nor a symbolic link leads out.
//   - Staging and target paths come from the CO. A provider cannot know
//     where its CO keeps them, so by default any absolute path outside
//     StateDir is accepted, as the CSI spec expects. With
//     Config.TargetRoot set, each must lie beneath it, and publish and
//     unpublish work through an os.Root on it: a CO's bad path is refused
//     (INVALID_ARGUMENT) instead of followed.

// errNotEntryName is wrapped by entryName's errors.
var errNotEntryName = errors.New("not a plain file name")

// entryName checks that id can name one entry of a directory: not empty,
// not "." or "..", no separator and no NUL.
func entryName(kind, id string) error {
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, "/\\\x00") || !filepath.IsLocal(id) {
		return fmt.Errorf("%s %q: %w", kind, id, errNotEntryName)
	}
	return nil
}

// volumeName is the volume's data dir relative to StateDir.
func volumeName(id string) (string, error) {
	if err := entryName("volume ID", id); err != nil {
		return "", status.Error(codes.InvalidArgument, err.Error())
	}
	return filepath.Join(volumesDir, id), nil
}

// snapshotName is the snapshot's data dir relative to StateDir.
func snapshotName(id string) (string, error) {
	if err := entryName("snapshot ID", id); err != nil {
		return "", status.Error(codes.InvalidArgument, err.Error())
	}
	return filepath.Join(snapshotsDir, id), nil
}

// inStateDir calls fn with an os.Root on the state dir.
func (s *store) inStateDir(fn func(root *os.Root) error) error {
	root, err := os.OpenRoot(s.dir)
	if err != nil {
		return fmt.Errorf("opening state dir: %w", err)
	}
	defer root.Close()
	return fn(root)
}

// volumeDirMode is a new volume's root: writable by everyone, as many
// provisioners leave an empty file system, so that a task run as an
// unprivileged user (the exec driver's default, nobody) can write to the
// volume it claims. Only tasks the volume is published to see it.
const volumeDirMode = 0o777

// mkVolumeDir makes a volume's data dir under root with volumeDirMode,
// whatever the umask; an existing one is left as it is.
func mkVolumeDir(root *os.Root, name string) error {
	if _, err := root.Stat(name); err == nil {
		return nil
	}
	if err := root.MkdirAll(name, volumeDirMode); err != nil {
		return err
	}
	return root.Chmod(name, volumeDirMode)
}

// volumeDir is the absolute path of a volume's data dir, which node
// publish links to.
func (s *store) volumeDir(id string) (string, error) {
	name, err := volumeName(id)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.dir, name), nil
}

// replaceTree makes dst a copy of src, both relative to root, via a
// temporary sibling so that dst is never half-written.
func replaceTree(root *os.Root, src, dst string) error {
	tmp := dst + ".tmp-copy"
	if err := root.RemoveAll(tmp); err != nil {
		return fmt.Errorf("clearing %s: %w", tmp, err)
	}
	if err := copyTree(root, src, tmp); err != nil {
		root.RemoveAll(tmp)
		return fmt.Errorf("copying %s: %w", src, err)
	}
	if err := root.RemoveAll(dst); err != nil && !errors.Is(err, os.ErrNotExist) {
		root.RemoveAll(tmp)
		return fmt.Errorf("clearing %s: %w", dst, err)
	}
	if err := root.Rename(tmp, dst); err != nil {
		return fmt.Errorf("moving copy into place: %w", err)
	}
	return nil
}

// copyTree copies the regular files, directories and symlinks under src
// into dst, which is created, both relative to root. Links are copied as
// links, never followed. Volume data is small test data, so a plain copy
// is enough.
func copyTree(root *os.Root, src, dst string) error {
	return fs.WalkDir(root.FS(), filepath.ToSlash(src), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, filepath.FromSlash(path))
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return root.MkdirAll(target, info.Mode().Perm()|0o700)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := root.Readlink(filepath.FromSlash(path))
			if err != nil {
				return err
			}
			return root.Symlink(link, target)
		case d.Type().IsRegular():
			return copyFile(root, filepath.FromSlash(path), target, info.Mode().Perm())
		}
		return nil // sockets, fifos and devices are not volume data
	})
}

func copyFile(root *os.Root, src, dst string, perm fs.FileMode) (err error) {
	in, err := root.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := root.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	_, err = io.Copy(out, in)
	return err
}

// targetDir is where node publish and unpublish act on a target path: an
// os.Root and the path relative to it.
type targetDir struct {
	root *os.Root
	rel  string
}

func (t *targetDir) close() {
	if t.root != nil {
		t.root.Close()
	}
}

// checkCOPath checks a staging or target path from the CO: absolute, no
// NUL, not inside StateDir (the plugin's own data must not be replaced by
// a publish or removed by an unpublish), and beneath TargetRoot when one
// is set. It returns the path cleaned.
func (p *Plugin) checkCOPath(what, path string) (string, error) {
	if strings.ContainsRune(path, 0) {
		return "", status.Errorf(codes.InvalidArgument, "%s %q holds a NUL", what, path)
	}
	if !filepath.IsAbs(path) {
		return "", status.Errorf(codes.InvalidArgument, "%s %q is not absolute", what, path)
	}
	path = filepath.Clean(path)
	if rel, err := filepath.Rel(p.cfg.StateDir, path); err == nil && (rel == "." || filepath.IsLocal(rel)) {
		return "", status.Errorf(codes.InvalidArgument, "%s %q is inside the plugin's state dir", what, path)
	}
	if p.cfg.TargetRoot != "" {
		rel, err := filepath.Rel(p.cfg.TargetRoot, path)
		if err != nil || !filepath.IsLocal(rel) {
			return "", status.Errorf(codes.InvalidArgument, "%s %q is not beneath the target root %s", what, path, p.cfg.TargetRoot)
		}
	}
	return path, nil
}

// openTarget opens where a checked target path is acted on: beneath an
// os.Root on TargetRoot when one is set, so that no link on the way leads
// out of it; otherwise beneath an os.Root on the target's parent, which
// makeLink creates first when asked to.
func (p *Plugin) openTarget(target string, createParent bool) (*targetDir, error) {
	dir, rel := filepath.Dir(target), filepath.Base(target)
	if p.cfg.TargetRoot != "" {
		dir = p.cfg.TargetRoot
		r, err := filepath.Rel(dir, target)
		if err != nil {
			return nil, err
		}
		rel = r
	} else if createParent {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("creating target parent: %w", err)
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	return &targetDir{root: root, rel: rel}, nil
}
