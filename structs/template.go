package structs

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/roamhq/roam/internal/tasktemplate"
)

// Template change modes, as in Nomad.
const (
	TemplateChangeModeRestart = "restart"
	TemplateChangeModeSignal  = "signal"
	TemplateChangeModeNoop    = "noop"
)

// MaxTaskTemplates bounds the template blocks of one task.
const MaxTaskTemplates = 16

// Template is a task's template block, in Nomad's shape: EmbeddedTmpl
// (data) or SourcePath (source, a file in the task directory) rendered to
// DestPath before the task starts, and again when its source changes.
type Template struct {
	SourcePath   string
	DestPath     string
	EmbeddedTmpl string
	ChangeMode   string
	ChangeSignal string
	// Splay is accepted for Nomad job files; Roam renders at once.
	Splay      time.Duration
	Perms      string
	LeftDelim  string
	RightDelim string
	// Envvars makes the rendered KEY=VALUE lines part of the task's
	// environment.
	Envvars bool
}

// Where a template's destination lies: the task directory, or the
// allocation's shared directory.
const (
	TemplateInTaskDir  = "task"
	TemplateInAllocDir = "alloc"
)

// TemplateTarget resolves a template destination (or source) written
// relative to the task directory or with a leading ${NOMAD_TASK_DIR},
// ${NOMAD_SECRETS_DIR} or ${NOMAD_ALLOC_DIR}, to the directory it is in
// and a clean path relative to that directory.
func TemplateTarget(p string) (dir, rel string, err error) {
	dir = TemplateInTaskDir
	for prefix, repl := range map[string]string{"${NOMAD_TASK_DIR}": "local", "${NOMAD_SECRETS_DIR}": "secrets", "${NOMAD_ALLOC_DIR}": ""} {
		if rest, ok := strings.CutPrefix(p, prefix); ok {
			rest = strings.TrimPrefix(rest, "/")
			if repl == "" {
				dir, p = TemplateInAllocDir, rest
			} else {
				p = repl + "/" + rest
			}
			break
		}
	}
	if strings.Contains(p, "${") {
		return "", "", fmt.Errorf("path %q: only a leading ${NOMAD_TASK_DIR}, ${NOMAD_SECRETS_DIR} or ${NOMAD_ALLOC_DIR} is interpolated", p)
	}
	if err := checkMountDestination(p); err != nil {
		return "", "", err
	}
	return dir, p, nil
}

// TemplatePerms is the mode a template's file gets (default 0644).
func (t *Template) TemplatePerms() (uint32, error) {
	if t.Perms == "" {
		return 0o644, nil
	}
	v, err := strconv.ParseUint(t.Perms, 8, 32)
	if err != nil || v > 0o777 {
		return 0, fmt.Errorf("perms %q is not an octal mode from 0000 to 0777", t.Perms)
	}
	return uint32(v), nil
}

// ChangeModeOrDefault is the change mode, restart when unset.
func (t *Template) ChangeModeOrDefault() string {
	if t.ChangeMode == "" {
		return TemplateChangeModeRestart
	}
	return t.ChangeMode
}

// knownSignals are the signal names a template's change_signal may use.
var knownSignals = map[string]bool{
	"SIGHUP": true, "SIGINT": true, "SIGQUIT": true, "SIGKILL": true, "SIGUSR1": true,
	"SIGUSR2": true, "SIGTERM": true, "SIGCONT": true, "SIGSTOP": true, "SIGWINCH": true,
}

// validateTemplates adds the problems of a task's template blocks.
func (t *Task) validateTemplates(add func(string, ...any)) {
	if len(t.Templates) > MaxTaskTemplates {
		add("task %q: %d templates, at most %d", t.Name, len(t.Templates), MaxTaskTemplates)
		return
	}
	dests := map[string]bool{}
	for i, tp := range t.Templates {
		if tp == nil {
			add("task %q: template %d is empty", t.Name, i)
			continue
		}
		where := fmt.Sprintf("task %q: template %d", t.Name, i)
		switch {
		case tp.EmbeddedTmpl == "" && tp.SourcePath == "":
			add("%s: one of data or source is required", where)
		case tp.EmbeddedTmpl != "" && tp.SourcePath != "":
			add("%s: data and source are exclusive", where)
		}
		if tp.SourcePath != "" {
			if _, _, err := TemplateTarget(tp.SourcePath); err != nil {
				add("%s: source: %v", where, err)
			}
		}
		if dir, rel, err := TemplateTarget(tp.DestPath); err != nil {
			add("%s: destination: %v", where, err)
		} else if t.Driver == "exec" && dir == TemplateInTaskDir && (rel == "secrets" || strings.HasPrefix(rel, "secrets/")) {
			// exec's secrets/ is a tmpfs mounted in the task's own mount
			// namespace, after the client renders.
			add("%s: destination %q: templates into secrets/ are not supported for exec tasks yet; use local/", where, tp.DestPath)
		} else if dir == TemplateInTaskDir && strings.HasPrefix(rel, "alloc/") {
			// The task's alloc/ is where the shared dir is mounted (exec)
			// or nothing (raw_exec): write there by name.
			add("%s: destination %q: write into the shared directory as ${NOMAD_ALLOC_DIR}/%s", where, tp.DestPath, strings.TrimPrefix(rel, "alloc/"))
		} else if vm := mountUnder(t, rel); dir == TemplateInTaskDir && vm != "" {
			add("%s: destination %q lies in volume_mount %q, whose volume is mounted over it", where, tp.DestPath, vm)
		} else if dests[dir+"/"+rel] {
			add("%s: destination %q is another template's too", where, tp.DestPath)
		} else {
			dests[dir+"/"+rel] = true
		}
		if tp.EmbeddedTmpl != "" {
			if _, err := tasktemplate.Parse("template", tp.EmbeddedTmpl, tp.LeftDelim, tp.RightDelim); err != nil {
				add("%s: data: %v", where, err)
			}
		}
		switch tp.ChangeModeOrDefault() {
		case TemplateChangeModeRestart, TemplateChangeModeNoop:
		case TemplateChangeModeSignal:
			if !knownSignals[strings.ToUpper(tp.ChangeSignal)] {
				add("%s: change_mode signal needs a change_signal such as SIGHUP, got %q", where, tp.ChangeSignal)
			}
		default:
			add("%s: change_mode %q is not one of restart, signal, noop", where, tp.ChangeMode)
		}
		if _, err := tp.TemplatePerms(); err != nil {
			add("%s: %v", where, err)
		}
		if tp.Splay < 0 {
			add("%s: splay must not be negative", where)
		}
	}
}

// mountUnder is the destination of the task's volume_mount that rel lies
// in, or "".
func mountUnder(t *Task, rel string) string {
	for _, vm := range t.VolumeMounts {
		if vm != nil && vm.Destination != "" && nested(vm.Destination, rel) {
			return vm.Destination
		}
	}
	return ""
}

// validateSharedTemplates adds a problem for two tasks of the group
// writing one file of the shared directory.
func (tg *TaskGroup) validateSharedTemplates(add func(string, ...any)) {
	owner := map[string]string{}
	for _, t := range tg.Tasks {
		if t == nil {
			continue
		}
		for _, tp := range t.Templates {
			if tp == nil {
				continue
			}
			dir, rel, err := TemplateTarget(tp.DestPath)
			if err != nil || dir != TemplateInAllocDir {
				continue
			}
			if other, ok := owner[rel]; ok && other != t.Name {
				add("task %q: template destination %q is task %q's too", t.Name, tp.DestPath, other)
				continue
			}
			owner[rel] = t.Name
		}
	}
}
