package lifecycle

import (
	"testing"

	"github.com/shoenig/test/must"
)

// A group with one task of each kind: states × what may start and what
// must stop.
func TestDecide(t *testing.T) {
	tasks := []Task{
		{Name: "init", Hook: Prestart},
		{Name: "proxy", Hook: Prestart, Sidecar: true},
		{Name: "main"},
		{Name: "main2"},
		{Name: "announce", Hook: Poststart},
		{Name: "logship", Hook: Poststart, Sidecar: true},
		{Name: "cleanup", Hook: Poststop},
	}
	prestart := []string{"init", "proxy"}
	mains := append(append([]string{}, prestart...), "main", "main2")
	cases := []struct {
		name   string
		states map[string]State
		start  []string
		stop   []string
	}{
		{name: "nothing started", states: nil, start: prestart},
		{name: "init running", states: map[string]State{"init": Started, "proxy": Started}, start: prestart},
		{name: "init done, sidecar not yet up", states: map[string]State{"init": Succeeded}, start: prestart},
		{name: "init failed", states: map[string]State{"init": Failed, "proxy": Started}, start: prestart},
		{name: "prestart done", states: map[string]State{"init": Succeeded, "proxy": Started}, start: mains},
		{name: "one main started", states: map[string]State{"init": Succeeded, "proxy": Started, "main": Started}, start: mains},
		{name: "mains started", states: map[string]State{"init": Succeeded, "proxy": Started, "main": Started, "main2": Started},
			start: append(append([]string{}, mains...), "announce", "logship")},
		{name: "one main dead", states: map[string]State{"init": Succeeded, "proxy": Started, "main": Succeeded, "main2": Started, "announce": Succeeded, "logship": Started},
			start: append(append([]string{}, mains...), "announce", "logship")},
		{name: "mains dead: sidecars stop", states: map[string]State{"init": Succeeded, "proxy": Started, "main": Succeeded, "main2": Failed, "announce": Succeeded, "logship": Started},
			start: append(append([]string{}, mains...), "announce", "logship"), stop: []string{"proxy", "logship"}},
		{name: "all but poststop dead", states: map[string]State{"init": Succeeded, "proxy": Succeeded, "main": Succeeded, "main2": Failed, "announce": Succeeded, "logship": Succeeded},
			start: append(append([]string{}, mains...), "announce", "logship", "cleanup")},
		{name: "poststart still running holds poststop back", states: map[string]State{"init": Succeeded, "proxy": Succeeded, "main": Succeeded, "main2": Succeeded, "announce": Started, "logship": Succeeded},
			start: append(append([]string{}, mains...), "announce", "logship")},
		{name: "everything dead, none ever started", states: map[string]State{"init": Failed, "proxy": Succeeded, "main": Succeeded, "main2": Succeeded, "announce": Succeeded, "logship": Succeeded},
			start: append(append([]string{}, prestart...), "cleanup")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tasks, tc.states)
			must.Eq(t, tc.start, d.Start)
			must.Eq(t, tc.stop, d.Stop)
		})
	}
}

// Without hooks every task starts at once and nothing is stopped.
func TestDecide_NoHooks(t *testing.T) {
	tasks := []Task{{Name: "a"}, {Name: "b"}}
	must.Eq(t, Decision{Start: []string{"a", "b"}}, Decide(tasks, nil))
	must.Eq(t, Decision{Start: []string{"a", "b"}}, Decide(tasks, map[string]State{"a": Succeeded, "b": Failed}))
}

func TestAwaitsTurn(t *testing.T) {
	tasks := []Task{{Name: "main"}, {Name: "cleanup", Hook: Poststop}}
	must.True(t, AwaitsTurn(tasks, map[string]State{"main": Started}, "cleanup"))
	must.False(t, AwaitsTurn(tasks, map[string]State{"main": Succeeded}, "cleanup"))
	must.False(t, AwaitsTurn(tasks, map[string]State{}, "main"))
}

func TestRunsToCompletion(t *testing.T) {
	for _, tc := range []struct {
		task Task
		want bool
	}{
		{Task{}, false},
		{Task{Hook: Prestart}, true},
		{Task{Hook: Prestart, Sidecar: true}, false},
		{Task{Hook: Poststart}, true},
		{Task{Hook: Poststart, Sidecar: true}, false},
		{Task{Hook: Poststop}, true},
	} {
		must.Eq(t, tc.want, tc.task.RunsToCompletion(), must.Sprintf("%+v", tc.task))
	}
}
