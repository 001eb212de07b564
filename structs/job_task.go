package structs

import (
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
)

// ReservedTaskDirNames are the names a volume_mount destination may not
// take: directories the client creates in every task directory (local),
// the raw_exec driver's own files (.rawexec, and nothing below it), and
// the names Nomad gives task directories (alloc, secrets, tmp), which
// tasks written for Nomad expect to be what they are there.
var ReservedTaskDirNames = []string{"local", ".rawexec", "alloc", "secrets", "tmp"}

// errBadDriverConfig means a task's driver configuration cannot run.
// Servers refuse such a job as an invalid request; clients wrap it in
// their own error.
var errBadDriverConfig = errors.New("bad driver config")

// ValidateDriverConfig checks a task's driver configuration the way the
// client will read it, so that a job that cannot start is refused when it
// is submitted rather than failing later on a client.
func ValidateDriverConfig(driver string, cfg map[string]any) error {
	switch driver {
	case "raw_exec":
		_, _, err := ParseRawExecConfig(cfg)
		return err
	case "exec":
		_, _, err := ParseExecConfig(cfg)
		return err
	}
	return nil
}

// ParseRawExecConfig reads a raw_exec task's config: "command", a
// non-empty string, and "args", a list of strings. Any other option is an
// error, as is a NUL byte, which no exec can pass. Clients and servers
// both use it.
func ParseRawExecConfig(cfg map[string]any) (string, []string, error) {
	return parseCommandConfig("raw_exec", cfg)
}

// ParseExecConfig reads an exec task's config, which takes the same
// options as raw_exec's. The options of Nomad's exec driver that Roam does
// not have (pid_mode, ipc_mode, cap_add, cap_drop, …) are refused by name
// rather than ignored.
func ParseExecConfig(cfg map[string]any) (string, []string, error) {
	return parseCommandConfig("exec", cfg)
}

func parseCommandConfig(driver string, cfg map[string]any) (string, []string, error) {
	keys := make([]string, 0, len(cfg))
	for k := range cfg {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k != "command" && k != "args" {
			return "", nil, fmt.Errorf("%w: %s: unknown option %q (known: command, args)", errBadDriverConfig, driver, k)
		}
	}
	command, ok := cfg["command"].(string)
	if !ok || command == "" {
		return "", nil, fmt.Errorf("%w: %s: option \"command\" must be a non-empty string, got %s", errBadDriverConfig, driver, describe(cfg["command"]))
	}
	if strings.ContainsRune(command, 0) {
		return "", nil, fmt.Errorf("%w: %s: option \"command\" holds a NUL byte", errBadDriverConfig, driver)
	}
	var args []string
	switch v := cfg["args"].(type) {
	case nil:
	case []string:
		args = append(args, v...)
	case []any:
		for i, a := range v {
			s, ok := a.(string)
			if !ok {
				return "", nil, fmt.Errorf("%w: %s: args[%d] must be a string, got %s", errBadDriverConfig, driver, i, describe(a))
			}
			args = append(args, s)
		}
	default:
		return "", nil, fmt.Errorf("%w: %s: option \"args\" must be a list of strings, got %s", errBadDriverConfig, driver, describe(v))
	}
	for i, a := range args {
		if strings.ContainsRune(a, 0) {
			return "", nil, fmt.Errorf("%w: %s: args[%d] holds a NUL byte", errBadDriverConfig, driver, i)
		}
	}
	return command, args, nil
}

// describe names a config value's kind for an error, without quoting
// what may be a large value.
func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "nothing"
	case string:
		if v == "" {
			return "an empty string"
		}
		return "a string"
	case bool:
		return "a bool"
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, float32, float64:
		return "a number"
	case []any, []string:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// validateVolumeMounts checks t's volume_mount blocks: each names a volume
// the group requests and mounts it at a destination of its own inside the
// task directory. The client links the volume at the destination, taken
// relative to the task directory; a destination that is the task directory
// itself or a directory the client made already exists, and the volume
// would silently not be mounted.
func (tg *TaskGroup) validateVolumeMounts(t *Task, add func(string, ...any)) {
	var dests []string
	for i, vm := range t.VolumeMounts {
		if vm == nil {
			add("task %q: volume_mount %d is null", t.Name, i)
			continue
		}
		if _, ok := tg.Volumes[vm.Volume]; !ok {
			add("task %q: volume_mount names volume %q, which the group does not request", t.Name, vm.Volume)
		}
		if err := checkMountDestination(vm.Destination); err != nil {
			add("task %q: volume_mount of %q: %v", t.Name, vm.Volume, err)
			continue
		}
		if pc := t.CSIPluginConfig; pc != nil {
			dir := strings.TrimLeft(pc.MountDir, "/")
			if dir == "" {
				dir = DefaultCSIPluginMountDir
			}
			if nested(path.Clean(dir), vm.Destination) {
				add("task %q: volume_mount of %q: destination %q overlaps the csi_plugin mount_dir %q", t.Name, vm.Volume, vm.Destination, pc.MountDir)
			}
		}
		for _, d := range dests {
			if nested(d, vm.Destination) {
				add("task %q: volume_mount of %q: destination %q overlaps destination %q of another volume_mount", t.Name, vm.Volume, vm.Destination, d)
				break
			}
		}
		dests = append(dests, vm.Destination)
	}
}

// checkMountDestination says what is wrong with a volume_mount
// destination, or nil: it must be a clean relative path below the task
// directory that does not start at a reserved name.
func checkMountDestination(dest string) error {
	switch {
	case dest == "":
		return errors.New("destination is required")
	case strings.ContainsRune(dest, 0):
		return fmt.Errorf("destination %q holds a NUL byte", dest)
	case strings.HasPrefix(dest, "/"):
		return fmt.Errorf("destination %q must be relative to the task directory (write %q)", dest, strings.TrimLeft(dest, "/"))
	case dest == ".":
		return errors.New(`destination "." is the task directory itself`)
	case path.Clean(dest) != dest:
		return fmt.Errorf("destination %q is not a clean path (write %q)", dest, path.Clean(dest))
	case dest == ".." || strings.HasPrefix(dest, "../"):
		return fmt.Errorf("destination %q leaves the task directory", dest)
	}
	first, _, _ := strings.Cut(dest, "/")
	for _, r := range ReservedTaskDirNames {
		if dest == r || (first == r && r == ".rawexec") {
			return fmt.Errorf("destination %q is reserved in the task directory (reserved: %s)", dest, strings.Join(ReservedTaskDirNames, ", "))
		}
	}
	return nil
}

// nested reports whether clean relative paths a and b are the same or one
// lies below the other.
func nested(a, b string) bool {
	return a == b || strings.HasPrefix(b, a+"/") || strings.HasPrefix(a, b+"/")
}

// sortedVolumeNames returns the keys of a group's volumes in order, so
// that problems are listed the same way every time.
func sortedVolumeNames(m map[string]*VolumeRequest) []string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}
