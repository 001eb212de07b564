package jobspec

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// A driver config number past float64's range is refused by both
// parsers. It used to decode to +Inf and be accepted; the job could then
// not be encoded as JSON, so `roam job run` failed after parsing and a
// job registered through the API could never be read back (found while
// writing the fuzz targets' JSON round trip, which checks it too).
func TestParse_ConfigNumberOutOfRange(t *testing.T) {
	for _, n := range []string{"1e400", "-1e400", "[1, 1e999]"} {
		hcl := `job "a" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
        x       = ` + n + `
      }
    }
  }
}`
		_, err := ParseHCL("job.hcl", []byte(hcl))
		must.ErrorIs(t, err, structs.ErrInvalidRequest, must.Sprint(n))
		must.ErrorContains(t, err, "job.hcl:7,19: Invalid driver config value; x: number is out of range", must.Sprint(n))

		body := `{"Job": {"ID": "a", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec",
			"Config": {"command": "/bin/true", "x": ` + n + `}}]}]}}`
		_, err = ParseJSON([]byte(body))
		must.ErrorIs(t, err, structs.ErrInvalidRequest, must.Sprint(n))
		must.ErrorContains(t, err, `task "t" config.x`, must.Sprint(n))
		must.ErrorContains(t, err, "number is out of range", must.Sprint(n))
	}

	// Large but finite numbers, and tiny ones, pass the range check: the
	// job is refused only because raw_exec knows no such options.
	_, err := ParseJSON([]byte(`{"Job": {"ID": "a", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t",
		"Driver": "raw_exec", "Config": {"command": "/bin/true", "x": 1e300, "y": 1e-400}}]}]}}`))
	must.ErrorContains(t, err, `unknown option "x"`)
	must.StrNotContains(t, err.Error(), "out of range")
}
