package structs

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// validJob returns a canonicalized job that passes Validate.
func validJob(jobType string) *Job {
	j := &Job{
		ID:   "web",
		Type: jobType,
		TaskGroups: []*TaskGroup{{
			Name:  "app",
			Count: 1,
			Volumes: map[string]*VolumeRequest{
				"data": {Type: "csi", Source: "vol-1"},
			},
			Tasks: []*Task{{
				Name:         "server",
				Driver:       "raw_exec",
				Config:       map[string]any{"command": "/bin/sleep"},
				VolumeMounts: []*VolumeMount{{Volume: "data", Destination: "srv"}},
			}},
		}},
	}
	j.Canonicalize()
	return j
}

func TestJob_Canonicalize(t *testing.T) {
	cases := []struct {
		jobType    string
		restart    *RestartPolicy
		reschedule *ReschedulePolicy
		migrate    *MigrateStrategy
	}{
		{
			jobType:    JobTypeService,
			restart:    &RestartPolicy{Attempts: 2, Interval: 30 * time.Minute, Delay: 15 * time.Second, Mode: RestartPolicyModeFail},
			reschedule: &ReschedulePolicy{Delay: 30 * time.Second, DelayFunction: DelayFunctionExponential, MaxDelay: time.Hour, Unlimited: true},
			migrate:    &MigrateStrategy{MaxParallel: 1, HealthCheck: "task_states", MinHealthyTime: 10 * time.Second, HealthyDeadline: 5 * time.Minute},
		},
		{
			jobType:    JobTypeBatch,
			restart:    &RestartPolicy{Attempts: 3, Interval: 24 * time.Hour, Delay: 15 * time.Second, Mode: RestartPolicyModeFail},
			reschedule: &ReschedulePolicy{Attempts: 1, Interval: 24 * time.Hour, Delay: 5 * time.Second, DelayFunction: DelayFunctionConstant},
		},
		{
			jobType: JobTypeSystem,
			restart: &RestartPolicy{Attempts: 2, Interval: 30 * time.Minute, Delay: 15 * time.Second, Mode: RestartPolicyModeFail},
		},
	}
	for _, tc := range cases {
		t.Run(tc.jobType, func(t *testing.T) {
			j := &Job{ID: "web", Type: tc.jobType, TaskGroups: []*TaskGroup{{
				Name:    "app",
				Volumes: map[string]*VolumeRequest{"data": {Type: "csi", Source: "v"}},
				Tasks:   []*Task{{Name: "t", Driver: "raw_exec"}},
			}}}
			j.Canonicalize()

			must.Eq(t, DefaultNamespace, j.Namespace)
			must.Eq(t, "web", j.Name)
			must.Eq(t, JobDefaultPriority, j.Priority)
			must.Eq(t, []string{"*"}, j.Datacenters)
			tg := j.TaskGroups[0]
			must.Eq(t, 0, tg.Count) // zero is a valid count; parsers default it
			must.Eq(t, tc.restart, tg.RestartPolicy)
			must.Eq(t, tc.reschedule, tg.ReschedulePolicy)
			must.Eq(t, tc.migrate, tg.Migrate)
			must.Eq(t, "data", tg.Volumes["data"].Name)
			task := tg.Tasks[0]
			must.Eq(t, &Resources{CPU: 100, MemoryMB: 300}, task.Resources)
			must.Eq(t, DefaultKillTimeout, task.KillTimeout)
			must.Eq(t, "SIGINT", task.KillSignal)
		})
	}
}

func TestJob_Canonicalize_KeepsUserValues(t *testing.T) {
	restart := &RestartPolicy{Attempts: 0, Mode: RestartPolicyModeDelay}
	j := &Job{
		ID: "web", Name: "named", Type: JobTypeBatch, Priority: 90, Namespace: "default",
		Datacenters: []string{"dc1"},
		TaskGroups: []*TaskGroup{{
			Name:          "app",
			RestartPolicy: restart,
			Tasks: []*Task{{
				Name: "t", Driver: "raw_exec",
				Resources: &Resources{CPU: 1}, KillTimeout: time.Second, KillSignal: "SIGKILL",
			}},
		}},
	}
	j.Canonicalize()
	must.Eq(t, "named", j.Name)
	must.Eq(t, 90, j.Priority)
	must.Eq(t, []string{"dc1"}, j.Datacenters)
	must.Eq(t, &RestartPolicy{Mode: RestartPolicyModeDelay}, j.TaskGroups[0].RestartPolicy)
	must.Eq(t, &Resources{CPU: 1}, j.TaskGroups[0].Tasks[0].Resources)
	must.Eq(t, time.Second, j.TaskGroups[0].Tasks[0].KillTimeout)
	must.Eq(t, "SIGKILL", j.TaskGroups[0].Tasks[0].KillSignal)
}

func TestJob_Validate(t *testing.T) {
	cases := []struct {
		name    string
		jobType string // service when empty
		edit    func(j *Job)
		want    []string // substrings of the error; none means valid
	}{
		{name: "valid service"},
		{name: "valid batch", jobType: JobTypeBatch},
		{name: "valid system", jobType: JobTypeSystem},
		{name: "count zero", edit: func(j *Job) { j.TaskGroups[0].Count = 0 }},
		{name: "empty ID", edit: func(j *Job) { j.ID = "" }, want: []string{`job ID ""`}},
		{name: "ID with space", edit: func(j *Job) { j.ID = "my job" }, want: []string{`job ID "my job"`}},
		{name: "ID with slash", edit: func(j *Job) { j.ID = "a/b" }, want: []string{`job ID "a/b"`}},
		{name: "ID too long", edit: func(j *Job) { j.ID = strings.Repeat("a", 200) }, want: []string{"job ID", "at most 128"}},
		{name: "ID of 128", edit: func(j *Job) { j.ID = strings.Repeat("a", 128) }},
		{name: "other namespace", edit: func(j *Job) { j.Namespace = "prod" }, want: []string{`namespace "prod"`}},
		{name: "unknown type", edit: func(j *Job) { j.Type = "sysbatch" }, want: []string{`job type "sysbatch"`}},
		{name: "priority zero", edit: func(j *Job) { j.Priority = 0 }, want: []string{"priority 0 must be between 1 and 100"}},
		{name: "priority too high", edit: func(j *Job) { j.Priority = 101 }, want: []string{"priority 101"}},
		{name: "negative count", edit: func(j *Job) { j.TaskGroups[0].Count = -1 }, want: []string{`group "app"`, "count -1 must not be negative"}},
		{name: "system count 2", jobType: JobTypeSystem, edit: func(j *Job) { j.TaskGroups[0].Count = 2 }, want: []string{"system jobs", "count 2"}},
		{name: "no groups", edit: func(j *Job) { j.TaskGroups = nil }, want: []string{"job has no task groups"}},
		{name: "no tasks", edit: func(j *Job) { j.TaskGroups[0].Tasks = nil }, want: []string{"group has no tasks"}},
		{name: "group without name", edit: func(j *Job) { j.TaskGroups[0].Name = "" }, want: []string{"a task group has no name"}},
		{
			name: "duplicate group",
			edit: func(j *Job) {
				dup := *j.TaskGroups[0]
				j.TaskGroups = append(j.TaskGroups, &dup)
			},
			want: []string{`task group "app" is defined twice`},
		},
		{
			name: "duplicate task",
			edit: func(j *Job) {
				tg := j.TaskGroups[0]
				dup := *tg.Tasks[0]
				tg.Tasks = append(tg.Tasks, &dup)
			},
			want: []string{`task "server" is defined twice`},
		},
		{name: "task without name", edit: func(j *Job) { j.TaskGroups[0].Tasks[0].Name = "" }, want: []string{"a task has no name"}},
		{name: "missing driver", edit: func(j *Job) { j.TaskGroups[0].Tasks[0].Driver = "" }, want: []string{`task "server": driver is required`}},
		{name: "unknown driver", edit: func(j *Job) { j.TaskGroups[0].Tasks[0].Driver = "docker" }, want: []string{`task "server": driver "docker" is not supported`}},
		{name: "negative cpu", edit: func(j *Job) { j.TaskGroups[0].Tasks[0].Resources.CPU = -1 }, want: []string{"resources must not be negative"}},
		{name: "negative memory", edit: func(j *Job) { j.TaskGroups[0].Tasks[0].Resources.MemoryMB = -5 }, want: []string{"resources must not be negative"}},
		{name: "negative kill timeout", edit: func(j *Job) { j.TaskGroups[0].Tasks[0].KillTimeout = -time.Second }, want: []string{"kill_timeout must not be negative"}},
		{name: "bad restart mode", edit: func(j *Job) { j.TaskGroups[0].RestartPolicy.Mode = "retry" }, want: []string{`restart: mode "retry"`}},
		{name: "negative restart attempts", edit: func(j *Job) { j.TaskGroups[0].RestartPolicy.Attempts = -1 }, want: []string{"restart: attempts"}},
		{name: "bad delay function", edit: func(j *Job) { j.TaskGroups[0].ReschedulePolicy.DelayFunction = "linear" }, want: []string{`delay_function "linear"`}},
		{
			name: "max_delay below delay",
			edit: func(j *Job) {
				p := j.TaskGroups[0].ReschedulePolicy
				p.Delay, p.MaxDelay = time.Minute, time.Second
			},
			want: []string{"max_delay 1s is less than delay 1m0s"},
		},
		{
			name:    "reschedule on system job",
			jobType: JobTypeSystem,
			edit: func(j *Job) {
				j.TaskGroups[0].ReschedulePolicy = &ReschedulePolicy{DelayFunction: DelayFunctionConstant}
			},
			want: []string{"reschedule is not supported for system jobs"},
		},
		{name: "negative max_parallel", edit: func(j *Job) { j.TaskGroups[0].Migrate.MaxParallel = -1 }, want: []string{"migrate: max_parallel -1"}},
		{
			name: "volume_mount of unknown volume",
			edit: func(j *Job) { j.TaskGroups[0].Tasks[0].VolumeMounts[0].Volume = "logs" },
			want: []string{`volume_mount names volume "logs"`},
		},
		{
			name: "volume_mount without destination",
			edit: func(j *Job) { j.TaskGroups[0].Tasks[0].VolumeMounts[0].Destination = "" },
			want: []string{`volume_mount of "data": destination is required`},
		},
		{
			name: "csi plugin task",
			edit: func(j *Job) {
				j.TaskGroups[0].Tasks[0].CSIPluginConfig = &TaskCSIPluginConfig{ID: "hostpath", Type: CSIPluginTypeMonolith, MountDir: "/csi"}
			},
		},
		{
			name: "csi plugin without id",
			edit: func(j *Job) {
				j.TaskGroups[0].Tasks[0].CSIPluginConfig = &TaskCSIPluginConfig{Type: CSIPluginTypeNode}
			},
			want: []string{`task "server": csi_plugin: id is required`},
		},
		{
			name: "csi plugin bad type",
			edit: func(j *Job) {
				j.TaskGroups[0].Tasks[0].CSIPluginConfig = &TaskCSIPluginConfig{ID: "hostpath", Type: "both"}
			},
			want: []string{`csi_plugin: type "both" is not valid`},
		},
		{
			name: "csi plugin mount_dir escapes",
			edit: func(j *Job) {
				j.TaskGroups[0].Tasks[0].CSIPluginConfig = &TaskCSIPluginConfig{ID: "hostpath", Type: CSIPluginTypeNode, MountDir: "../x"}
			},
			want: []string{`mount_dir "../x" must stay inside the task directory`},
		},
		{
			name: "csi plugin controller_concurrency above the bound",
			edit: func(j *Job) {
				j.TaskGroups[0].Tasks[0].CSIPluginConfig = &TaskCSIPluginConfig{ID: "hostpath", Type: CSIPluginTypeController, ControllerConcurrency: 65}
			},
			want: []string{`csi_plugin: controller_concurrency 65 must be from 1 to 64`},
		},
		{
			name: "csi plugin controller_concurrency negative",
			edit: func(j *Job) {
				j.TaskGroups[0].Tasks[0].CSIPluginConfig = &TaskCSIPluginConfig{ID: "hostpath", Type: CSIPluginTypeController, ControllerConcurrency: -1}
			},
			want: []string{`csi_plugin: controller_concurrency -1 must be from 1 to 64`},
		},
		{
			name: "csi plugin controller_concurrency on a node plugin",
			edit: func(j *Job) {
				j.TaskGroups[0].Tasks[0].CSIPluginConfig = &TaskCSIPluginConfig{ID: "hostpath", Type: CSIPluginTypeNode, ControllerConcurrency: 4}
			},
			want: []string{`controller_concurrency is for a controller or monolith plugin, not type "node"`},
		},
		{name: "volume type host", edit: func(j *Job) { j.TaskGroups[0].Volumes["data"].Type = "host" }, want: []string{`volume "data": type "host" is not supported`}},
		{name: "volume without source", edit: func(j *Job) { j.TaskGroups[0].Volumes["data"].Source = "" }, want: []string{`volume "data": source is required`}},
		{name: "ID with NUL", edit: func(j *Job) { j.ID = "a\x00b" }, want: []string{`job ID "a\x00b" holds a NUL`}},
		{name: "ID dot dot", edit: func(j *Job) { j.ID = ".." }, want: []string{`job ID ".."`}},
		{name: "group name traversal", edit: func(j *Job) { j.TaskGroups[0].Name = "../../g" }, want: []string{`task group name "../../g"`}},
		{name: "group name with slash", edit: func(j *Job) { j.TaskGroups[0].Name = "a/b" }, want: []string{`task group name "a/b" holds '/'`}},
		{name: "task name traversal", edit: func(j *Job) { j.TaskGroups[0].Tasks[0].Name = ".." }, want: []string{`task name ".."`}},
		{name: "task name with backslash", edit: func(j *Job) { j.TaskGroups[0].Tasks[0].Name = `a\b` }, want: []string{`task name "a\\b"`}},
		{name: "task name with NUL", edit: func(j *Job) { j.TaskGroups[0].Tasks[0].Name = "t\x00" }, want: []string{`task name "t\x00" holds a NUL`}},
		{
			name: "volume source traversal",
			edit: func(j *Job) { j.TaskGroups[0].Volumes["data"].Source = strings.Repeat("../", 10) + "etc" },
			want: []string{`volume "data": volume source "../../../`},
		},
		{name: "volume source with NUL", edit: func(j *Job) { j.TaskGroups[0].Volumes["data"].Source = "v\x00" }, want: []string{`volume source "v\x00"`}},
		{
			name: "per-alloc volume source",
			edit: func(j *Job) {
				j.TaskGroups[0].Count = 3
				j.TaskGroups[0].Volumes["data"].PerAlloc = true
			},
		},
		{
			name: "per-alloc volume source too long with its index",
			edit: func(j *Job) {
				j.TaskGroups[0].Count = 11
				j.TaskGroups[0].Volumes["data"].Source = strings.Repeat("v", 125)
				j.TaskGroups[0].Volumes["data"].PerAlloc = true
			},
			want: []string{`volume source "` + strings.Repeat("v", 125) + `[10]" is 129 bytes`},
		},
		{
			name: "csi plugin ID traversal",
			edit: func(j *Job) {
				j.TaskGroups[0].Tasks[0].CSIPluginConfig = &TaskCSIPluginConfig{ID: "../../p", Type: CSIPluginTypeNode}
			},
			want: []string{`csi_plugin: plugin ID "../../p"`},
		},
		{
			name: "every problem is reported",
			edit: func(j *Job) {
				j.ID = ""
				j.Priority = 1000
				j.TaskGroups[0].Tasks[0].Driver = ""
			},
			want: []string{"job ID", "priority 1000", "driver is required"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			jobType := tc.jobType
			if jobType == "" {
				jobType = JobTypeService
			}
			j := validJob(jobType)
			if tc.edit != nil {
				tc.edit(j)
			}
			err := j.Validate()
			if len(tc.want) == 0 {
				must.NoError(t, err)
				return
			}
			must.Error(t, err)
			must.True(t, errors.Is(err, ErrInvalidRequest))
			for _, w := range tc.want {
				must.StrContains(t, err.Error(), w)
			}
		})
	}
}

func TestJob_CanonicalizeCSIPluginMountDir(t *testing.T) {
	j := validJob(JobTypeSystem)
	j.TaskGroups[0].Tasks[0].CSIPluginConfig = &TaskCSIPluginConfig{ID: "hostpath", Type: CSIPluginTypeMonolith}
	j.Canonicalize()
	must.Eq(t, DefaultCSIPluginMountDir, j.TaskGroups[0].Tasks[0].CSIPluginConfig.MountDir)
}
