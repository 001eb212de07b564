package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path"
	"strings"
	"time"

	"github.com/roamhq/roam/client/driver/rawexec"
	"github.com/roamhq/roam/internal/tasktemplate"
	"github.com/roamhq/roam/structs"
)

// DefaultTemplateCheckInterval is how often a running task's templates
// are rendered again to find a changed source or file.
const DefaultTemplateCheckInterval = 5 * time.Second

// templateRoots are the directories templates read and write, opened as
// os.Roots, so that neither a template nor a link the task left can
// reach outside them.
type templateRoots struct {
	task, alloc *os.Root
}

func (tr *taskRunner) openTemplateRoots() (*templateRoots, error) {
	task, err := os.OpenRoot(tr.dirs.TaskDir)
	if err != nil {
		return nil, fmt.Errorf("template: task dir: %w", err)
	}
	alloc, err := os.OpenRoot(tr.dirs.SharedDir)
	if err != nil {
		task.Close()
		return nil, fmt.Errorf("template: alloc dir: %w", err)
	}
	return &templateRoots{task: task, alloc: alloc}, nil
}

func (r *templateRoots) close() {
	r.task.Close()
	r.alloc.Close()
}

func (r *templateRoots) of(dir string) *os.Root {
	if dir == structs.TemplateInAllocDir {
		return r.alloc
	}
	return r.task
}

// rendered is one template's output and where it goes.
type rendered struct {
	root *os.Root
	rel  string
	perm os.FileMode
	out  []byte
}

// render renders template i of the task against its environment.
func (tr *taskRunner) render(roots *templateRoots, i int) (*rendered, error) {
	tp := tr.task.Templates[i]
	fail := func(err error) error {
		return fmt.Errorf("%w: template %d (%s): %w", errBadTaskConfig, i, tp.DestPath, err)
	}
	text := tp.EmbeddedTmpl
	if tp.SourcePath != "" {
		dir, rel, err := structs.TemplateTarget(tp.SourcePath)
		if err != nil {
			return nil, fail(err)
		}
		if text, err = readBounded(roots.of(dir), rel, tasktemplate.MaxTemplateBytes); err != nil {
			return nil, fail(fmt.Errorf("source: %w", err))
		}
	}
	out, err := tasktemplate.Render(tp.DestPath, text, tp.LeftDelim, tp.RightDelim, tasktemplate.Env(tr.env), roots.task)
	if err != nil {
		return nil, fail(err)
	}
	dir, rel, err := structs.TemplateTarget(tp.DestPath)
	if err != nil {
		return nil, fail(err)
	}
	perm, err := tp.TemplatePerms()
	if err != nil {
		return nil, fail(err)
	}
	return &rendered{root: roots.of(dir), rel: rel, perm: os.FileMode(perm), out: out}, nil
}

// templateOwner is the uid and gid template files get: the task user's,
// or -1 for the client's own.
func templateOwner(user string) (int, int, error) {
	if user == "" {
		return -1, -1, nil
	}
	u, g, err := rawexec.LookupUser(user)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %w", errBadTaskConfig, err)
	}
	return int(u), int(g), nil
}

// renderTemplates renders the task's templates before a start, as user,
// and returns the task's environment with the variables of its env
// templates added. Each file is written whole under a temporary name and
// renamed into place.
func (tr *taskRunner) renderTemplates(user string) (map[string]string, error) {
	tr.templateUser = user
	if len(tr.task.Templates) == 0 {
		return tr.env, nil
	}
	roots, err := tr.openTemplateRoots()
	if err != nil {
		return nil, err
	}
	defer roots.close()
	uid, gid, err := templateOwner(user)
	if err != nil {
		return nil, err
	}
	env, cloned := tr.env, false
	for i, tp := range tr.task.Templates {
		r, err := tr.render(roots, i)
		if err != nil {
			return nil, err
		}
		if err := writeAtomic(r.root, r.rel, r.out, r.perm, uid, gid); err != nil {
			return nil, fmt.Errorf("template %d (%s): %w", i, tp.DestPath, err)
		}
		if tp.Envvars {
			vars, err := tasktemplate.ParseEnv(r.out)
			if err != nil {
				return nil, fmt.Errorf("%w: template %d (%s): %w", errBadTaskConfig, i, tp.DestPath, err)
			}
			if !cloned {
				env, cloned = maps.Clone(tr.env), true
				if env == nil {
					env = map[string]string{}
				}
			}
			maps.Copy(env, vars)
		}
	}
	return env, nil
}

// watchTemplates renders the task's templates again every templateEvery
// while h runs. A template whose output changed is written, then acted on
// by its change_mode: restart (the task is restarted, outside its restart
// policy), signal (its change_signal is sent) or noop. It returns a
// function that stops the watch and waits for it.
func (tr *taskRunner) watchTemplates(ctx context.Context, h *rawexec.Handle) func() {
	if len(tr.task.Templates) == 0 || tr.templateEvery <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(tr.templateEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			tr.checkTemplates(h)
		}
	}()
	return func() { cancel(); <-done }
}

// checkTemplates is one round of watchTemplates.
func (tr *taskRunner) checkTemplates(h *rawexec.Handle) {
	roots, err := tr.openTemplateRoots()
	if err != nil {
		tr.logger.Warn("could not check templates", "error", err)
		return
	}
	defer roots.close()
	uid, gid, err := templateOwner(tr.templateUser)
	if err != nil {
		tr.logger.Warn("could not check templates", "error", err)
		return
	}
	var restart, signalled []string
	signals := map[string]bool{}
	for i, tp := range tr.task.Templates {
		r, err := tr.render(roots, i)
		if err != nil {
			// The task runs on what was rendered last.
			tr.logger.Warn("template no longer renders; keeping the last output", "template", tp.DestPath, "error", err)
			continue
		}
		if cur, err := readBounded(r.root, r.rel, tasktemplate.MaxOutputBytes); err == nil && bytes.Equal([]byte(cur), r.out) {
			continue
		}
		if err := writeAtomic(r.root, r.rel, r.out, r.perm, uid, gid); err != nil {
			tr.logger.Warn("could not write a re-rendered template", "template", tp.DestPath, "error", err)
			continue
		}
		tr.logger.Info("template re-rendered", "template", tp.DestPath, "change_mode", tp.ChangeModeOrDefault())
		switch tp.ChangeModeOrDefault() {
		case structs.TemplateChangeModeRestart:
			restart = append(restart, tp.DestPath)
		case structs.TemplateChangeModeSignal:
			signalled = append(signalled, tp.DestPath)
			signals[strings.ToUpper(tp.ChangeSignal)] = true
		}
	}
	if len(restart) > 0 {
		select {
		case tr.restartCh <- "template with change_mode restart re-rendered: " + strings.Join(restart, ", "):
		default: // a restart is already asked for
		}
		return
	}
	for sig := range signals {
		err := h.Signal(sig)
		msg := fmt.Sprintf("template re-rendered (%s): sent %s", strings.Join(signalled, ", "), sig)
		if err != nil {
			msg = fmt.Sprintf("template re-rendered (%s): %s failed: %v", strings.Join(signalled, ", "), sig, err)
		}
		hs := h.State()
		tr.update(&hs, func(st *structs.TaskState) { addEvent(st, newEvent(structs.TaskEventSignaling, msg)) })
	}
}

// readBounded reads the regular file rel beneath root, at most limit
// bytes, without blocking on a FIFO the task put there.
func readBounded(root *os.Root, rel string, limit int) (string, error) {
	b, err := tasktemplate.ReadFile(root, rel, limit)
	if err != nil {
		return "", fmt.Errorf("%s: %w", rel, err)
	}
	return string(b), nil
}

// writeAtomic writes data to rel beneath root, through a new temporary
// file renamed over it, with perm and owner uid:gid (-1: unchanged).
func writeAtomic(root *os.Root, rel string, data []byte, perm os.FileMode, uid, gid int) error {
	if err := root.MkdirAll(path.Dir(rel), 0o755); err != nil {
		return err
	}
	// A new file under a name of its own: nothing the task left is
	// written through, and two writers of one destination do not share
	// a temporary file.
	var suffix [8]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return err
	}
	tmp := path.Join(path.Dir(rel), "."+path.Base(rel)+".roam-tmp-"+hex.EncodeToString(suffix[:]))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	if err := f.Chmod(perm); werr == nil {
		werr = err
	}
	if uid >= 0 {
		if err := f.Chown(uid, gid); werr == nil {
			werr = err
		}
	}
	if err := f.Close(); werr == nil {
		werr = err
	}
	if werr == nil {
		werr = root.Rename(tmp, rel)
	}
	if werr != nil {
		_ = root.Remove(tmp)
	}
	return werr
}
