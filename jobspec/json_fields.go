package jobspec

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"

	"github.com/roamhq/roam/structs"
)

// Nomad's Go client sends every field of a job, group and task, set or
// not. The tables below name the fields Roam reads; any other field is
// accepted only while it holds its zero value (or, for a few, the value
// Nomad's client fills in on its own when the caller set nothing), and is
// otherwise an error naming its path. Nothing is silently dropped.

// use says what Roam does with a field.
type use int

const (
	// useReject: not read; an error unless zero or the client default.
	useReject use = iota
	// useRead: decoded into the job.
	useRead
	// useIgnore: set by servers (status, indexes); a client that registers
	// a job it read back sends them, and they are dropped.
	useIgnore
)

// shape is how a read field nests.
type shape int

const (
	leaf shape = iota
	object
	list // of objects
	dict // of objects, by name
)

type field struct {
	use   use
	shape shape
	obj   schema
	// dflt is what Nomad's client sends for the field when the caller set
	// nothing and it is not zero: a scalar, or for an object a
	// map of its non-zero fields.
	dflt any
}

type schema map[string]field

var (
	read    = field{use: useRead}
	ignored = field{use: useIgnore}
)

func readObject(s schema) field { return field{use: useRead, shape: object, obj: s} }
func readList(s schema) field   { return field{use: useRead, shape: list, obj: s} }
func readDict(s schema) field   { return field{use: useRead, shape: dict, obj: s} }
func clientDefault(v any) field { return field{use: useReject, dflt: v} }

// updateDefault is the update strategy Nomad's client gives service jobs
// and their groups. Roam has no rolling updates; this one is harmless.
var updateDefault = map[string]any{
	"Stagger":          int64(30e9),
	"MaxParallel":      int64(1),
	"HealthCheck":      "checks",
	"MinHealthyTime":   int64(10e9),
	"HealthyDeadline":  int64(300e9),
	"ProgressDeadline": int64(600e9),
}

var restartFields = schema{
	"Attempts": read, "Interval": read, "Delay": read, "Mode": read,
}

var jobFields = schema{
	"Region": read, "Namespace": read, "ID": read, "Name": read,
	"Type": read, "Priority": read, "AllAtOnce": read, "Datacenters": read,
	"Meta": read, "Stop": read,
	"TaskGroups": readList(groupFields),
	"NodePool":   clientDefault("default"),
	"Update":     clientDefault(updateDefault),

	"Status": ignored, "StatusDescription": ignored, "Stable": ignored,
	"Version": ignored, "SubmitTime": ignored, "CreateIndex": ignored,
	"ModifyIndex": ignored, "JobModifyIndex": ignored, "NomadTokenID": ignored,
}

var groupFields = schema{
	"Name": read, "Count": read, "Meta": read,
	"Tasks":         readList(taskFields),
	"RestartPolicy": readObject(restartFields),
	"ReschedulePolicy": readObject(schema{
		"Attempts": read, "Interval": read, "Delay": read,
		"DelayFunction": read, "MaxDelay": read, "Unlimited": read,
	}),
	"Migrate": readObject(schema{
		"MaxParallel": read, "HealthCheck": read,
		"MinHealthyTime": read, "HealthyDeadline": read,
	}),
	"Volumes": readDict(schema{
		"Name": read, "Type": read, "Source": read, "ReadOnly": read,
		"AccessMode": read, "AttachmentMode": read, "PerAlloc": read,
		"MountOptions": readObject(schema{"FSType": read, "MountFlags": read}),
	}),
	"Networks": readList(schema{
		"Mode":          read,
		"ReservedPorts": readList(portFields),
		"DynamicPorts":  readList(portFields),
	}),
	"EphemeralDisk": clientDefault(map[string]any{"SizeMB": int64(300)}),
	"Update":        clientDefault(updateDefault),
}

var portFields = schema{"Label": read, "Value": read, "To": read, "HostNetwork": read}

var taskFields = schema{
	"Name": read, "Driver": read, "Config": read, "Env": read,
	"KillTimeout": read, "KillSignal": read, "Meta": read, "User": read,
	"Resources": readObject(schema{"CPU": read, "MemoryMB": read, "MemoryMaxMB": read}),
	"VolumeMounts": readList(schema{
		"Volume": read, "Destination": read, "ReadOnly": read,
		"PropagationMode": clientDefault("private"),
	}),
	// Nomad's client copies the group's restart policy into each task;
	// Roam restarts by the group's policy, so a task's must match it
	// (checked in checkTaskRestart).
	"RestartPolicy": readObject(restartFields),
	"LogConfig": clientDefault(map[string]any{
		"MaxFiles": int64(10), "MaxFileSizeMB": int64(10),
	}),
	// A plugin task's socket directory is relative to its task directory;
	// Nomad's client defaults it to "/csi", which reads the same.
	"Lifecycle": readObject(schema{"Hook": read, "Sidecar": read}),
	"Artifacts": readList(schema{
		"GetterSource": read, "GetterOptions": read, "GetterMode": read, "RelativeDest": read,
		"GetterInsecure": clientDefault(false), "Chown": clientDefault(false),
	}),
	"Templates": readList(schema{
		"SourcePath": read, "DestPath": read, "EmbeddedTmpl": read,
		"ChangeMode": read, "ChangeSignal": read, "Splay": read, "Perms": read,
		"LeftDelim": read, "RightDelim": read, "Envvars": read,
		// Nomad's client fills these in; Roam has no Vault, and renders
		// missing keys as empty.
		"VaultGrace": clientDefault(int64(0)), "ErrMissingKey": clientDefault(false),
	}),
	"CSIPluginConfig": readObject(schema{
		"ID": read, "Type": read, "MountDir": read,
		"StagePublishBaseDir": clientDefault("/local/csi"),
		"HealthTimeout":       clientDefault(int64(30e9)),
	}),
}

// walker checks a decoded JSON tree against a schema and returns the
// fields Roam reads, dropping the rest.
type walker struct {
	probs structs.Problems
}

func (w *walker) unsupported(path string) {
	w.probs.Addf("%s is not supported", path)
}

func (w *walker) object(path string, obj map[string]any, s schema) map[string]any {
	out := make(map[string]any)
	for _, k := range sortedKeys(obj) {
		v, f, p := obj[k], s[k], path+"."+k
		switch {
		case f.use == useIgnore:
		case f.use == useRead:
			out[k] = w.value(p, v, f)
		case isZero(v), f.dflt != nil && matchesDefault(v, f.dflt):
		default:
			w.unsupported(p)
		}
	}
	return out
}

// value walks a read field. Values of the wrong JSON type are passed on
// for json.Unmarshal to report.
func (w *walker) value(path string, v any, f field) any {
	switch f.shape {
	case object:
		if m, ok := v.(map[string]any); ok {
			return w.object(path, m, f.obj)
		}
	case list:
		if l, ok := v.([]any); ok {
			out := make([]any, len(l))
			for i, e := range l {
				out[i] = e
				if m, ok := e.(map[string]any); ok {
					out[i] = w.object(fmt.Sprintf("%s[%d]", path, i), m, f.obj)
				}
			}
			return out
		}
	case dict:
		if d, ok := v.(map[string]any); ok {
			out := make(map[string]any, len(d))
			for _, k := range sortedKeys(d) {
				out[k] = d[k]
				if m, ok := d[k].(map[string]any); ok {
					out[k] = w.object(fmt.Sprintf("%s[%q]", path, k), m, f.obj)
				}
			}
			return out
		}
	}
	return v
}

// checkTaskRestart accepts a task restart policy that is absent, zero or
// the group's own (as Nomad's client copies it), and drops it.
func (w *walker) checkTaskRestart(path string, job map[string]any) {
	groups, _ := job["TaskGroups"].([]any)
	for i, g := range groups {
		group, _ := g.(map[string]any)
		tasks, _ := group["Tasks"].([]any)
		for j, t := range tasks {
			task, _ := t.(map[string]any)
			if task == nil {
				continue
			}
			rp := task["RestartPolicy"]
			delete(task, "RestartPolicy")
			if isZero(rp) || reflect.DeepEqual(rp, group["RestartPolicy"]) {
				continue
			}
			w.probs.Addf("%s.TaskGroups[%d].Tasks[%d].RestartPolicy is not supported; set RestartPolicy on the task group", path, i, j)
		}
	}
}

// isZero reports whether a decoded JSON value is null, false, 0, "", or a
// list or object holding only such values.
func isZero(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case bool:
		return !v
	case string:
		return v == ""
	case json.Number:
		f, err := v.Float64()
		return err == nil && f == 0
	case []any:
		for _, e := range v {
			if !isZero(e) {
				return false
			}
		}
		return true
	case map[string]any:
		for _, e := range v {
			if !isZero(e) {
				return false
			}
		}
		return true
	}
	return false
}

// matchesDefault reports whether v is dflt, or for objects whether every
// field of v is zero or its default.
func matchesDefault(v, dflt any) bool {
	if d, ok := dflt.(map[string]any); ok {
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		for k, e := range m {
			if !isZero(e) && !matchesDefault(e, d[k]) {
				return false
			}
		}
		return true
	}
	switch d := dflt.(type) {
	case string:
		s, ok := v.(string)
		return ok && s == d
	case int64:
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		i, err := n.Int64()
		return err == nil && i == d
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
