// Package netutil holds small network helpers shared by the server and the
// client agent.
package netutil

import (
	"net"
	"time"
)

// Dialer returns a TCP dialer with the given timeout whose connections
// leave from source when source is a loopback IP, and from whatever the
// kernel picks otherwise.
//
// An agent bound to its own loopback address (127.0.0.N) dials from that
// address, so that every connection between two agents on one machine
// carries both agents' addresses and a packet filter can cut the link
// between any pair of them. Without it every loopback connection leaves
// from 127.0.0.1 and the agents cannot be told apart. Non-loopback sources
// are left to the routing table: a multi-homed host must pick the address
// that reaches the peer.
func Dialer(source string, timeout time.Duration) *net.Dialer {
	d := &net.Dialer{Timeout: timeout}
	if ip := net.ParseIP(source); ip != nil && ip.IsLoopback() {
		d.LocalAddr = &net.TCPAddr{IP: ip}
	}
	return d
}
