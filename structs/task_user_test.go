package structs

import (
	"testing"

	"github.com/shoenig/test/must"
)

// A task's user is a plain user name, or the job is refused naming it.
func TestTask_UserIsAPlainUserName(t *testing.T) {
	for _, name := range []string{"", "nobody", "_svc", "app-1", "a234567890123456789012345678901b"} {
		j := validJob(JobTypeService)
		j.TaskGroups[0].Tasks[0].User = name
		j.Canonicalize()
		must.NoError(t, j.Validate(), must.Sprintf("user %q", name))
	}
	for _, name := range []string{"Root", "0", "-x", "../etc", "a b", "a:b", "a234567890123456789012345678901bc", "üser"} {
		j := validJob(JobTypeService)
		j.TaskGroups[0].Tasks[0].User = name
		j.Canonicalize()
		err := j.Validate()
		must.ErrorIs(t, err, ErrInvalidRequest, must.Sprintf("user %q", name))
		must.ErrorContains(t, err, "is not a user name")
	}
}
