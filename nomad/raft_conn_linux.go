package nomad

import "golang.org/x/sys/unix"

// tcpEstablished is Linux's TCP_ESTABLISHED (include/net/tcp_states.h).
const tcpEstablished = 1

// peerHasClosed reads the TCP state first: a peer that closed after
// sending bytes (a TLS close alert) leaves the socket in CLOSE_WAIT, which
// a peek does not show behind the bytes.
func peerHasClosed(fd uintptr) bool {
	info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	if err == nil && info.State != tcpEstablished {
		return true
	}
	return peek(fd) == peerClosed
}
