package structs

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

func TestJobLimits_CheckSize(t *testing.T) {
	l := JobLimits{MaxGroups: 3, MaxTasks: 4, GroupMaxCount: 10, MaxAllocs: 15, ErrorMaxProblems: 5}
	group := func(name string, count, tasks int) *TaskGroup {
		tg := &TaskGroup{Name: name, Count: count}
		for i := 0; i < tasks; i++ {
			tg.Tasks = append(tg.Tasks, &Task{Name: fmt.Sprint("t", i)})
		}
		return tg
	}
	cases := []struct {
		name   string
		groups []*TaskGroup
		want   string
	}{
		{"at every limit", []*TaskGroup{group("a", 10, 2), group("b", 5, 2)}, ""},
		{"too many groups", []*TaskGroup{group("a", 1, 1), group("b", 1, 1), group("c", 1, 1), group("d", 1, 1)}, "4 task groups, more than job_max_groups = 3"},
		{"too many tasks", []*TaskGroup{group("a", 1, 3), group("b", 1, 2)}, "more than job_max_tasks = 4"},
		{"count over group limit", []*TaskGroup{group("a", 11, 1)}, `group "a": count 11 is more than group_max_count = 10`},
		{"count 2^62", []*TaskGroup{group("a", 1<<62, 1)}, "count 4611686018427387904 is more than group_max_count"},
		{"count 2^63-1", []*TaskGroup{group("a", math.MaxInt64, 1)}, "count 9223372036854775807 is more than group_max_count"},
		{"counts add up", []*TaskGroup{group("a", 10, 1), group("b", 10, 1)}, "add up to more than job_max_allocs = 15"},
		// A negative count is Validate's to report; it must not let
		// another group's count through the sum.
		{"negative count does not offset", []*TaskGroup{group("a", math.MinInt64, 1), group("b", 10, 1), group("c", 10, 1)}, "job_max_allocs"},
		{"null group is skipped", []*TaskGroup{nil, group("a", 1, 1)}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := l.CheckSize(&Job{ID: "j", TaskGroups: tc.groups})
			if tc.want == "" {
				must.NoError(t, err)
				return
			}
			must.ErrorIs(t, err, ErrJobTooLarge)
			must.StrContains(t, err.Error(), tc.want)
		})
	}
}

func TestJobLimits_Validate(t *testing.T) {
	must.NoError(t, DefaultJobLimits().Validate())
	l := DefaultJobLimits()
	l.MaxDepth, l.ErrorMaxProblems = 0, -1
	err := l.Validate()
	must.StrContains(t, err.Error(), "job_max_depth = 0")
	must.StrContains(t, err.Error(), "error_max_problems = -1")
}

// A job over the size limits is refused with that one problem, before
// anything walks its groups: a million nameless groups give a one-line
// error, not a million lines.
func TestJob_ValidateWithRefusesOversizeFirst(t *testing.T) {
	j := validJob(JobTypeService)
	for i := 0; i < 1_000_000; i++ {
		j.TaskGroups = append(j.TaskGroups, &TaskGroup{})
	}
	err := j.ValidateWith(DefaultJobLimits())
	must.ErrorIs(t, err, ErrInvalidRequest)
	must.ErrorIs(t, err, ErrJobTooLarge)
	must.StrContains(t, err.Error(), "1000001 task groups, more than job_max_groups = 100")
	must.Less(t, 200, len(err.Error()))

	j = validJob(JobTypeService)
	j.TaskGroups[0].Count = 1 << 62
	err = j.Validate()
	must.ErrorIs(t, err, ErrInvalidRequest)
	must.StrContains(t, err.Error(), "group_max_count = 10000")
}

// Under the size limits a job with many problems lists the first
// error_max_problems of them and counts the rest.
func TestJob_ValidateCapsProblems(t *testing.T) {
	l := DefaultJobLimits()
	l.ErrorMaxProblems = 3
	j := validJob(JobTypeService)
	for i := 0; i < 50; i++ {
		j.TaskGroups = append(j.TaskGroups, &TaskGroup{Name: fmt.Sprint("g", i), Count: -1})
	}
	err := j.ValidateWith(l)
	must.ErrorIs(t, err, ErrInvalidRequest)
	lines := strings.Split(err.Error(), "\n")
	must.Len(t, 4, lines, must.Sprint(err))
	// Each of the 50 groups has two problems: a negative count and no
	// tasks.
	must.Eq(t, "and 97 more problems", lines[3])
}

func TestProblems(t *testing.T) {
	var p Problems
	must.NoError(t, p.Err())
	p.Max = 2
	p.Add(nil)
	p.Addf("one")
	p.Addf("two %d", 2)
	must.Eq(t, "one\ntwo 2", p.Err().Error())
	p.Addf("three")
	p.Addf("four")
	must.Eq(t, 4, p.Len())
	must.Eq(t, "one\ntwo 2\nand 2 more problems", p.Err().Error())
	// Err does not change what it reports on a second call.
	must.Eq(t, "one\ntwo 2\nand 2 more problems", p.Err().Error())
}

func TestJob_ValidateNullEntries(t *testing.T) {
	j := validJob(JobTypeService)
	j.TaskGroups = append(j.TaskGroups, nil)
	j.TaskGroups[0].Tasks = append(j.TaskGroups[0].Tasks, nil)
	j.TaskGroups[0].Tasks[0].VolumeMounts = append(j.TaskGroups[0].Tasks[0].VolumeMounts, nil)
	j.TaskGroups[0].Volumes["x"] = nil
	// Neither Canonicalize nor Validate may panic on them.
	j.Canonicalize()
	err := j.Validate()
	must.ErrorIs(t, err, ErrInvalidRequest)
	for _, w := range []string{"task group 1 is null", `group "app": task 1 is null`, `volume_mount 1 is null`, `volume "x" is null`} {
		must.StrContains(t, err.Error(), w)
	}
}

func TestJob_ValidateDriverConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  map[string]any
		want string
	}{
		{"command and args", map[string]any{"command": "/bin/sh", "args": []any{"-c", "true"}}, ""},
		{"args as strings", map[string]any{"command": "/bin/sh", "args": []string{"-c"}}, ""},
		{"no config", nil, `task "server": bad driver config: raw_exec: option "command" must be a non-empty string, got nothing`},
		{"empty command", map[string]any{"command": ""}, `option "command" must be a non-empty string, got an empty string`},
		{"command not a string", map[string]any{"command": int64(3)}, `got a number`},
		{"args not a list", map[string]any{"command": "/bin/true", "args": "a b"}, `option "args" must be a list of strings, got a string`},
		{"arg not a string", map[string]any{"command": "/bin/true", "args": []any{"a", map[string]any{}}}, `args[1] must be a string, got an object`},
		{"unknown option", map[string]any{"command": "/bin/true", "image": "busybox"}, `unknown option "image"`},
		{"NUL in command", map[string]any{"command": "/bin/tr\x00ue"}, `"command" holds a NUL byte`},
		{"NUL in arg", map[string]any{"command": "/bin/true", "args": []any{"a\x00"}}, `args[0] holds a NUL byte`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := validJob(JobTypeService)
			j.TaskGroups[0].Tasks[0].Config = tc.cfg
			err := j.Validate()
			if tc.want == "" {
				must.NoError(t, err)
				return
			}
			must.ErrorIs(t, err, ErrInvalidRequest)
			must.StrContains(t, err.Error(), tc.want)
		})
	}
}

func TestJob_ValidateVolumeMountDestination(t *testing.T) {
	cases := []struct {
		dest string
		want string
	}{
		{"data", ""},
		{"srv/data", ""},
		{"local/data", ""},
		{".data", ""},
		{"", "destination is required"},
		{"/", `destination "/" must be relative to the task directory`},
		{"/srv", `destination "/srv" must be relative to the task directory (write "srv")`},
		{".", `destination "." is the task directory itself`},
		{"./", `destination "./" is not a clean path (write ".")`},
		{"data/", `destination "data/" is not a clean path (write "data")`},
		{"a//b", `destination "a//b" is not a clean path (write "a/b")`},
		{"a/../b", `destination "a/../b" is not a clean path (write "b")`},
		{"..", `destination ".." leaves the task directory`},
		{"../x", `destination "../x" leaves the task directory`},
		{"local", `destination "local" is reserved in the task directory`},
		{"secrets", `destination "secrets" is reserved`},
		{"alloc", `destination "alloc" is reserved`},
		{"tmp", `destination "tmp" is reserved`},
		{".rawexec", `destination ".rawexec" is reserved`},
		{".rawexec/x", `destination ".rawexec/x" is reserved`},
		{"da\x00ta", `destination "da\x00ta" holds a NUL byte`},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%q", tc.dest), func(t *testing.T) {
			j := validJob(JobTypeService)
			j.TaskGroups[0].Tasks[0].VolumeMounts[0].Destination = tc.dest
			err := j.Validate()
			if tc.want == "" {
				must.NoError(t, err)
				return
			}
			must.ErrorIs(t, err, ErrInvalidRequest)
			must.StrContains(t, err.Error(), `task "server": volume_mount of "data": `+tc.want)
		})
	}
}

func TestJob_ValidateVolumeMountOverlaps(t *testing.T) {
	j := validJob(JobTypeService)
	j.TaskGroups[0].Volumes["logs"] = &VolumeRequest{Name: "logs", Type: "csi", Source: "vol-2"}
	task := j.TaskGroups[0].Tasks[0]
	task.VolumeMounts = []*VolumeMount{{Volume: "data", Destination: "srv"}, {Volume: "logs", Destination: "srv/logs"}}
	err := j.Validate()
	must.ErrorContains(t, err, `volume_mount of "logs": destination "srv/logs" overlaps destination "srv"`)

	task.VolumeMounts = []*VolumeMount{{Volume: "data", Destination: "srv"}, {Volume: "logs", Destination: "logs"}}
	must.NoError(t, j.Validate())

	task.CSIPluginConfig = &TaskCSIPluginConfig{ID: "p", Type: CSIPluginTypeNode, MountDir: "/logs"}
	err = j.Validate()
	must.ErrorContains(t, err, `destination "logs" overlaps the csi_plugin mount_dir "/logs"`)

	// The default mount_dir counts too.
	task.CSIPluginConfig.MountDir = ""
	task.VolumeMounts[1].Destination = "csi/x"
	err = j.Validate()
	must.ErrorIs(t, err, ErrInvalidRequest)
	must.ErrorContains(t, err, `overlaps the csi_plugin mount_dir ""`)
}

// Resources near the top of int would overflow when a node's usage is
// summed, and a negative sum fits on any node.
func TestJob_ValidateResourceBounds(t *testing.T) {
	j := validJob(JobTypeService)
	j.TaskGroups[0].Tasks[0].Resources = &Resources{CPU: math.MaxInt64, MemoryMB: 10}
	err := j.Validate()
	must.ErrorIs(t, err, ErrInvalidRequest)
	must.StrContains(t, err.Error(), `task "server": resources: cpu 9223372036854775807, memory 10 and memory_max 0 must each be at most 16777216`)
	j.TaskGroups[0].Tasks[0].Resources = &Resources{CPU: MaxTaskResource, MemoryMB: MaxTaskResource}
	must.NoError(t, j.Validate())
}

// Memory under Nomad's minimum, or a memory_max under memory, is refused
// with the field named.
func TestJob_ValidateMemory(t *testing.T) {
	for _, tc := range []struct {
		r    Resources
		want string
	}{
		{Resources{CPU: 100, MemoryMB: 9}, `task "server": resources: memory 9 MB is under the minimum of 10 MB`},
		{Resources{CPU: 100, MemoryMB: 0}, `task "server": resources: memory 0 MB is under the minimum of 10 MB`},
		{Resources{CPU: 100, MemoryMB: 256, MemoryMaxMB: 128}, `task "server": resources: memory_max 128 MB is under memory 256 MB`},
		{Resources{CPU: 100, MemoryMB: 256, MemoryMaxMB: -1}, `task "server": resources must not be negative`},
		{Resources{CPU: 100, MemoryMB: 10}, ""},
		{Resources{CPU: 100, MemoryMB: 256, MemoryMaxMB: 512}, ""},
	} {
		j := validJob(JobTypeService)
		r := tc.r
		j.TaskGroups[0].Tasks[0].Resources = &r
		err := j.Validate()
		if tc.want == "" {
			must.NoError(t, err, must.Sprintf("%+v", tc.r))
			continue
		}
		must.ErrorIs(t, err, ErrInvalidRequest)
		must.StrContains(t, err.Error(), tc.want)
	}
}

// The exec driver takes raw_exec's options and refuses the rest by name.
func TestJob_ValidateExecConfig(t *testing.T) {
	j := validJob(JobTypeService)
	task := j.TaskGroups[0].Tasks[0]
	task.Driver = "exec"
	task.Config = map[string]any{"command": "/bin/sleep", "args": []any{"10"}}
	must.NoError(t, j.Validate())
	task.Config = map[string]any{"command": "/bin/sleep", "pid_mode": "host"}
	err := j.Validate()
	must.ErrorIs(t, err, ErrInvalidRequest)
	must.StrContains(t, err.Error(), `exec: unknown option "pid_mode" (known: command, args)`)
	task.Config = map[string]any{"args": []any{"x"}}
	must.StrContains(t, j.Validate().Error(), `exec: option "command" must be a non-empty string`)
	task.Driver = "docker"
	must.StrContains(t, j.Validate().Error(), `driver "docker" is not supported (supported: exec, raw_exec)`)

	task.Driver = "exec"
	task.Config = map[string]any{"command": "/bin/plugin"}
	task.CSIPluginConfig = &TaskCSIPluginConfig{ID: "p", Type: CSIPluginTypeNode}
	must.StrContains(t, j.Validate().Error(), `csi_plugin: a plugin task needs the raw_exec driver, not exec`)
	task.Driver = "raw_exec"
	must.NoError(t, j.Validate())
}
