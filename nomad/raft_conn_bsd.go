//go:build unix && !linux && !aix

package nomad

// peerHasClosed peeks: a peer that closed after sending bytes shows only
// the bytes.
func peerHasClosed(fd uintptr) bool { return peek(fd) == peerClosed }
