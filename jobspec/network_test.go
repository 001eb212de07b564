package jobspec

import (
	"testing"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// A network block: a port with static is reserved, one without dynamic.
func TestParseHCL_Network(t *testing.T) {
	job, err := ParseHCL("job.hcl", []byte(oneTask(`network {
      mode = "host"
      port "http" {}
      port "db" {
        static = 5432
        to     = 5432
      }
    }`, "")))
	must.NoError(t, err)
	must.Eq(t, []*structs.NetworkResource{{
		Mode:          "host",
		ReservedPorts: []structs.Port{{Label: "db", Value: 5432, To: 5432}},
		DynamicPorts:  []structs.Port{{Label: "http"}},
	}}, job.TaskGroups[0].Networks)
}

// Bad networks are refused with the field named, and nothing is built.
func TestParseHCL_NetworkErrors(t *testing.T) {
	for _, tc := range []struct{ name, network, want string }{
		{"label twice", `network {
      port "http" {}
      port "http" { static = 80 }
    }`, `network: port label "http" is used twice`},
		{"static out of range", `network {
      port "db" { static = 70000 }
    }`, `network: port "db": static 70000 is outside 1-65535`},
		{"static zero", `network {
      port "db" { static = 0 }
    }`, `network: port "db": static 0 is outside 1-65535`},
		{"to without a port mapping", `network {
      port "http" { to = 8080 }
    }`, `network: port "http": to 8080 needs a port mapping`},
		{"bridge", `network {
      mode = "bridge"
      port "http" {}
    }`, `network: mode "bridge" is not supported yet`},
		{"label with a dash", `network {
      port "my-port" {}
    }`, `network: port label "my-port" must be 1 to 64 letters, digits or underscores`},
		{"two blocks", `network {
      port "a" {}
    }
    network {
      port "b" {}
    }`, `network: only one network block is allowed, got 2`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job, err := ParseHCL("job.hcl", []byte(oneTask(tc.network, "")))
			must.Nil(t, job)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.ErrorContains(t, err, `group "g": `+tc.want)
		})
	}
}

// Nomad's Go client's network block, as it sends it, reads the same.
func TestParseJSON_NomadClientNetwork(t *testing.T) {
	job, err := ParseJSON(marshalRegister(t, nomadJob(structs.JobTypeService, 2, func(j *api.Job) {
		j.TaskGroups[0].Networks = []*api.NetworkResource{{
			Mode:          "host",
			ReservedPorts: []api.Port{{Label: "db", Value: 5432}},
			DynamicPorts:  []api.Port{{Label: "http", To: -1}},
		}}
	})))
	must.NoError(t, err)
	must.Eq(t, []*structs.NetworkResource{{
		Mode:          "host",
		ReservedPorts: []structs.Port{{Label: "db", Value: 5432}},
		DynamicPorts:  []structs.Port{{Label: "http", To: -1}},
	}}, job.TaskGroups[0].Networks)
}

// ${...} references in env and driver config are kept for the client to
// interpolate; a reference by index is refused with its place.
func TestParseHCL_RuntimeReferences(t *testing.T) {
	job, err := ParseHCL("job.hcl", []byte(`job "a" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/server"
        args    = ["-listen", "${attr.unique.network.ip-address}:${NOMAD_PORT_http}", "${node.unique.name}", "$${literal}"]
      }
      env {
        NODE = "${node.unique.id}-${meta.rack}"
      }
    }
  }
}`))
	must.NoError(t, err)
	task := job.TaskGroups[0].Tasks[0]
	must.Eq(t, []any{"-listen", "${attr.unique.network.ip-address}:${NOMAD_PORT_http}", "${node.unique.name}", "${literal}"}, task.Config["args"].([]any))
	must.Eq(t, "${node.unique.id}-${meta.rack}", task.Env["NODE"])

	_, err = ParseHCL("job.hcl", []byte(oneTask("", `env {
        X = "${env["HOME"]}"
      }`)))
	must.ErrorContains(t, err, "Unsupported reference")
	_, err = ParseHCL("job.hcl", []byte(oneTask("", `env {
        X = "${node.unique} ${node.unique.id}"
      }`)))
	must.ErrorContains(t, err, "${node.unique} is used both as a value and as an object")
}
