// Package exec is the exec task driver: it runs a task isolated from the
// host and from other tasks, in the shape of Nomad's exec driver.
//
// Supervision is rawexec's: the same detached executor starts the task,
// records its PIDs and exit status under the task directory, and is
// re-attached after a client restart. What differs is how the executor
// starts the task, through this package's Launcher (registered as
// "exec"):
//
//  1. In the executor, the launcher creates the task's cgroup (v1 or v2,
//     detected at run time) with its memory, CPU and pids limits, and
//     starts `<binary> exec-init` in new pid, mount, ipc and uts
//     namespaces with host networking.
//  2. The executor moves that process into the cgroup before it may run
//     anything: exec-init blocks on a pipe until the launcher, having
//     placed it, writes the init config there and closes it.
//  3. exec-init, pid 1 of the new pid namespace and still root, builds the
//     task's root in its private mount namespace: the task directory
//     becomes "/", the client's chroot_env directories are bound
//     read-only (nosuid, nodev) beneath it, the shared alloc/ directory
//     and each volume_mount are bound read-write, secrets/ is a tmpfs of
//     mode 0700 owned by the task user, /dev holds only the harmless
//     devices, and a fresh /proc shows only the task's own processes.
//     Every mount target is opened beneath the root without following a
//     symlink, so nothing the task left in its directory can aim a mount
//     at the host. The task directory itself is bound onto itself
//     nosuid and nodev, writable binds are remounted so, and /dev is made
//     read-only. It then pivots into the task directory and detaches the
//     host's root, so that nothing of the host is left in the mount
//     namespace to climb back to, drops to the task user (nobody by
//     default) with no supplementary groups, no capabilities beyond
//     Nomad's default set for exec and no_new_privs, and execs the task,
//     which becomes pid 1.
//  4. When the task's main process exits the kernel ends the rest of its
//     pid namespace; the launcher then kills whatever is left in the
//     cgroup, reads whether the kernel OOM-killed a process of it, and
//     removes the cgroup.
//
// A task that ignores its kill signal (pid 1 gets only the signals it
// handles) is SIGKILLed at the end of its kill timeout, as any other.
package exec
