//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// readmeFiles are the README's fenced hcl blocks whose first line is a
// "# <name>.hcl" comment, by name.
func readmeFiles(t *testing.T) map[string]string {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	must.NoError(t, err)
	files := map[string]string{}
	block := regexp.MustCompile("(?s)```hcl\n# ([a-z]+\\.hcl)\n(.*?)```")
	for _, m := range block.FindAllStringSubmatch(string(readme), -1) {
		files[m[1]] = m[2]
	}
	return files
}

// The README's first walkthrough works as written, against the agent make
// dev starts: its volume and two exec jobs, taken from README.md, write a
// file to the volume and read it back.
func TestREADME_Walkthrough(t *testing.T) {
	t.Parallel()
	files := readmeFiles(t)
	dir := t.TempDir()
	for _, name := range []string{"volume.hcl", "write.hcl", "read.hcl"} {
		src, ok := files[name]
		must.True(t, ok, must.Sprintf("README.md has no %s block", name))
		must.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644))
	}
	must.StrContains(t, files["write.hcl"], `driver = "exec"`)
	must.StrContains(t, files["read.hcl"], `driver = "exec"`)

	p := FreePorts(t, 2)
	a := StartAgent(t, "dev", p[0], p[1],
		"agent", "-dev", "-http-port", strconv.Itoa(p[0]), "-rpc-port", strconv.Itoa(p[1]))
	cli := func(args ...string) string {
		t.Helper()
		out, errOut, code := RunCLIAt(t, a.HTTPAddr(), args...)
		must.Eq(t, 0, code, must.Sprintf("roam %s: %s%s", strings.Join(args, " "), out, errOut))
		return out
	}
	WaitFor(t, settle, func() error {
		out, _, _ := RunCLIAt(t, a.HTTPAddr(), "plugin", "status")
		if !regexp.MustCompile(`hostpath\s+\S+\s+1/1\s+1/1`).MatchString(out) {
			return fmt.Errorf("plugin not healthy yet:\n%s", out)
		}
		return nil
	})
	must.StrContains(t, cli("volume", "create", filepath.Join(dir, "volume.hcl")), "with ID notes")
	done := func(job string) *Alloc {
		var got *Alloc
		WaitFor(t, 60*time.Second, func() error {
			allocs, err := JobAllocs(a.HTTPAddr(), job)
			if err != nil {
				return err
			}
			if len(allocs) != 1 {
				return fmt.Errorf("%d allocations of %s", len(allocs), job)
			}
			got = allocs[0]
			switch got.ClientStatus {
			case "complete":
				return nil
			case "failed":
				return errFatal(errors.New(job + " failed: " + taskEvents(got)))
			}
			return fmt.Errorf("%s is %s: %s", job, got.ClientStatus, taskEvents(got))
		})
		return got
	}
	cli("job", "run", filepath.Join(dir, "write.hcl"))
	done("write")
	cli("job", "run", filepath.Join(dir, "read.hcl"))
	read := done("read")
	must.Eq(t, "hello from the first job\n", cli("alloc", "logs", read.ID))
}
