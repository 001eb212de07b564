package jobspec

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

const fullHCL = `
job "web" {
  type        = "service"
  datacenters = ["dc1", "dc2"]
  priority    = 70
  region      = "global"
  namespace   = "default"
  all_at_once = true

  meta {
    owner = "storage"
    tier  = 2
  }

  group "app" {
    count = 3

    meta {
      group = "app"
    }

    restart {
      attempts = 4
      interval = "10m"
      delay    = "20s"
      mode     = "delay"
    }

    reschedule {
      attempts       = 5
      interval       = "1h"
      delay          = "10s"
      delay_function = "fibonacci"
      max_delay      = "5m"
      unlimited      = false
    }

    migrate {
      max_parallel     = 2
      health_check     = "task_states"
      min_healthy_time = "15s"
      healthy_deadline = "3m"
    }

    volume "data" {
      type            = "csi"
      source          = "vol-1"
      read_only       = false
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
      per_alloc       = true

      mount_options {
        fs_type     = "ext4"
        mount_flags = ["noatime"]
      }
    }

    task "server" {
      driver = "raw_exec"

      config {
        command = "/bin/sleep"
        args    = ["10", "20"]
      }

      env {
        PORT = "8080"
      }

      resources {
        cpu        = 250
        memory     = 128
        memory_max = 256
      }

      kill_timeout = "20s"
      kill_signal  = "SIGTERM"

      meta {
        role = "server"
      }

      volume_mount {
        volume      = "data"
        destination = "srv/data"
        read_only   = true
      }
    }
  }
}
`

func TestParseHCL_Full(t *testing.T) {
	job, err := ParseHCL("web.hcl", []byte(fullHCL))
	must.NoError(t, err)

	must.Eq(t, "web", job.ID)
	must.Eq(t, "web", job.Name)
	must.Eq(t, structs.JobTypeService, job.Type)
	must.Eq(t, []string{"dc1", "dc2"}, job.Datacenters)
	must.Eq(t, 70, job.Priority)
	must.Eq(t, "global", job.Region)
	must.Eq(t, structs.DefaultNamespace, job.Namespace)
	must.True(t, job.AllAtOnce)
	must.Eq(t, map[string]string{"owner": "storage", "tier": "2"}, job.Meta)

	must.Len(t, 1, job.TaskGroups)
	tg := job.TaskGroups[0]
	must.Eq(t, "app", tg.Name)
	must.Eq(t, 3, tg.Count)
	must.Eq(t, map[string]string{"group": "app"}, tg.Meta)
	must.Eq(t, &structs.RestartPolicy{Attempts: 4, Interval: 10 * time.Minute, Delay: 20 * time.Second, Mode: "delay"}, tg.RestartPolicy)
	must.Eq(t, &structs.ReschedulePolicy{Attempts: 5, Interval: time.Hour, Delay: 10 * time.Second,
		DelayFunction: "fibonacci", MaxDelay: 5 * time.Minute}, tg.ReschedulePolicy)
	must.Eq(t, &structs.MigrateStrategy{MaxParallel: 2, HealthCheck: "task_states",
		MinHealthyTime: 15 * time.Second, HealthyDeadline: 3 * time.Minute}, tg.Migrate)
	must.Eq(t, map[string]*structs.VolumeRequest{"data": {
		Name: "data", Type: "csi", Source: "vol-1", PerAlloc: true,
		AccessMode: "single-node-writer", AttachmentMode: "file-system",
		MountOptions: &structs.CSIMountOptions{FSType: "ext4", MountFlags: []string{"noatime"}},
	}}, tg.Volumes)

	must.Len(t, 1, tg.Tasks)
	task := tg.Tasks[0]
	must.Eq(t, "server", task.Name)
	must.Eq(t, "raw_exec", task.Driver)
	must.Eq(t, map[string]any{
		"command": "/bin/sleep",
		"args":    []any{"10", "20"},
	}, task.Config)
	must.Eq(t, map[string]string{"PORT": "8080"}, task.Env)
	must.Eq(t, &structs.Resources{CPU: 250, MemoryMB: 128, MemoryMaxMB: 256}, task.Resources)
	must.Eq(t, 20*time.Second, task.KillTimeout)
	must.Eq(t, "SIGTERM", task.KillSignal)
	must.Eq(t, map[string]string{"role": "server"}, task.Meta)
	must.Eq(t, []*structs.VolumeMount{{Volume: "data", Destination: "srv/data", ReadOnly: true}}, task.VolumeMounts)
}

func TestParseHCL_Defaults(t *testing.T) {
	cases := []struct {
		name  string
		src   string
		check func(t *testing.T, job *structs.Job)
	}{
		{
			name: "no count runs once",
			src:  oneTask("", ""),
			check: func(t *testing.T, job *structs.Job) {
				tg := job.TaskGroups[0]
				must.Eq(t, 1, tg.Count)
				must.Eq(t, structs.JobTypeService, job.Type)
				must.Eq(t, structs.JobDefaultPriority, job.Priority)
				must.Eq(t, []string{"*"}, job.Datacenters)
				must.NotNil(t, tg.RestartPolicy)
				must.NotNil(t, tg.ReschedulePolicy)
				must.NotNil(t, tg.Migrate)
				must.Eq(t, &structs.Resources{CPU: 100, MemoryMB: 300}, tg.Tasks[0].Resources)
				must.Eq(t, structs.DefaultKillTimeout, tg.Tasks[0].KillTimeout)
			},
		},
		{
			name: "count zero is kept",
			src:  oneTask("count = 0", ""),
			check: func(t *testing.T, job *structs.Job) {
				must.Eq(t, 0, job.TaskGroups[0].Count)
			},
		},
		{
			name: "partial blocks take the type's defaults",
			src: `job "a" {
  type = "batch"
  group "g" {
    restart { attempts = 7 }
    reschedule { delay = "1m" }
    task "t" {
      driver = "raw_exec"
      config { command = "/bin/true" }
      resources { cpu = 500 }
    }
  }
}`,
			check: func(t *testing.T, job *structs.Job) {
				tg := job.TaskGroups[0]
				must.Eq(t, &structs.RestartPolicy{Attempts: 7, Interval: 24 * time.Hour, Delay: 15 * time.Second, Mode: "fail"}, tg.RestartPolicy)
				must.Eq(t, time.Minute, tg.ReschedulePolicy.Delay)
				must.Eq(t, "constant", tg.ReschedulePolicy.DelayFunction)
				must.Eq(t, 1, tg.ReschedulePolicy.Attempts)
				must.Nil(t, tg.Migrate)
				must.Eq(t, &structs.Resources{CPU: 500, MemoryMB: 300}, tg.Tasks[0].Resources)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job, err := ParseHCL("job.hcl", []byte(tc.src))
			must.NoError(t, err)
			tc.check(t, job)
		})
	}
}

func TestParseHCL_Errors(t *testing.T) {
	cases := []struct {
		name string
		src  string
		// want are substrings of the error.
		want []string
	}{
		{
			name: "unknown attribute",
			src: `job "a" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      leader = true
    }
  }
}`,
			want: []string{"job.hcl:5,7", "Unsupported argument", `"leader"`},
		},
		{
			name: "unknown job block",
			src: `job "a" {
  update {
    max_parallel = 1
  }
  group "g" {
    task "t" { driver = "raw_exec" }
  }
}`,
			want: []string{"job.hcl:2,3", "Unsupported block type", `"update"`},
		},
		{
			name: "unknown group blocks",
			src: `job "a" {
  group "g" {
    service {
      name = "web"
    }
    task "t" { driver = "raw_exec" }
  }
}`,
			want: []string{"job.hcl:3,5", `"service"`},
		},
		{
			name: "unknown task blocks",
			src: `job "a" {
  group "g" {
    constraint {
      attribute = "x"
    }
    task "t" {
      driver = "raw_exec"
      vault { policies = ["x"] }
      service { name = "x" }
    }
  }
}`,
			want: []string{"job.hcl:3,5", `"constraint"`, "job.hcl:8,7", `"vault"`, "job.hcl:9,7", `"service"`},
		},
		{
			name: "unknown top-level block",
			src:  `variable "x" {}`,
			want: []string{"job.hcl:1,1", `"variable"`},
		},
		{
			name: "syntax error",
			src: `job "a" {
  group "g" {
    count = 
  }
}`,
			want: []string{"job.hcl:3,"},
		},
		{
			name: "bad duration",
			src: `job "a" {
  group "g" {
    restart {
      delay = "soon"
    }
    task "t" { driver = "raw_exec" }
  }
}`,
			want: []string{"job.hcl:4,15", "Invalid duration", "delay"},
		},
		{
			name: "duration not a string",
			src: `job "a" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      kill_timeout = ["5s"]
    }
  }
}`,
			want: []string{"job.hcl:5,"},
		},
		{
			name: "config with a block",
			src: `job "a" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        mount { x = 1 }
      }
    }
  }
}`,
			want: []string{"job.hcl:6,"},
		},
		{
			name: "no job",
			src:  "# nothing here\n",
			want: []string{"job.hcl", "no job block"},
		},
		{
			name: "two jobs",
			src:  oneTask("", "") + "\n" + oneTask("", ""),
			want: []string{"job.hcl:11,1", "one job block", "found 2"},
		},
		{
			name: "duplicate volume",
			src: `job "a" {
  group "g" {
    volume "v" {
      type = "csi"
      source = "x"
    }
    volume "v" {
      type = "csi"
      source = "y"
    }
    task "t" { driver = "raw_exec" }
  }
}`,
			want: []string{"job.hcl:7,", "Duplicate volume block"},
		},
		{
			name: "negative count fails validation",
			src:  oneTask("count = -1", ""),
			want: []string{"count -1 must not be negative"},
		},
		{
			name: "missing driver fails validation",
			src: `job "a" {
  group "g" {
    task "t" {}
  }
}`,
			want: []string{`task "t": driver is required`},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job, err := ParseHCL("job.hcl", []byte(tc.src))
			must.Error(t, err)
			must.Nil(t, job)
			must.True(t, errors.Is(err, structs.ErrInvalidRequest))
			for _, w := range tc.want {
				must.StrContains(t, err.Error(), w)
			}
		})
	}
}

// oneTask is a job "a" with group "g" holding group and task "t" holding
// task besides its raw_exec driver.
func oneTask(group, task string) string {
	return `job "a" {
  group "g" {
    ` + group + `
    task "t" {
      driver = "raw_exec"
      config { command = "/bin/true" }
      ` + task + `
    }
  }
}`
}

func TestParseHCL_CSIPlugin(t *testing.T) {
	src := `
job "plugin" {
  type = "system"
  group "p" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/plugin"
      }
      csi_plugin {
        id        = "hostpath"
        type      = "monolith"
        mount_dir = "sock"
      }
    }
    task "defaulted" {
      driver = "raw_exec"
      config {
        command = "/bin/plugin"
      }
      csi_plugin {
        id   = "other"
        type = "node"
      }
    }
  }
}
`
	job, err := ParseHCL("plugin.hcl", []byte(src))
	must.NoError(t, err)
	tasks := job.TaskGroups[0].Tasks
	must.Eq(t, &structs.TaskCSIPluginConfig{ID: "hostpath", Type: "monolith", MountDir: "sock"}, tasks[0].CSIPluginConfig)
	must.Eq(t, &structs.TaskCSIPluginConfig{ID: "other", Type: "node", MountDir: structs.DefaultCSIPluginMountDir}, tasks[1].CSIPluginConfig)

	bad := strings.Replace(src, `type      = "monolith"`, `type      = "sidecar"`, 1)
	_, err = ParseHCL("plugin.hcl", []byte(bad))
	must.ErrorContains(t, err, `csi_plugin: type "sidecar" is not valid`)

	withConcurrency := func(v string) string {
		return strings.Replace(src, `mount_dir = "sock"`, `mount_dir = "sock"
        controller_concurrency = `+v, 1)
	}
	job, err = ParseHCL("plugin.hcl", []byte(withConcurrency("16")))
	must.NoError(t, err)
	must.Eq(t, 16, job.TaskGroups[0].Tasks[0].CSIPluginConfig.ControllerConcurrency)
	must.Zero(t, job.TaskGroups[0].Tasks[1].CSIPluginConfig.ControllerConcurrency, must.Sprint("unset means the default"))
	for v, want := range map[string]string{
		"0":     "controller_concurrency = 0: must be from 1 to 64",
		"65":    "controller_concurrency = 65: must be from 1 to 64",
		"-2":    "controller_concurrency = -2: must be from 1 to 64",
		"1.5":   "value must be a whole number",
		`"two"`: "a number is required",
	} {
		_, err = ParseHCL("plugin.hcl", []byte(withConcurrency(v)))
		must.ErrorContains(t, err, want, must.Sprintf("controller_concurrency = %s", v))
		must.ErrorContains(t, err, "plugin.hcl:", must.Sprint("the error names where"))
	}
}
