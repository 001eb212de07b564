package client

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func TestRestartTracker(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	type step struct {
		at      time.Duration // since t0
		restart bool
		delay   time.Duration
	}
	cases := []struct {
		name   string
		policy *structs.RestartPolicy
		steps  []step
	}{
		{
			name:   "fail mode stops after attempts",
			policy: &structs.RestartPolicy{Attempts: 2, Interval: time.Minute, Delay: time.Second, Mode: structs.RestartPolicyModeFail},
			steps:  []step{{0, true, time.Second}, {time.Second, true, time.Second}, {2 * time.Second, false, 0}},
		},
		{
			name:   "interval passing resets the count",
			policy: &structs.RestartPolicy{Attempts: 1, Interval: time.Minute, Delay: time.Second, Mode: structs.RestartPolicyModeFail},
			steps:  []step{{0, true, time.Second}, {61 * time.Second, true, time.Second}, {62 * time.Second, false, 0}},
		},
		{
			name:   "delay mode waits out the interval",
			policy: &structs.RestartPolicy{Attempts: 1, Interval: time.Minute, Delay: time.Second, Mode: structs.RestartPolicyModeDelay},
			steps:  []step{{0, true, time.Second}, {10 * time.Second, true, 50 * time.Second}, {61 * time.Second, true, time.Second}},
		},
		{
			name:   "zero attempts never restarts",
			policy: &structs.RestartPolicy{Attempts: 0, Interval: time.Minute, Delay: time.Second, Mode: structs.RestartPolicyModeFail},
			steps:  []step{{0, false, 0}},
		},
		{
			name:   "no policy never restarts",
			policy: nil,
			steps:  []step{{0, false, 0}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var rt restartTracker
			for i, s := range tc.steps {
				d := rt.next(tc.policy, t0.Add(s.at))
				must.Eq(t, s.restart, d.Restart, must.Sprintf("step %d: %s", i, d.Reason))
				if s.restart {
					must.Eq(t, s.delay, d.Delay, must.Sprintf("step %d", i))
				}
				must.NotEq(t, "", d.Reason)
			}
		})
	}
}

func TestClientStatus(t *testing.T) {
	st := func(state string, failed bool) *structs.TaskState {
		return &structs.TaskState{State: state, Failed: failed}
	}
	cases := []struct {
		name   string
		states map[string]*structs.TaskState
		want   string
	}{
		{"all pending", map[string]*structs.TaskState{"a": st("pending", false), "b": st("pending", false)}, structs.AllocClientStatusPending},
		{"one still pending", map[string]*structs.TaskState{"a": st("running", false), "b": st("pending", false)}, structs.AllocClientStatusPending},
		{"all running", map[string]*structs.TaskState{"a": st("running", false), "b": st("running", false)}, structs.AllocClientStatusRunning},
		{"one done one running", map[string]*structs.TaskState{"a": st("dead", false), "b": st("running", false)}, structs.AllocClientStatusRunning},
		{"all done", map[string]*structs.TaskState{"a": st("dead", false), "b": st("dead", false)}, structs.AllocClientStatusComplete},
		{"one failed", map[string]*structs.TaskState{"a": st("dead", true), "b": st("running", false)}, structs.AllocClientStatusFailed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := clientStatus(tc.states, nil)
			must.Eq(t, tc.want, got)
		})
	}
}

func TestParseRawExecConfig(t *testing.T) {
	cmd, args, err := parseCommandConfig(structs.ParseRawExecConfig, map[string]any{"command": "/bin/sh", "args": []any{"-c", "true"}})
	must.NoError(t, err)
	must.Eq(t, "/bin/sh", cmd)
	must.Eq(t, []string{"-c", "true"}, args)

	for name, cfg := range map[string]map[string]any{
		"no command":      {"args": []any{"x"}},
		"command not str": {"command": 3},
		"arg not string":  {"command": "/bin/true", "args": []any{"a", 1}},
		"args not list":   {"command": "/bin/true", "args": "a b"},
		"unknown option":  {"command": "/bin/true", "image": "busybox"},
	} {
		_, _, err := parseCommandConfig(structs.ParseRawExecConfig, cfg)
		must.ErrorIs(t, err, errBadTaskConfig, must.Sprint(name))
	}
}
