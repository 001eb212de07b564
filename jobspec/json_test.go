package jobspec

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func ptr[T any](v T) *T { return &v }

// nomadJob builds a job with Nomad's own client package and canonicalizes
// it there, so every field is populated as the real client sends it.
func nomadJob(jobType string, count int, edit func(*api.Job)) *api.Job {
	var job *api.Job
	switch jobType {
	case structs.JobTypeBatch:
		job = api.NewBatchJob("web", "web", "global", 60)
	case structs.JobTypeSystem:
		job = api.NewSystemJob("web", "web", "global", 60)
	default:
		job = api.NewServiceJob("web", "web", "global", 60)
	}
	job.Datacenters = []string{"dc1"}
	tg := api.NewTaskGroup("app", count)
	tg.Volumes = map[string]*api.VolumeRequest{"data": {
		Name: "data", Type: "csi", Source: "vol-1",
		AccessMode: "single-node-writer", AttachmentMode: "file-system",
		MountOptions: &api.CSIMountOptions{FSType: "ext4"},
	}}
	task := api.NewTask("server", "raw_exec").
		SetConfig("command", "/bin/sleep").
		SetConfig("args", []string{"10"}).
		Require(&api.Resources{CPU: ptr(200), MemoryMB: ptr(64), MemoryMaxMB: ptr(96)})
	task.Env = map[string]string{"PORT": "8080"}
	task.KillTimeout = ptr(20 * time.Second)
	task.VolumeMounts = []*api.VolumeMount{{Volume: ptr("data"), Destination: ptr("srv/data")}}
	tg.AddTask(task)
	job.AddTaskGroup(tg)
	if edit != nil {
		edit(job)
	}
	job.Canonicalize()
	return job
}

func marshalRegister(t *testing.T, job *api.Job) []byte {
	t.Helper()
	buf, err := json.Marshal(&api.JobRegisterRequest{Job: job})
	must.NoError(t, err)
	return buf
}

func TestParseJSON_NomadClient(t *testing.T) {
	cases := []struct {
		jobType string
		count   int
	}{
		{structs.JobTypeService, 3},
		{structs.JobTypeBatch, 2},
		{structs.JobTypeSystem, 1},
	}
	for _, tc := range cases {
		t.Run(tc.jobType, func(t *testing.T) {
			job, err := ParseJSON(marshalRegister(t, nomadJob(tc.jobType, tc.count, nil)))
			must.NoError(t, err)

			must.Eq(t, "web", job.ID)
			must.Eq(t, "web", job.Name)
			must.Eq(t, tc.jobType, job.Type)
			must.Eq(t, 60, job.Priority)
			must.Eq(t, "global", job.Region)
			must.Eq(t, structs.DefaultNamespace, job.Namespace)
			must.Eq(t, []string{"dc1"}, job.Datacenters)
			must.Len(t, 1, job.TaskGroups)
			tg := job.TaskGroups[0]
			must.Eq(t, "app", tg.Name)
			must.Eq(t, tc.count, tg.Count)
			must.NotNil(t, tg.RestartPolicy)
			must.Eq(t, structs.RestartPolicyModeFail, tg.RestartPolicy.Mode)
			must.Eq(t, 15*time.Second, tg.RestartPolicy.Delay)
			if tc.jobType == structs.JobTypeSystem {
				must.Nil(t, tg.ReschedulePolicy)
			} else {
				must.NotNil(t, tg.ReschedulePolicy)
			}
			must.Eq(t, map[string]*structs.VolumeRequest{"data": {
				Name: "data", Type: "csi", Source: "vol-1",
				AccessMode: "single-node-writer", AttachmentMode: "file-system",
				MountOptions: &structs.CSIMountOptions{FSType: "ext4"},
			}}, tg.Volumes)

			must.Len(t, 1, tg.Tasks)
			task := tg.Tasks[0]
			must.Eq(t, "server", task.Name)
			must.Eq(t, "raw_exec", task.Driver)
			must.Eq(t, map[string]any{
				"command": "/bin/sleep",
				"args":    []any{"10"},
			}, task.Config)
			must.Eq(t, map[string]string{"PORT": "8080"}, task.Env)
			must.Eq(t, &structs.Resources{CPU: 200, MemoryMB: 64, MemoryMaxMB: 96}, task.Resources)
			must.Eq(t, 20*time.Second, task.KillTimeout)
			must.Eq(t, []*structs.VolumeMount{{Volume: "data", Destination: "srv/data"}}, task.VolumeMounts)
		})
	}
}

func TestParseJSON_NomadClientPolicies(t *testing.T) {
	job, err := ParseJSON(marshalRegister(t, nomadJob(structs.JobTypeService, 2, func(j *api.Job) {
		tg := j.TaskGroups[0]
		tg.RestartPolicy = &api.RestartPolicy{Attempts: ptr(9), Mode: ptr("delay")}
		tg.ReschedulePolicy = &api.ReschedulePolicy{DelayFunction: ptr("fibonacci"), MaxDelay: ptr(10 * time.Minute)}
		tg.Migrate = &api.MigrateStrategy{MaxParallel: ptr(3)}
		tg.Meta = map[string]string{"k": "v"}
		j.Meta = map[string]string{"owner": "storage"}
	})))
	must.NoError(t, err)
	tg := job.TaskGroups[0]
	must.Eq(t, 9, tg.RestartPolicy.Attempts)
	must.Eq(t, "delay", tg.RestartPolicy.Mode)
	must.Eq(t, 30*time.Minute, tg.RestartPolicy.Interval)
	must.Eq(t, "fibonacci", tg.ReschedulePolicy.DelayFunction)
	must.Eq(t, 10*time.Minute, tg.ReschedulePolicy.MaxDelay)
	must.Eq(t, 3, tg.Migrate.MaxParallel)
	must.Eq(t, map[string]string{"k": "v"}, tg.Meta)
	must.Eq(t, map[string]string{"owner": "storage"}, job.Meta)
}

func TestParseJSON_NomadClientUnsupported(t *testing.T) {
	cases := []struct {
		name string
		edit func(*api.Job)
		want []string
	}{
		{
			name: "group constraint",
			edit: func(j *api.Job) {
				j.TaskGroups[0].Constrain(api.NewConstraint("${attr.kernel.name}", "=", "linux"))
			},
			want: []string{"Job.TaskGroups[0].Constraints is not supported"},
		},
		{
			name: "group network bridge",
			edit: func(j *api.Job) {
				j.TaskGroups[0].Networks = []*api.NetworkResource{{Mode: "bridge"}}
			},
			want: []string{`network: mode "bridge" is not supported yet; Roam has host networking only`},
		},
		{
			name: "group network with a CIDR",
			edit: func(j *api.Job) {
				j.TaskGroups[0].Networks = []*api.NetworkResource{{Mode: "host", CIDR: "10.0.0.0/8"}}
			},
			want: []string{"Job.TaskGroups[0].Networks[0].CIDR is not supported"},
		},
		{
			name: "task service and artifact headers",
			edit: func(j *api.Job) {
				task := j.TaskGroups[0].Tasks[0]
				task.Services = []*api.Service{{Name: "web"}}
				task.Artifacts = []*api.TaskArtifact{{GetterSource: ptr("https://example.com/x"), GetterHeaders: map[string]string{"X": "y"}}}
			},
			want: []string{
				"Job.TaskGroups[0].Tasks[0].Services is not supported",
				"Job.TaskGroups[0].Tasks[0].Artifacts[0].GetterHeaders is not supported",
			},
		},
		{
			name: "non-default update strategy",
			edit: func(j *api.Job) {
				j.Update = &api.UpdateStrategy{Canary: ptr(2)}
			},
			want: []string{"Job.Update is not supported", "Job.TaskGroups[0].Update is not supported"},
		},
		{
			name: "task-level restart",
			edit: func(j *api.Job) {
				j.TaskGroups[0].Tasks[0].RestartPolicy = &api.RestartPolicy{Attempts: ptr(8)}
			},
			want: []string{"Job.TaskGroups[0].Tasks[0].RestartPolicy is not supported"},
		},
		{
			name: "sticky volume and propagation mode",
			edit: func(j *api.Job) {
				j.TaskGroups[0].Volumes["data"].Sticky = true
				j.TaskGroups[0].Tasks[0].VolumeMounts[0].PropagationMode = ptr("bidirectional")
			},
			want: []string{
				`Job.TaskGroups[0].Volumes["data"].Sticky is not supported`,
				"Job.TaskGroups[0].Tasks[0].VolumeMounts[0].PropagationMode is not supported",
			},
		},
		{
			name: "periodic",
			edit: func(j *api.Job) {
				j.Periodic = &api.PeriodicConfig{Spec: ptr("*/5 * * * *")}
			},
			want: []string{"Job.Periodic is not supported"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job, err := ParseJSON(marshalRegister(t, nomadJob(structs.JobTypeService, 1, tc.edit)))
			must.Error(t, err)
			must.Nil(t, job)
			must.True(t, errors.Is(err, structs.ErrInvalidRequest))
			for _, w := range tc.want {
				must.StrContains(t, err.Error(), w)
			}
		})
	}
}

const bareJSON = `{
  "ID": "db",
  "Type": "batch",
  "TaskGroups": [{
    "Name": "g",
    "Tasks": [{
      "Name": "t",
      "Driver": "raw_exec",
      "Config": {"command": "/bin/true", "args": ["-c", "x"]},
      "KillTimeout": 7000000000
    }],
    "RestartPolicy": {"Attempts": 1, "Interval": 60000000000, "Delay": 1000000000, "Mode": "delay"}
  }]
}`

func TestParseJSON(t *testing.T) {
	cases := []struct {
		name  string
		src   string
		check func(t *testing.T, job *structs.Job)
		want  []string // substrings of the error; none means success
	}{
		{
			name: "bare job",
			src:  bareJSON,
			check: func(t *testing.T, job *structs.Job) {
				must.Eq(t, "db", job.ID)
				must.Eq(t, structs.JobTypeBatch, job.Type)
				tg := job.TaskGroups[0]
				must.Eq(t, 1, tg.Count)
				must.Eq(t, &structs.RestartPolicy{Attempts: 1, Interval: time.Minute, Delay: time.Second, Mode: "delay"}, tg.RestartPolicy)
				task := tg.Tasks[0]
				must.Eq(t, 7*time.Second, task.KillTimeout)
				must.Eq(t, map[string]any{"command": "/bin/true", "args": []any{"-c", "x"}}, task.Config)
			},
		},
		{
			name: "wrapped with null count",
			src:  `{"Job": {"ID": "a", "TaskGroups": [{"Name": "g", "Count": null, "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]}}`,
			check: func(t *testing.T, job *structs.Job) {
				must.Eq(t, 1, job.TaskGroups[0].Count)
			},
		},
		{
			name: "count zero is kept",
			src:  `{"Job": {"ID": "a", "TaskGroups": [{"Name": "g", "Count": 0, "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]}}`,
			check: func(t *testing.T, job *structs.Job) {
				must.Eq(t, 0, job.TaskGroups[0].Count)
			},
		},
		{
			name: "zero-valued unsupported fields are accepted",
			src: `{"Job": {"ID": "a", "Constraints": null, "Affinities": [], "Periodic": null,
  "ParentID": "", "Dispatched": false, "Multiregion": {}, "Typo": 0,
  "Status": "running", "Version": 4, "CreateIndex": 10,
  "TaskGroups": [{"Name": "g", "Networks": [], "Services": null, "ShutdownDelay": 0,
    "EphemeralDisk": {"Sticky": false, "Migrate": false, "SizeMB": 0},
    "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}, "User": "", "Leader": false,
      "Lifecycle": {"Hook": "", "Sidecar": false}, "Templates": [],
      "Resources": {"CPU": 10, "MemoryMB": 20, "Cores": 0, "DiskMB": null, "Networks": null}}]}]},
  "EnforceIndex": false, "JobModifyIndex": 0}`,
			check: func(t *testing.T, job *structs.Job) {
				must.Eq(t, &structs.Resources{CPU: 10, MemoryMB: 20}, job.TaskGroups[0].Tasks[0].Resources)
			},
		},
		{
			name: "non-zero unsupported and unknown fields",
			src: `{"Job": {"ID": "a", "NodePool": "gpu", "Typo": "x",
  "TaskGroups": [{"Name": "g", "ShutdownDelay": 5000000000,
    "Tasks": [{"Name": "t", "Driver": "raw_exec", "Leader": true,
      "Resources": {"Cores": 2}}]}]},
  "EnforceIndex": true}`,
			want: []string{
				"EnforceIndex is not supported",
				"Job.NodePool is not supported",
				"Job.Typo is not supported",
				"Job.TaskGroups[0].ShutdownDelay is not supported",
				"Job.TaskGroups[0].Tasks[0].Leader is not supported",
				"Job.TaskGroups[0].Tasks[0].Resources.Cores is not supported",
			},
		},
		{
			name: "field names are case-sensitive",
			src:  `{"ID": "a", "count": 2, "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]}`,
			want: []string{"Job.count is not supported"},
		},
		{
			name: "malformed",
			src:  `{"Job": {"ID": "a",}}`,
			want: []string{"decoding job JSON"},
		},
		{
			name: "trailing data",
			src:  `{"ID": "a"} {"ID": "b"}`,
			want: []string{"data after the job object"},
		},
		{
			name: "not an object",
			src:  `[1, 2]`,
			want: []string{"decoding job JSON"},
		},
		{
			name: "wrong type",
			src:  `{"ID": "a", "TaskGroups": [{"Name": "g", "Count": "two", "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]}`,
			want: []string{"Count"},
		},
		{
			name: "validation",
			src:  `{"ID": "a b", "TaskGroups": [{"Name": "g", "Count": -2, "Tasks": [{"Name": "t"}]}]}`,
			want: []string{`job ID "a b"`, "count -2 must not be negative", "driver is required"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job, err := ParseJSON([]byte(tc.src))
			if len(tc.want) == 0 {
				must.NoError(t, err)
				tc.check(t, job)
				return
			}
			must.Error(t, err)
			must.Nil(t, job)
			must.True(t, errors.Is(err, structs.ErrInvalidRequest))
			for _, w := range tc.want {
				must.StrContains(t, err.Error(), w)
			}
		})
	}
}

func TestParseJSON_NomadClientCSIPlugin(t *testing.T) {
	job, err := ParseJSON(marshalRegister(t, nomadJob(structs.JobTypeSystem, 1, func(j *api.Job) {
		j.TaskGroups[0].Volumes = nil
		task := j.TaskGroups[0].Tasks[0]
		task.VolumeMounts = nil
		task.CSIPluginConfig = &api.TaskCSIPluginConfig{ID: "hostpath", Type: api.CSIPluginTypeMonolith}
	})))
	must.NoError(t, err)
	// Nomad's client fills in MountDir "/csi": inside the task directory.
	must.Eq(t, &structs.TaskCSIPluginConfig{ID: "hostpath", Type: "monolith", MountDir: "/csi"},
		job.TaskGroups[0].Tasks[0].CSIPluginConfig)

	_, err = ParseJSON(marshalRegister(t, nomadJob(structs.JobTypeSystem, 1, func(j *api.Job) {
		j.TaskGroups[0].Tasks[0].CSIPluginConfig = &api.TaskCSIPluginConfig{
			ID: "hostpath", Type: api.CSIPluginTypeNode, HealthTimeout: time.Minute,
		}
	})))
	must.ErrorContains(t, err, "Job.TaskGroups[0].Tasks[0].CSIPluginConfig.HealthTimeout is not supported")
}
