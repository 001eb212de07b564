// Package rawexec is the raw_exec task driver: it runs a task as a plain
// host process, without isolation.
//
// The driver never makes the task its own child. It starts a small
// supervisor, the executor (the roam binary run as `roam executor <spec>`),
// which detaches into its own session, starts the task in its own process
// group, waits for it and records how it ended. Everything the driver needs
// to find the task again lives in files under the task directory, so a
// client that is killed and restarted on the same data dir re-attaches to
// running tasks instead of starting them twice, and still learns their exit
// status.
//
// Files, all under TaskConfig.Dir:
//
//	.rawexec/spec.json      what to run; written by the driver
//	.rawexec/state.json     executor and task PIDs and the task's start time;
//	                        written by the executor once the task has started
//	.rawexec/exit.json      the ExitResult; written by the executor after the
//	                        task has exited and its process group is gone
//	.rawexec/executor.log   the executor's own log
//	stdout.log, stderr.log  the task's output, unless TaskConfig names other
//	                        files
//
// Every JSON file is written atomically (temporary file, fsync, rename), so
// a reader sees either no file or a whole one.
//
// Exit status convention: a task that exits by itself reports its exit code
// and Signal 0. A task ended by a signal reports Signal set to the signal
// number and ExitCode 128+signal, as a shell would, so that a check of
// ExitCode alone never mistakes a killed task for a successful one. A task
// the executor could not start reports Err and ExitCode -1.
//
// Killing is done by the driver, not the executor: it signals the task's
// process group, waits up to the kill timeout, then sends SIGKILL to the
// group. The executor ignores SIGINT, SIGTERM and SIGHUP so that a signal
// sent to the agent's process group does not take tasks down with it. When
// the task's main process exits, the executor kills whatever is left in its
// process group before writing the exit status.
package rawexec
