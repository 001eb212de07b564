package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	getter "github.com/hashicorp/go-getter/v2"
	"golang.org/x/sys/unix"

	"github.com/roamhq/roam/structs"
)

// Bounds on what an artifact may unpack to, and how long a fetch takes.
const (
	artifactFilesLimit   = 10000
	artifactSizeLimit    = 1 << 30
	artifactFetchTimeout = 10 * time.Minute
)

// artifactClient fetches over http and https (and from the client's own
// staging copy of a task's file), downloads and unpacks within bounds,
// and never writes through a symlink. Its HTTP client refuses link-local
// addresses, where clouds serve their instance credentials.
var artifactClient = &getter.Client{
	Getters: []getter.Getter{
		&getter.HttpGetter{
			Client:                artifactHTTPClient(),
			XTerraformGetDisabled: true,
			HeadFirstTimeout:      10 * time.Second,
			MaxBytes:              artifactSizeLimit,
		},
		new(getter.FileGetter),
	},
	Decompressors:   getter.LimitedDecompressors(artifactFilesLimit, artifactSizeLimit),
	DisableSymlinks: true,
}

// errLinkLocal is a fetch from (or redirected to) a link-local address.
var errLinkLocal = errors.New("artifact sources on link-local addresses are refused")

func artifactHTTPClient() *http.Client {
	d := &net.Dialer{
		Timeout: 10 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			if ip := net.ParseIP(host); ip != nil && (ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast()) {
				return fmt.Errorf("%w: %s", errLinkLocal, host)
			}
			return nil
		},
	}
	t := cleanhttp.DefaultPooledTransport()
	t.DialContext = d.DialContext
	return &http.Client{Transport: t}
}

// fetchArtifacts fetches the task's artifacts into its directory. Each is
// fetched into a fresh directory of the client's own in the allocation
// directory, which no task can write to, and its entries are then moved
// into place with renameat(2) onto a directory opened through an os.Root
// on the task directory: nothing lands outside it, whatever links a task
// left on the way.
func (tr *taskRunner) fetchArtifacts(ctx context.Context) error {
	if len(tr.task.Artifacts) == 0 {
		return nil
	}
	tr.update(nil, func(st *structs.TaskState) {
		addEvent(st, newEvent(structs.TaskEventDownloadingArtifacts, "Client is downloading artifacts"))
	})
	// A stop of the task ends its download.
	ctx, cancel := context.WithTimeout(ctx, artifactFetchTimeout)
	defer cancel()
	go func() {
		select {
		case <-tr.killCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	root, err := os.OpenRoot(tr.dirs.TaskDir)
	if err != nil {
		return err
	}
	defer root.Close()
	for i, a := range tr.task.Artifacts {
		if err := tr.fetchArtifact(ctx, root, a); err != nil {
			// URLs in the error lose their queries, which may carry a token.
			msg := queryInURL.ReplaceAllString(err.Error(), "$1?...")
			ev := newEvent(structs.TaskEventArtifactDownloadFailed, fmt.Sprintf("artifact %d (%s): %s", i, redactSource(a.GetterSource), msg))
			tr.update(nil, func(st *structs.TaskState) { addEvent(st, ev) })
			return fmt.Errorf("artifact %d: %s", i, msg)
		}
	}
	return nil
}

func (tr *taskRunner) fetchArtifact(ctx context.Context, root *os.Root, a *structs.TaskArtifact) error {
	dest, err := a.ArtifactDest()
	if err != nil {
		return err
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	// The allocation directory is the client's (root, 0711): no task can
	// prepare or swap what is made here.
	staging := filepath.Join(filepath.Dir(tr.dirs.SharedDir), ".roam-artifact-"+hex.EncodeToString(b[:]))
	if err := os.Mkdir(staging, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(staging)
	payload := filepath.Join(staging, "payload")
	src, err := artifactURL(a)
	if err != nil {
		return err
	}
	if src, err = confineFileSource(root, staging, src); err != nil {
		return err
	}
	mode := getter.ModeAny
	switch a.GetterMode {
	case "file":
		mode = getter.ModeFile
	case "dir":
		mode = getter.ModeDir
	}
	req := &getter.Request{Src: src, Dst: payload, GetMode: mode, Copy: true, DisableSymlinks: true}
	if _, err := artifactClient.Get(ctx, req); err != nil {
		return err
	}
	fi, err := os.Lstat(payload)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		// One file: it becomes the destination itself when the mode says
		// file, else a file of that name in the destination directory.
		target := dest
		if mode != getter.ModeFile {
			target = path.Join(dest, path.Base(sourcePath(a.GetterSource)))
		}
		return moveInto(root, staging, "payload", target)
	}
	// A directory (or an unpacked archive): its entries join the
	// destination.
	if err := root.MkdirAll(dest, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(payload)
	if err != nil {
		return err
	}
	for _, e := range entries {
		target := path.Join(dest, e.Name())
		if _, err := root.Lstat(target); err == nil {
			if err := root.RemoveAll(target); err != nil {
				return err
			}
		}
		if err := moveInto(root, payload, e.Name(), target); err != nil {
			return err
		}
	}
	return nil
}

// moveInto renames fromDir/name to target beneath root, relative to a
// descriptor of target's directory that root opened: the rename cannot be
// led out of the task directory.
func moveInto(root *os.Root, fromDir, name, target string) error {
	if err := root.MkdirAll(path.Dir(target), 0o755); err != nil {
		return err
	}
	to, err := root.Open(path.Dir(target))
	if err != nil {
		return err
	}
	defer to.Close()
	from, err := os.Open(fromDir)
	if err != nil {
		return err
	}
	defer from.Close()
	return unix.Renameat(int(from.Fd()), name, int(to.Fd()), path.Base(target))
}

// confineFileSource copies a file source, relative to the task directory
// (the servers refuse any other), through the os.Root on it into the
// client's staging directory, and returns the source go-getter then reads:
// that copy, which no task can swap for a link. Only regular files are
// sources.
func confineFileSource(root *os.Root, staging, src string) (string, error) {
	_, s, _ := cutForced(src)
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "file" {
		return src, err
	}
	rel := u.Opaque
	if rel == "" {
		rel = u.Path
	}
	if rel == "" || strings.HasPrefix(rel, "/") || u.Host != "" {
		return "", fmt.Errorf("file source %q must be relative to the task directory", src)
	}
	in, err := root.OpenFile(path.Clean(rel), os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", fmt.Errorf("file source %q: %w", src, err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("file source %q is not a regular file", src)
	}
	if fi.Size() > artifactSizeLimit {
		return "", fmt.Errorf("file source %q is over %d bytes", src, artifactSizeLimit)
	}
	// Under its own name: go-getter names what it stores after the source.
	if err := os.Mkdir(filepath.Join(staging, "source"), 0o700); err != nil {
		return "", err
	}
	copyPath := filepath.Join(staging, "source", path.Base(rel))
	out, err := os.OpenFile(copyPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return "", err
	}
	_, err = io.Copy(out, io.LimitReader(in, artifactSizeLimit))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	abs := &url.URL{Scheme: "file", Path: copyPath, RawQuery: u.RawQuery}
	return abs.String(), nil
}

// artifactURL is the source with the getter options as query parameters,
// as go-getter reads them.
func artifactURL(a *structs.TaskArtifact) (string, error) {
	if len(a.GetterOptions) == 0 {
		return a.GetterSource, nil
	}
	forced, s := "", a.GetterSource
	if f, rest, ok := cutForced(s); ok {
		forced, s = f+"::", rest
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", err
	}
	q := u.Query()
	for k, v := range a.GetterOptions {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return forced + u.String(), nil
}

func cutForced(s string) (string, string, bool) {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == ':' && s[i+1] == ':' {
			return s[:i], s[i+2:], true
		}
		if s[i] == '/' {
			break
		}
	}
	return "", s, false
}

// sourcePath is the path part of a source URL, for the name of a single
// downloaded file.
func sourcePath(src string) string {
	_, s, _ := cutForced(src)
	if u, err := url.Parse(s); err == nil {
		switch {
		case u.Path != "":
			return u.Path
		case u.Opaque != "":
			return u.Opaque
		}
	}
	return "artifact"
}

// queryInURL finds the query of a URL in a message.
var queryInURL = regexp.MustCompile(`((?:https?|file)://[^\s"?]*)\?[^\s"]*`)

// redactSource is a source without its query, which may carry a token.
func redactSource(src string) string {
	if i := strings.IndexByte(src, '?'); i >= 0 {
		return src[:i] + "?..."
	}
	return src
}
