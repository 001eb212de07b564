//go:build !unix || aix

package nomad

// socketState cannot look at a socket here: every connection counts as
// open, and a request on one its peer closed fails as it would without
// raftConn.
func socketState(uintptr) peerState { return peerOpen }
