// Package lifecycle decides when the tasks of an allocation start and
// when its sidecars stop, in the shape of Nomad's lifecycle block. It is a
// pure function of the tasks and their states; the client's alloc runner
// applies its answer on every task state change.
//
// The order:
//
//  1. prestart tasks start first. Main tasks wait until every prestart
//     task that is not a sidecar has finished successfully and every
//     prestart sidecar has started.
//  2. poststart tasks start once every main task has started.
//  3. Once every main task is dead, the sidecars (prestart and poststart)
//     are stopped.
//  4. poststop tasks start once every other task is dead, however the
//     others ended: done, failed or stopped.
//
// A task that is not started and is told to stop never runs.
package lifecycle

// Hooks a task may name; a task without one is a main task.
const (
	Prestart  = "prestart"
	Poststart = "poststart"
	Poststop  = "poststop"
)

// Task is what the decision needs of a task.
type Task struct {
	Name    string
	Hook    string
	Sidecar bool
}

// Main reports whether t is a main task.
func (t Task) Main() bool { return t.Hook == "" }

// RunsToCompletion reports whether t is meant to exit: a non-sidecar
// prestart or poststart task, or a poststop task. A successful exit of
// one ends it rather than restarting it.
func (t Task) RunsToCompletion() bool {
	return t.Hook == Poststop || (t.Hook != "" && !t.Sidecar)
}

// State is where a task is.
type State int

const (
	// NotStarted: never started.
	NotStarted State = iota
	// Started: started at least once, not dead (running, or waiting to
	// restart).
	Started
	// Succeeded and Failed: dead, for good.
	Succeeded
	Failed
)

func (s State) dead() bool { return s == Succeeded || s == Failed }

// Decision is what to do now. Start names the tasks whose turn has come
// (tasks already started are listed again: applying it is idempotent);
// Stop names the sidecars to stop because the main tasks are done.
type Decision struct {
	Start []string
	Stop  []string
}

// Decide returns the decision for tasks in states; a task missing from
// states has not started.
func Decide(tasks []Task, states map[string]State) Decision {
	var (
		d                    Decision
		prestartReady        = true
		mainAllStarted       = true
		mainAllDead          = true
		othersDead           = true
		prestartTasks, mains []Task
	)
	for _, t := range tasks {
		st := states[t.Name]
		switch t.Hook {
		case Prestart:
			prestartTasks = append(prestartTasks, t)
			if t.Sidecar && st == NotStarted || !t.Sidecar && st != Succeeded {
				prestartReady = false
			}
		case "":
			mains = append(mains, t)
			if st == NotStarted {
				mainAllStarted = false
			}
			if !st.dead() {
				mainAllDead = false
			}
		}
		if t.Hook != Poststop && !st.dead() {
			othersDead = false
		}
	}
	for _, t := range prestartTasks {
		d.Start = append(d.Start, t.Name)
	}
	if prestartReady {
		for _, t := range mains {
			d.Start = append(d.Start, t.Name)
		}
	}
	for _, t := range tasks {
		st := states[t.Name]
		switch {
		case t.Hook == Poststart && prestartReady && mainAllStarted:
			d.Start = append(d.Start, t.Name)
		case t.Hook == Poststop && othersDead:
			d.Start = append(d.Start, t.Name)
		}
		if t.Sidecar && t.Hook != Poststop && mainAllDead && len(mains) > 0 && !st.dead() {
			d.Stop = append(d.Stop, t.Name)
		}
	}
	return d
}

// AwaitsTurn reports whether a task that has not started is waiting for
// its turn rather than holding the allocation back: a poststop task while
// any other task is alive. Such a task does not make the allocation
// pending.
func AwaitsTurn(tasks []Task, states map[string]State, name string) bool {
	for _, t := range tasks {
		if t.Name == name && t.Hook != Poststop {
			return false
		}
	}
	for _, t := range tasks {
		if t.Hook != Poststop && !states[t.Name].dead() {
			return true
		}
	}
	return false
}
