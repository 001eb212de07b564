package tasktemplate

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

func TestRender(t *testing.T) {
	dir := t.TempDir()
	must.NoError(t, os.WriteFile(filepath.Join(dir, "in.json"), []byte(`{"port": 8080, "names": ["b", "a"]}`), 0o644))
	must.NoError(t, os.Symlink("/etc/hostname", filepath.Join(dir, "escape")))
	root, err := os.OpenRoot(dir)
	must.NoError(t, err)
	defer root.Close()
	env := Env{"NOMAD_ALLOC_ID": "a1", "NOMAD_PORT_http": "20001"}
	for _, tc := range []struct{ name, text, want, err string }{
		{"env", `id={{ env "NOMAD_ALLOC_ID" }} port={{ env "NOMAD_PORT_http" }} missing=[{{ env "NOPE" }}]`, "id=a1 port=20001 missing=[]", ""},
		{"file and json", `{{ with parseJSON (file "in.json") }}{{ .port }} {{ join "," (sortStrings (split "," "b,a")) }}{{ end }}`, "8080 a,b", ""},
		{"helpers", `{{ toUpper "x" }}{{ add 2 3 }}{{ replaceAll "-" "_" "a-b" }}{{ base64Decode (base64Encode "ok") }}{{ range loop 3 }}{{ . }}{{ end }}`, "X5a_bok012", ""},
		{"file outside the task dir", `{{ file "../../etc/hostname" }}`, "", "path escapes"},
		{"file through a symlink out", `{{ file "escape" }}`, "", "path escapes"},
		{"missing file", `{{ file "nope" }}`, "", "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Render(tc.name, tc.text, "", "", env, root)
			if tc.err != "" {
				must.ErrorContains(t, err, tc.err)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.want, string(out))
		})
	}
	out, err := Render("delims", `[[ env "NOMAD_ALLOC_ID" ]] {{ literal }}`, "[[", "]]", env, root)
	must.NoError(t, err)
	must.Eq(t, "a1 {{ literal }}", string(out))
}

// What the servers refuse at registration: an unknown (Consul, Vault)
// function, bad syntax, a template over its bound.
func TestParse(t *testing.T) {
	_, err := Parse("t", `{{ key "service/web" }}`, "", "")
	must.ErrorContains(t, err, `function "key" not defined`)
	_, err = Parse("t", `{{ env "X" `, "", "")
	must.Error(t, err)
	_, err = Parse("t", strings.Repeat("x", MaxTemplateBytes+1), "", "")
	must.True(t, errors.Is(err, ErrTooLarge))
	_, err = Parse("t", `{{ env "X" }} {{ file "y" | toUpper }}`, "", "")
	must.NoError(t, err)
}

func TestRender_OutputBounded(t *testing.T) {
	_, err := Render("big", `{{ range loop 10000 }}{{ range loop 1000 }}xxxxxxxx{{ end }}{{ end }}`, "", "", nil, nil)
	must.True(t, errors.Is(err, ErrTooLarge), must.Sprintf("err %v", err))
}

func TestParseEnv(t *testing.T) {
	got, err := ParseEnv([]byte("# comment\nA=1\n\nexport B = two=2\n"))
	must.NoError(t, err)
	must.Eq(t, map[string]string{"A": "1", "B": " two=2"}, got)
	_, err = ParseEnv([]byte("A=1\nnot a pair\n"))
	must.ErrorContains(t, err, `line 2: "not a pair" is not KEY=VALUE`)
	_, err = ParseEnv([]byte("1A=x\n"))
	must.ErrorContains(t, err, "is not KEY=VALUE")
}
