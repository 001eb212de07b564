//go:build !roamfaults

package nomad

// controllerFenceDisabled is false in every production build: the fences
// cannot be turned off.
func controllerFenceDisabled() bool { return false }

// raftLogGuardDisabled is false in every production build: a failed raft
// log write always stops the server.
func raftLogGuardDisabled() bool { return false }
