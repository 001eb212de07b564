// Package hostpath is Roam's built-in CSI plugin. It simulates a storage
// provider whose volumes are network disks: a controller "attaches" a volume
// to a node by taking a device name from that node's pool, and every node on
// the machine sees the same bytes because volume data lives in one shared
// state directory.
//
// The plugin exists to test Roam's CSI safety promises, so it also records
// what a real provider would suffer from silently: destructive controller
// calls that overlap in time within one plugin process.
//
// # Processes and the state directory
//
// Several plugin processes may share one state directory, typically one
// process per Roam client on a single test machine, each with its own node
// ID. Everything they share lives in StateDir:
//
//	state.json              all plugin state (see below), replaced atomically
//	state.lock              flock(2) target serialising every read-modify-write
//	volumes/<volume-id>/    a volume's data
//	snapshots/<snap-id>/    a snapshot's copy of its source volume's data
//	overlaps-<node-id>      overlap count of the process with that node ID
//	calls-<node-id>.json    destructive controller calls that reached it
//	calllog-<node-id>.jsonl timed record of its volume calls, one a line
//
// state.json is a JSON object (version 1):
//
//	{
//	  "version": 1,
//	  "volumes":   {"<id>": {"id", "name", "capacity_bytes", "parameters",
//	                          "source_snapshot_id", "source_volume_id",
//	                          "created_at"}},
//	  "snapshots": {"<id>": {"id", "name", "source_volume_id", "size_bytes",
//	                          "created_at"}},
//	  "nodes": {"<node-id>": {
//	      "id", "max_volumes_per_node", "registered_at",
//	      "attachments": {"<volume-id>": {"device": "/dev/roam00",
//	                                      "readonly", "access_mode", "attached_at"}},
//	      "staged":      {"<volume-id>": "<staging path>"},
//	      "published":   {"<volume-id>": {"<target path>": {"readonly", "access_mode"}}}}}
//	}
//
// Writers take an exclusive flock on state.lock, read state.json, change it,
// write a temporary file, fsync it, rename it over state.json and fsync the
// directory. Readers take a shared flock. A node registers itself (with its
// volume limit) in "nodes" when a node or monolith plugin starts; a
// controller publish to a node that never registered fails with NOT_FOUND.
//
// # Attachments
//
// ControllerPublishVolume waits for Config.PublishLatency (the provider's
// attach call), then, under the state lock, takes the lowest free device name
// /dev/roamNN from the node's pool of MaxVolumesPerNode names. Past the limit
// it fails with RESOURCE_EXHAUSTED; a volume attached to another node in a
// single-node access mode fails with FAILED_PRECONDITION. Publishing the same
// volume to the same node again returns the same device. ControllerUnpublish
// waits for the same latency, then frees the device; unpublishing something
// that is not attached succeeds. Cancelling the caller's context during the
// wait ends the call with CANCELLED or DEADLINE_EXCEEDED and changes nothing.
//
// DeleteVolume refuses with FAILED_PRECONDITION while the volume is attached
// anywhere, as a cloud provider refuses to delete an attached disk; deleting
// an unknown volume succeeds. Detaching a volume that its node still has
// staged or published succeeds but logs a warning: a real disk would vanish
// from under its mounts.
//
// # Node publish is a symlink
//
// NodeStageVolume requires the volume to be attached to this node (and, if
// the publish context names a device, under that device) and only records
// the staging path; it writes nothing there. NodePublishVolume requires the
// volume to be attached and staged at the given staging path. It does not
// mount anything (tests and containers may lack mount privileges): it makes
// target_path a symlink to StateDir/volumes/<volume-id>, creating parent
// directories and replacing an empty directory already at target_path; a
// non-empty directory or a file there is FAILED_PRECONDITION.
// NodeUnpublishVolume removes the symlink. NodeUnstageVolume refuses while the
// volume is still published on the node, as unmounting a busy device would.
// Node unpublish and unstage of an unknown volume are NOT_FOUND, per the spec.
// Staging and target paths must be absolute and outside StateDir, and, with
// Config.TargetRoot set, beneath it (INVALID_ARGUMENT otherwise); publish
// and unpublish act on them through an os.Root, as every file operation on
// StateDir does, so no volume or snapshot ID and no symbolic link leads out
// (see paths.go).
// The readonly flag is recorded, and must match on a repeated publish, but is
// not enforced on the data.
//
// # Sizes, expansion, restore and clone
//
// A volume's capacity_bytes is its device's size; the pool is 1 TiB and no
// space is reserved on disk. A directory has no size, so the plugin writes
// the size of the volume's simulated file system to .roam-fs-size at the
// root of its data (FSSizeFile): NodeStageVolume and NodeExpandVolume set
// it to the device's size, and nothing else changes it.
// ControllerExpandVolume grows the device only and answers
// node_expansion_required, so a task sees a new size only once its node
// has grown the file system, as with a real disk. NodeExpandVolume needs
// the volume published (or staged) at volume_path on this node.
//
// CreateVolume restores a snapshot (a copy of the snapshot's data) or
// clones a volume (CLONE_VOLUME: a copy of the source volume's data, taken
// under the state lock) into the new volume, which is at least as large
// as its source.
//
// # Overlap and call records
//
// Every destructive controller call (CreateVolume, DeleteVolume,
// ControllerPublishVolume, ControllerUnpublishVolume, ControllerExpandVolume,
// CreateSnapshot, DeleteSnapshot) is counted in flight for its whole
// duration, latency included. One that starts while another is in flight in
// the same process bumps the overlap count, logs "overlapping destructive
// controller call" at WARN, and rewrites overlaps-<node-id>, which holds the
// count as a decimal number and a newline. calls-<node-id>.json maps each
// destructive method name to the number of calls that reached the plugin
// (counted when they start, valid or not). Both files are written atomically
// and only by processes that serve the controller service; they are created
// with the current counts when such a process starts. A process that restarts
// with the same node ID and state directory continues from the counts in the
// files, so evidence of an overlap is never lost.
//
// Every instance on one state dir is also one simulated provider: under an
// exclusive flock on provider.lock each destructive call is added to
// provider-inflight.json when it starts and removed when it ends, and a
// call that starts while the file lists another (of this process or of any
// other live one) bumps provider-overlaps, written durably. Calls of
// processes that no longer exist are dropped from the record, so a plugin
// killed mid-call does not count against the next. A frozen (SIGSTOP)
// process still has its calls in flight.
//
// # Faults
//
// Tests switch faults on and off at run time with files in StateDir, which
// each call looks for when it starts (SetFault writes and removes them):
//
//	fault-hang-node-unpublish            every instance on the state dir
//	fault-hang-node-unpublish-<node-id>  that instance only (checked first)
//	fault-hang-controller-publish[-<node-id>]  the same for
//	                         ControllerPublishVolume: it hangs after its
//	                         latency, counted in flight at the provider, as a
//	                         provider call stuck on the far side
//	fault-hang-controller-unpublish[-<node-id>]  the same for
//	                         ControllerUnpublishVolume
//
// While the file is there, NodeUnpublishVolume validates its request and
// then hangs, before it touches the state, so other calls, for the same
// volume or others, go on. It logs "fault injected: call hangs" at WARN
// when it starts hanging, and again when the hang ends. The file's contents
// say how the hang ends besides the two ways every hang ends:
//
//	empty or "until-cancel"  when the caller's context ends: the call fails
//	                         with DEADLINE_EXCEEDED or CANCELLED
//	"forever"                not when the caller gives up, as a plugin stuck
//	                         in the kernel: it keeps running until one of the
//	                         two ways below, long after the caller has gone
//
// Removing the file ends every hang within 50 ms, and the hung call then
// unpublishes as usual (it was slow, not lost). Stopping the plugin ends a
// hang with UNAVAILABLE. A call that fails changes nothing.
package hostpath
