//go:build unix && !aix

package nomad

import (
	"errors"
	"syscall"
)

// peek looks at the socket fd without taking anything from it.
func peek(fd uintptr) peerState {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EWOULDBLOCK), errors.Is(err, syscall.EINTR):
		return peerOpen
	case err != nil, n == 0:
		return peerClosed
	}
	return peerPending
}
