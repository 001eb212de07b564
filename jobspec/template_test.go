package jobspec

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func TestParseHCL_Template(t *testing.T) {
	job, err := ParseHCL("job.hcl", []byte(oneTask("", `template {
        data          = "port={{ env \"NOMAD_PORT_http\" }}"
        destination   = "local/app.conf"
        change_mode   = "signal"
        change_signal = "SIGHUP"
        perms         = "0600"
        splay         = "3s"
      }
      template {
        data        = "A=1"
        destination = "${NOMAD_SECRETS_DIR}/env"
        env         = true
      }`)))
	must.NoError(t, err)
	must.Eq(t, []*structs.Template{
		{EmbeddedTmpl: `port={{ env "NOMAD_PORT_http" }}`, DestPath: "local/app.conf", ChangeMode: "signal",
			ChangeSignal: "SIGHUP", Perms: "0600", Splay: 3 * time.Second},
		{EmbeddedTmpl: "A=1", DestPath: "${NOMAD_SECRETS_DIR}/env", Envvars: true},
	}, job.TaskGroups[0].Tasks[0].Templates)
}

// A template that does not parse, uses a Consul function, writes outside
// the task dir or twice to one place, or asks for a mode Roam lacks is
// refused at registration with the task and template named.
func TestParseHCL_TemplateErrors(t *testing.T) {
	for _, tc := range []struct{ name, tmpl, want string }{
		{"syntax", `data = "{{ env "`, `template 0: data: template: template:1: unclosed action`},
		{"consul", `data = "{{ key \"x\" }}"` + "\n destination = \"local/x\"", `function "key" not defined`},
		{"outside", `data = "x"` + "\n destination = \"../../etc/passwd\"", `destination "../../etc/passwd" leaves the task directory`},
		{"absolute", `data = "x"` + "\n destination = \"/etc/passwd\"", `must be relative to the task directory`},
		{"no destination", `data = "x"`, `destination: destination is required`},
		{"both", `data = "x"` + "\n source = \"local/t\"\n destination = \"local/x\"", `data and source are exclusive`},
		{"neither", `destination = "local/x"`, `one of data or source is required`},
		{"bad mode", `data = "x"` + "\n destination = \"local/x\"\n change_mode = \"script\"", `change_mode "script" is not one of restart, signal, noop`},
		{"signal without one", `data = "x"` + "\n destination = \"local/x\"\n change_mode = \"signal\"", `change_mode signal needs a change_signal`},
		{"perms", `data = "x"` + "\n destination = \"local/x\"\n perms = \"999\"", `perms "999" is not an octal mode`},
		{"into the executor's files", `data = "x"` + "\n destination = \".rawexec/spec.json\"", `is reserved in the task directory`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job, err := ParseHCL("job.hcl", []byte(oneTask("", "template {\n"+tc.tmpl+"\n}")))
			must.Nil(t, job)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.ErrorContains(t, err, tc.want)
		})
	}
	_, err := ParseHCL("job.hcl", []byte(oneTask("", "template {\n data = \"a\"\n destination = \"local/x\"\n}\ntemplate {\n data = \"b\"\n destination = \"local/x\"\n}")))
	must.ErrorContains(t, err, `destination "local/x" is another template's too`)
}

func TestParseJSON_NomadClientTemplate(t *testing.T) {
	job, err := ParseJSON(marshalRegister(t, nomadJob(structs.JobTypeService, 1, func(j *api.Job) {
		j.TaskGroups[0].Tasks[0].Templates = []*api.Template{{
			EmbeddedTmpl: ptr(`id={{ env "NOMAD_ALLOC_ID" }}`), DestPath: ptr("local/id.conf"),
		}}
	})))
	must.NoError(t, err)
	tmpl := job.TaskGroups[0].Tasks[0].Templates
	must.SliceLen(t, 1, tmpl)
	must.Eq(t, `id={{ env "NOMAD_ALLOC_ID" }}`, tmpl[0].EmbeddedTmpl)
	must.Eq(t, "local/id.conf", tmpl[0].DestPath)
	must.Eq(t, "restart", tmpl[0].ChangeMode)
}

// A template may not land where a mount covers it, nor two tasks write
// one shared file.
func TestParseHCL_TemplateCoveredOrShared(t *testing.T) {
	_, err := ParseHCL("job.hcl", []byte(oneTask("", "template {\n data = \"x\"\n destination = \"alloc/x\"\n}")))
	must.ErrorContains(t, err, `write into the shared directory as ${NOMAD_ALLOC_DIR}/x`)

	_, err = ParseHCL("job.hcl", []byte(oneTask(`volume "v" {
      type            = "csi"
      source          = "v"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }`, `volume_mount {
        volume      = "v"
        destination = "srv/data"
      }
      template {
        data        = "x"
        destination = "srv/data/app.conf"
      }`)))
	must.ErrorContains(t, err, `destination "srv/data/app.conf" lies in volume_mount "srv/data"`)

	_, err = ParseHCL("job.hcl", []byte(`job "a" {
  group "g" {
    task "a" {
      driver = "raw_exec"
      config { command = "/bin/true" }
      template {
        data        = "a"
        destination = "${NOMAD_ALLOC_DIR}/shared.conf"
      }
    }
    task "b" {
      driver = "raw_exec"
      config { command = "/bin/true" }
      template {
        data        = "b"
        destination = "${NOMAD_ALLOC_DIR}/shared.conf"
      }
    }
  }
}`))
	must.ErrorContains(t, err, `task "b": template destination "${NOMAD_ALLOC_DIR}/shared.conf" is task "a"'s too`)
}

func TestParseHCL_Artifact(t *testing.T) {
	job, err := ParseHCL("job.hcl", []byte(oneTask("", `artifact {
        source      = "https://example.com/app.tgz"
        destination = "local/app"
        options {
          checksum = "sha256:`+strings.Repeat("ab", 32)+`"
        }
      }`)))
	must.NoError(t, err)
	must.Eq(t, []*structs.TaskArtifact{{GetterSource: "https://example.com/app.tgz", RelativeDest: "local/app",
		GetterOptions: map[string]string{"checksum": "sha256:" + strings.Repeat("ab", 32)}}}, job.TaskGroups[0].Tasks[0].Artifacts)

	for _, tc := range []struct{ art, want string }{
		{`source = "s3::https://bucket/x"`, `getter "s3" is not supported`},
		{`source = "https://x/y?checksum=md5:00"`, `give "checksum" as an option`},
		{`source = "ftp://host/x"`, `scheme "ftp" is not supported`},
		{"source = \"https://x/y\"\n destination = \"../../etc\"", `destination "../../etc" leaves the task directory`},
		{"source = \"https://x/y\"\n destination = \"/etc\"", `must be relative to the task directory`},
		{"source = \"https://x/y\"\n options {\n checksum = \"sha256:abc\"\n }", `the sha256 digest is 64 hex characters`},
		{"source = \"https://x/y\"\n options {\n headers = \"x\"\n }", `option "headers" is not supported`},
		{`destination = "local/x"`, `source: is required`},
		{`source = "file:///etc/shadow"`, `a file source must be relative to the task directory`},
		{`source = "git::https://x/y.git"`, `getter "git" is not supported`},
		{`source = "https://x/y.git?ref=--pathspec-from-file=/etc/shadow"`, `give "ref" as an option, not in the source`},
		{"source = \"https://x/y\"\n options {\n ref = \"main\"\n }", `option "ref" is not supported`},
	} {
		_, err := ParseHCL("job.hcl", []byte(oneTask("", "artifact {\n"+tc.art+"\n}")))
		must.ErrorContains(t, err, tc.want, must.Sprint(tc.art))
	}
}
