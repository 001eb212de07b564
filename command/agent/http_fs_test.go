package agent

import (
	"io"
	"net/http"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// Nomad's Go client lists, describes and reads an allocation's files; a
// task's secrets are refused with 403.
func TestNomadAPI_AllocFS(t *testing.T) {
	t.Parallel()
	a := newDevAgent(t)
	c := newNomadClient(t, a)
	job := nomadBatchJob("fs")
	job.TaskGroups[0].Tasks[0].Config["args"] = []string{"-c", "echo hello > local/greeting; echo s3cret > secrets/token"}
	_, _, err := c.Jobs().Register(job, nil)
	must.NoError(t, err)
	var alloc *nomadapi.Allocation
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool {
			stubs, _, err := c.Jobs().Allocations("fs", false, nil)
			must.NoError(t, err)
			if len(stubs) != 1 || stubs[0].ClientStatus != nomadapi.AllocClientStatusComplete {
				return false
			}
			alloc, _, err = c.Allocations().Info(stubs[0].ID, nil)
			must.NoError(t, err)
			return true
		}),
		wait.Timeout(30*time.Second), wait.Gap(50*time.Millisecond),
	))

	files, _, err := c.AllocFS().List(alloc, "t/local", nil)
	must.NoError(t, err)
	must.SliceLen(t, 1, files)
	must.EqOp(t, "greeting", files[0].Name)
	must.EqOp(t, int64(6), files[0].Size)
	st, _, err := c.AllocFS().Stat(alloc, "t/local/greeting", nil)
	must.NoError(t, err)
	must.False(t, st.IsDir)
	rc, err := c.AllocFS().Cat(alloc, "t/local/greeting", nil)
	must.NoError(t, err)
	b, err := io.ReadAll(rc)
	rc.Close()
	must.NoError(t, err)
	must.EqOp(t, "hello\n", string(b))

	res, err := http.Get("http://" + a.HTTPAddr() + "/v1/client/fs/cat/" + alloc.ID + "?path=t/secrets/token")
	must.NoError(t, err)
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	must.EqOp(t, http.StatusForbidden, res.StatusCode, must.Sprintf("%s", body))
	must.StrNotContains(t, string(body), "s3cret")
}
