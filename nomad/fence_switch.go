//go:build !roamfaults

package nomad

// controllerFenceDisabled is false in every production build: the fences
// cannot be turned off.
func controllerFenceDisabled() bool { return false }
