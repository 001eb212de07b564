package structs

import (
	"encoding/hex"
	"fmt"
	"net/url"
	"path"
	"strings"
)

// MaxTaskArtifacts bounds the artifact blocks of one task.
const MaxTaskArtifacts = 16

// maxArtifactSource bounds an artifact's source.
const maxArtifactSource = 4096

// TaskArtifact is a task's artifact block, in Nomad's shape: GetterSource
// (http, https, or a file of the task directory) fetched into RelativeDest (default local/)
// before the task starts, unpacked when it is an archive, its checksum
// option enforced.
type TaskArtifact struct {
	GetterSource  string
	GetterOptions map[string]string `json:",omitempty"`
	// GetterMode is any (default), file or dir.
	GetterMode   string
	RelativeDest string
}

// Artifact getter options Roam passes on.
var artifactOptions = map[string]bool{"checksum": true, "archive": true}

// checksum lengths in bytes, by type.
var checksumSizes = map[string]int{"md5": 16, "sha1": 20, "sha256": 32, "sha512": 64}

// ArtifactDest is the artifact's destination as a clean path relative to
// the task directory.
func (a *TaskArtifact) ArtifactDest() (string, error) {
	d := a.RelativeDest
	if d == "" {
		d = "local/"
	}
	if rest, ok := strings.CutPrefix(d, "${NOMAD_TASK_DIR}"); ok {
		d = "local/" + strings.TrimPrefix(rest, "/")
	}
	switch {
	case strings.ContainsRune(d, 0):
		return "", fmt.Errorf("destination %q holds a NUL byte", d)
	case strings.HasPrefix(d, "/"):
		return "", fmt.Errorf("destination %q must be relative to the task directory", d)
	}
	clean := path.Clean(d)
	if clean == "." || clean == ".." || strings.HasPrefix(clean, "../") {
		return "", fmt.Errorf("destination %q leaves the task directory", d)
	}
	if first, _, _ := strings.Cut(clean, "/"); first == ".rawexec" || first == "alloc" || first == secretsDir {
		return "", fmt.Errorf("destination %q is reserved in the task directory", d)
	}
	return clean, nil
}

const secretsDir = "secrets"

// validateArtifacts adds the problems of a task's artifact blocks.
func (t *Task) validateArtifacts(add func(string, ...any)) {
	if len(t.Artifacts) > MaxTaskArtifacts {
		add("task %q: %d artifacts, at most %d", t.Name, len(t.Artifacts), MaxTaskArtifacts)
		return
	}
	for i, a := range t.Artifacts {
		where := fmt.Sprintf("task %q: artifact %d", t.Name, i)
		if a == nil {
			add("%s is empty", where)
			continue
		}
		if err := checkArtifactSource(a.GetterSource); err != nil {
			add("%s: source: %v", where, err)
		}
		for k, v := range a.GetterOptions {
			if !artifactOptions[k] {
				add("%s: option %q is not supported (supported: archive, checksum)", where, k)
			}
			switch k {
			case "checksum":
				if err := checkChecksum(v); err != nil {
					add("%s: %v", where, err)
				}
			case "archive":
				if v != "false" && v != "true" {
					add("%s: archive %q must be true or false", where, v)
				}
			}
		}
		switch a.GetterMode {
		case "", "any", "file", "dir":
		default:
			add("%s: mode %q is not one of any, file, dir", where, a.GetterMode)
		}
		if _, err := a.ArtifactDest(); err != nil {
			add("%s: %v", where, err)
		}
	}
}

// checkArtifactSource allows http, https, file and git sources.
func checkArtifactSource(src string) error {
	switch {
	case src == "":
		return fmt.Errorf("is required")
	case len(src) > maxArtifactSource:
		return fmt.Errorf("is %d bytes, at most %d", len(src), maxArtifactSource)
	}
	if forced, _, ok := strings.Cut(src, "::"); ok {
		// git runs as root with the client's own credentials and config:
		// not until it can be given none.
		return fmt.Errorf("%q: getter %q is not supported (http, https, file)", src, forced)
	}
	u, err := url.Parse(src)
	if err != nil {
		return fmt.Errorf("%q: %v", src, err)
	}
	// go-getter reads its own options from the source's query; they go
	// in options, where they are checked.
	for k := range u.Query() {
		switch k {
		case "archive", "checksum", "filename", "ref", "sshkey", "depth":
			return fmt.Errorf("%q: give %q as an option, not in the source", src, k)
		}
	}
	switch u.Scheme {
	case "file":
		// A job may not read the client's own files: only a file the
		// allocation holds, named relative to the task directory.
		if u.Host != "" || strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Opaque, "/") {
			return fmt.Errorf("%q: a file source must be relative to the task directory (file:local/x)", src)
		}
	case "http", "https":
	default:
		return fmt.Errorf("%q: scheme %q is not supported (http, https, file)", src, u.Scheme)
	}
	return nil
}

// checkChecksum checks a checksum option: type:hex.
func checkChecksum(v string) error {
	typ, sum, ok := strings.Cut(v, ":")
	size, known := checksumSizes[typ]
	if !ok || !known {
		return fmt.Errorf("checksum %q: want md5, sha1, sha256 or sha512, then ':' and the hex digest", v)
	}
	b, err := hex.DecodeString(sum)
	if err != nil || len(b) != size {
		return fmt.Errorf("checksum %q: the %s digest is %d hex characters", v, typ, 2*size)
	}
	return nil
}
