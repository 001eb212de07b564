package jobspec

import (
	"testing"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func TestParseHCL_Lifecycle(t *testing.T) {
	job, err := ParseHCL("job.hcl", []byte(`job "a" {
  group "g" {
    task "init" {
      driver = "raw_exec"
      config { command = "/bin/true" }
      lifecycle {
        hook    = "prestart"
        sidecar = false
      }
    }
    task "main" {
      driver = "raw_exec"
      config { command = "/bin/true" }
    }
  }
}`))
	must.NoError(t, err)
	must.Eq(t, &structs.TaskLifecycleConfig{Hook: "prestart"}, job.TaskGroups[0].Tasks[0].Lifecycle)
	must.Nil(t, job.TaskGroups[0].Tasks[1].Lifecycle)
}

// A hook that does not exist, a sidecar poststop, a group of hooks only:
// refused with the task named.
func TestParseHCL_LifecycleErrors(t *testing.T) {
	for _, tc := range []struct{ name, task, want string }{
		{"unknown hook", `lifecycle { hook = "prestop" }`, `task "t": lifecycle: hook "prestop" is not one of prestart, poststart, poststop`},
		{"no hook", `lifecycle { sidecar = true }`, `task "t": lifecycle: hook "" is not one of`},
		{"sidecar poststop", "lifecycle {\n hook = \"poststop\"\n sidecar = true\n}", `task "t": lifecycle: a poststop task cannot be a sidecar`},
		{"no main task", `lifecycle { hook = "prestart" }`, `a group needs at least one main task`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job, err := ParseHCL("job.hcl", []byte(oneTask("", tc.task)))
			must.Nil(t, job)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.ErrorContains(t, err, tc.want)
		})
	}
}

func TestParseJSON_NomadClientLifecycle(t *testing.T) {
	job, err := ParseJSON(marshalRegister(t, nomadJob(structs.JobTypeBatch, 1, func(j *api.Job) {
		init := api.NewTask("init", "raw_exec").SetConfig("command", "/bin/true")
		init.Lifecycle = &api.TaskLifecycle{Hook: api.TaskLifecycleHookPrestart, Sidecar: true}
		j.TaskGroups[0].AddTask(init)
	})))
	must.NoError(t, err)
	tasks := job.TaskGroups[0].Tasks
	must.Nil(t, tasks[0].Lifecycle)
	must.Eq(t, &structs.TaskLifecycleConfig{Hook: "prestart", Sidecar: true}, tasks[1].Lifecycle)
}
